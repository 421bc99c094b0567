"""torch's CUDA graphs on one device, behind the few calls :class:`~sohsm.train.step_graph.StepGraph` makes.

Keeping them here lets the CPU tests put an emulation of a graph's contract in their place
(``tests/graph_emulator.py``), and keeps in one place what a capture that failed half-way leaves to put right.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor


class CudaGraphs:
    """torch's CUDA graphs on one device, and what a capture that failed half-way leaves to put right.

    :class:`StepGraph` reaches CUDA only through these methods, so that a test can put an emulation of a graph's
    contract in their place (``tests/graph_emulator.py``, through :data:`GRAPH_API`).
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

    def capture(self, graph, stream):
        """Capture into ``graph`` on ``stream`` (the run's device's; torch's default capture stream is made once, on
        whichever device was current then). ``torch.cuda.graph`` synchronizes and empties the allocator's cache."""
        return torch.cuda.graph(graph, stream=stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def rng_state(self) -> tuple[Tensor, Tensor]:
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: tuple[Tensor, Tensor]) -> None:
        torch.set_rng_state(state[0])
        torch.cuda.set_rng_state(state[1], self.device)

    def _generator(self):
        return torch.cuda.default_generators[self.device.index if self.device.index is not None
                                             else torch.cuda.current_device()]

    def before_capture(self) -> Any:
        """What a failed capture may leave changed: the current stream, and the generator's state (a capture puts it in
        a capturing mode that only the capture's end leaves; its copy, taken here, is not in it)."""
        state = None
        with contextlib.suppress(Exception):  # graph-safe generator states: torch 2.4 on; without, nothing to copy
            state = self._generator().clone_state()
        return torch.cuda.current_stream(self.device), state

    def after_failure(self, graph, before: Any) -> None:
        """Put right what a capture that raised left: a capture still under way ended (the body raised before
        ``torch.cuda.graph``'s exit, or its ``capture_end`` raised after ending the stream's capture but before
        the allocator and the generator left theirs), the allocator's pool of the capture released, the generator
        back on a state that is not capturing, the current stream back (``torch.cuda.graph``'s exit restores it
        only after a ``capture_end`` that succeeds)."""
        stream, state = before
        if torch.cuda.is_current_stream_capturing():
            with contextlib.suppress(Exception):
                graph.capture_end()
        pool = None
        with contextlib.suppress(Exception):
            pool = graph.pool()
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        if pool is not None:  # a capture whose end failed neither ended its pool nor, reset, releases it
            for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
                with contextlib.suppress(Exception):
                    getattr(torch._C, name)(index, pool)
        with contextlib.suppress(Exception):
            graph.reset()
        if state is not None:
            with contextlib.suppress(Exception):
                self._generator().graphsafe_set_state(state)
        torch.cuda.set_stream(stream)
