"""torch's CUDA graphs on one device, behind the few calls :class:`~sohsm.train.step_graph.StepGraph` makes.

Keeping them here lets the CPU tests put an emulation of a graph's contract in their place
(``tests/graph_emulator.py``), and keeps in one place what a capture that failed half-way leaves to put right.

A capture allocates from a pool of the caching allocator that it holds once (its use count) while the graph lives.
How a capture fails decides what is left to put right (torch 2.13, ``CUDAGraph.cpp``):

* the body raised a Python-level error (an exception of its own, an op's argument check, an out-of-memory error, a
  Triton compile error): the capture's end **succeeds** (the allocator leaves the pool, the graph is instantiated)
  and the error goes on; the graph's ``reset()`` releases the pool once, and nothing more may (a second release
  fails the allocator's use-count check, and the third, in the graph's destructor, aborts the process);
* a CUDA error invalidated the capture (a value read back to the host): the capture's end raises **before** the
  allocator leaves the pool, and ``reset()`` releases nothing; unless ended and released by hand, the allocator stays
  "capturing" for the rest of the process (the pool never freed, ``empty_cache()`` a no-op).

So the pool is made explicitly (``torch.cuda.graph_pool_handle()``), and released by hand only where the capture
did not end (:meth:`CudaGraphs.after_failure`). Where torch's pinned-host allocator also records the capture (newer
sources do), torch offers no Python call to end that record: it stays, costing a check per pinned allocation.
"""
from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import torch
from torch import Tensor


class Before(NamedTuple):
    """What a capture starts from: the current stream, the generator's state (torch before 2.13 could leave it
    capturing), the stream it captures on and the allocator pool it allocates from."""

    stream: Any
    generator: Any
    capture_stream: Any
    pool: Any


class CudaGraphs:
    """torch's CUDA graphs on one device, and what a capture that failed half-way leaves to put right.

    :class:`StepGraph` reaches CUDA only through these methods, so that a test can put an emulation of a graph's
    contract in their place (``tests/graph_emulator.py``, through :data:`GRAPH_API`): it replaces the primitives
    (streams, the allocator's pool calls) and keeps :meth:`after_failure`'s logic.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def device_context(self):
        """Everything a step issues goes to the run's device (``--device cuda:1``), whatever the current one."""
        return torch.cuda.device(self.device)

    def new_stream(self):
        """The side stream of the warm-up, the capture and the eager steps (torch's "whole network capture")."""
        return torch.cuda.Stream(self.device)

    @contextlib.contextmanager
    def side_stream(self, stream):
        """Run the block on ``stream``, ordered both ways against the current one."""
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    def new_graph(self):
        return torch.cuda.CUDAGraph()

    def new_pool(self):
        """A pool handle of the caching allocator for one capture: known to the caller even where the capture's end
        fails (``graph.pool()`` then raises)."""
        return torch.cuda.graph_pool_handle()

    def capture(self, graph, before: Before):
        """Capture into ``graph`` on ``before.capture_stream`` from ``before.pool`` (the run's device's stream; torch's
        default capture stream is made once, on whichever device was current then). ``torch.cuda.graph``
        synchronizes and empties the allocator's cache."""
        return torch.cuda.graph(graph, pool=before.pool, stream=before.capture_stream)

    def release(self, graph) -> None:
        """Drop a captured graph's executable and release its pool once (its memory is freed at the next
        ``empty_cache``, as the tensors in it go)."""
        graph.reset()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def rng_state(self) -> tuple[Tensor, Tensor]:
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: tuple[Tensor, Tensor]) -> None:
        torch.set_rng_state(state[0])
        torch.cuda.set_rng_state(state[1], self.device)

    # -- the primitives after_failure puts things right with (an emulation replaces these) --------------------
    def _index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def set_stream(self, stream) -> None:
        torch.cuda.set_stream(stream)

    @contextlib.contextmanager
    def on_stream(self, stream):
        with torch.cuda.stream(stream):
            yield

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def end_allocating(self, pool) -> None:
        """The allocator stops allocating to ``pool`` for a capture (raises where it was not)."""
        torch._C._cuda_endAllocateToPool(self._index(), pool)

    def release_pool(self, pool) -> None:
        """The capture's hold on ``pool`` dropped (its use count down by one)."""
        torch._C._cuda_releasePool(self._index(), pool)

    def generator_state(self) -> Any:
        """A copy of the CUDA generator's state (graph-safe states: torch 2.4 on; ``None`` without)."""
        with contextlib.suppress(Exception):
            return torch.cuda.default_generators[self._index()].clone_state()
        return None

    def set_generator_state(self, state: Any) -> None:
        torch.cuda.default_generators[self._index()].graphsafe_set_state(state)

    # -- a capture's start and what its failure leaves ----------------------------------------------------------
    def before_capture(self, capture_stream) -> Before:
        """What a failed capture may leave changed (the current stream, the generator's state), the stream the capture
        runs on and a new pool for it."""
        return Before(self.current_stream(), self.generator_state(), capture_stream, self.new_pool())

    def after_failure(self, graph, before: Before) -> None:
        """Put right what a capture that raised left (module docstring): a capture still under way ended (its body
        changed the current stream, so the capture's end failed its stream check); the pool released by hand only
        where the capture did not end (``graph.pool()`` raises: the allocator still allocates to it and ``reset()``
        will not release it), else left to ``reset()`` alone; the generator back on its state (torch before 2.13
        left it capturing); the current stream back (``torch.cuda.graph``'s exit restores it only after a capture's
        end that succeeds). Nothing here raises: a cleanup that fails costs the cleanup, not the run."""
        with contextlib.suppress(Exception), self.on_stream(before.capture_stream):
            if self.capturing():
                graph.capture_end()
        ended = False
        with contextlib.suppress(Exception):
            graph.pool()
            ended = True
        if not ended:
            left = False
            with contextlib.suppress(Exception):
                self.end_allocating(before.pool)
                left = True
            if left:  # only a pool the allocator was allocating to for this capture holds its use
                with contextlib.suppress(Exception):
                    self.release_pool(before.pool)
        with contextlib.suppress(Exception):
            graph.reset()
        if before.generator is not None:
            with contextlib.suppress(Exception):
                self.set_generator_state(before.generator)
        self.set_stream(before.stream)
