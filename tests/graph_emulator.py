"""A CUDA graph's contract, kept on the CPU: what the tests of the captured training step run it under.

A CUDA graph records the kernels a stretch of code launches and replays exactly them, on the same memory,
with the same scalar arguments: whatever the code decided on the host at capture (a Python number, a shape,
a branch on a value read back) is frozen, and reading a value back during a capture fails. :class:`EmulatedGraph`
keeps that contract with torch ops on the CPU:

* :func:`emulated_capture` records every op the code dispatches (through a ``TorchDispatchMode``) with its
  very tensor arguments and outputs, and refuses a read back to the host (``aten::_local_scalar_dense``,
  ``item()``; ``nonzero``, whose output shape is read back) as CUDA refuses it while a stream captures;
* a capture does not change the model: it runs the ops for their shapes, then puts back every tensor that
  existed before it and that an op wrote (and the random state), as a CUDA capture launches nothing; what it
  allocated (the graph's memory) it leaves holding NaN (integers -1): nothing is there until a replay writes it,
  so a replay that leaves an op out, or a tensor made inside a capture and kept for later eager use, shows;
* :meth:`EmulatedGraph.replay` runs the recorded ops again, in order, on the recorded tensors (which hold the
  current values), and copies each fresh result into the recorded output, as a replay writes the graph's
  memory; a result of another shape fails;
* :class:`EmulatedGraphs` keeps torch 2.13's bookkeeping around a capture (the allocator's pools and their use
  counts, the captures under way, what the capture's end does on each kind of failure, a graph's destructor), so
  that the real cleanup of a failed capture (``CudaGraphs.after_failure``) runs against it.

So a training step that is static (the same ops on the same storage every ordinary step, nothing read back)
trains the same under it as eagerly, and one that is not fails or drifts.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sohsm.train.cuda_graphs import CudaGraphs

#: ops that read a value back to the host, refused while capturing (CUDA: "operation not permitted when stream
#: is capturing")
HOST_READS = {"_local_scalar_dense", "nonzero", "item", "equal", "is_nonzero"}


class CaptureError(RuntimeError):
    """A host read while capturing."""


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class EmulatedGraph:
    """The recorded ops of one capture; :meth:`replay` runs them again (see the module docstring).

    Args:
        skip: ``skip(func)`` true for an op the replay leaves out (a test's wrong replay); ``None``: none.
        owner: the :class:`EmulatedGraphs` that made it (its log notes each replay's device context).
    """

    def __init__(self, skip=None, owner=None) -> None:
        self.ops: list = []
        self.replays = 0
        self.skip, self.owner = skip, owner
        #: storages the capture allocated (the graph's memory pool)
        self.made: set[int] = set()

    def replay(self) -> None:
        if self.owner is not None:
            self.owner.note("replay")
        with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():  # kernels (in place: versions move), no autograd
            self._run()
        self.replays += 1

    def _run(self) -> None:
        for func, args, kwargs, outputs in self.ops:
            if self.skip is not None and self.skip(func):
                continue
            results = tree_flatten(func(*args, **kwargs))[0]
            inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for recorded, result in zip(outputs, results):
                if not isinstance(result, torch.Tensor) or _storage(result) in inputs:
                    continue  # in place, out=, or a view: the recorded tensor already shows it
                if recorded.shape != result.shape:
                    raise RuntimeError(f"replayed {func} gave shape {tuple(result.shape)}, captured "
                                       f"{tuple(recorded.shape)}: the step is not static")
                recorded.copy_(result)


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: EmulatedGraph) -> None:
        super().__init__()
        self.graph = graph
        self.made: set[int] = set()  # storages the capture allocated
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # storages written that existed before
        self.fresh: list[torch.Tensor] = []  # the tensors the capture allocated (the graph's memory)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in HOST_READS:
            raise CaptureError(f"operation not permitted when stream is capturing ({func})")
        for argument, value in zip(func._schema.arguments, args):
            self._before_write(argument, value)
        for argument in func._schema.arguments:
            if argument.name in kwargs:
                self._before_write(argument, kwargs[argument.name])
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0]]
        inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in outputs:
            if isinstance(t, torch.Tensor) and _storage(t) not in inputs:
                self.made.add(_storage(t))
                self.fresh.append(t)
        self.graph.ops.append((func, args, kwargs, outputs))
        return out

    def _before_write(self, argument, value) -> None:
        if argument.alias_info is None or not argument.alias_info.is_write:
            return
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor) and _storage(t) not in self.made and _storage(t) not in self.saved:
                base = t._base if t._base is not None else t
                self.saved[_storage(t)] = (base, base.detach().clone())


@contextlib.contextmanager
def emulated_capture(graph: EmulatedGraph):
    """Record what the block dispatches into ``graph``; leave every tensor that existed before as it was."""
    rng = torch.get_rng_state()
    recorder = _Recorder(graph)
    _CAPTURING[0] += 1
    try:
        with recorder:
            yield graph
    finally:
        _CAPTURING[0] -= 1
        with torch.no_grad():
            for base, before in recorder.saved.values():
                base.copy_(before)
            for t in recorder.fresh:  # the graph's memory holds nothing until a replay writes it
                _scramble(t)
        graph.made = set(recorder.made)
        torch.set_rng_state(rng)


def _scramble(t: torch.Tensor) -> None:
    """What memory a capture allocated holds before the first replay: nothing meaningful (NaN, or -1)."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-1)


class EmulatedAllocator:
    """The caching allocator's bookkeeping of capture pools, as torch 2.13 keeps it (``CUDACachingAllocator.cpp``):
    each pool's use count (a capture's begin makes it 1 or adds one; ``releasePool`` takes one off, asserting it
    stays >= 0, and a count of 0 makes the pool freeable), the captures under way (``beginAllocateToPool`` adds one,
    ``endAllocateToPool`` removes it or raises), and ``empty_cache``, which frees the default pool only while no
    capture is under way and asserts that each freeable pool's count is 0.

    An assertion that fails raises, as torch's ``TORCH_INTERNAL_ASSERT`` does; one that fails inside a graph's
    destructor (``~CUDAGraph`` is noexcept: ``std::terminate``, the process aborts) is recorded in :attr:`aborts`.
    """

    def __init__(self) -> None:
        self.pools: dict = {}  # pool id -> use count
        self.underway: list = []  # pools a capture allocates to
        self.freeable: set = set()
        self.aborts: list[str] = []
        self.emptied = self.kept = 0  # empty_cache calls that freed the default pool, and that could not
        self._handles = 0

    def new_handle(self) -> tuple[int, int]:
        """``torch.cuda.graph_pool_handle()``: an id; the pool is made by the capture that first uses it."""
        self._handles += 1
        return (0, self._handles)

    def begin(self, pool) -> None:
        if pool in self.pools:
            assert self.pools[pool] > 0, "use_count > 0 INTERNAL ASSERT FAILED"
            self.pools[pool] += 1
        else:
            self.pools[pool] = 1
        if pool in self.underway:
            raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
        self.underway.append(pool)

    def end(self, pool) -> None:
        if pool not in self.underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.underway.remove(pool)

    def release(self, pool) -> None:
        if pool not in self.pools:
            raise RuntimeError("it != graph_pools.end() INTERNAL ASSERT FAILED (get_private_pool)")
        self.pools[pool] -= 1
        if self.pools[pool] < 0:
            raise RuntimeError("uc >= 0 INTERNAL ASSERT FAILED (releasePool)")
        if self.pools[pool] == 0:
            self.freeable.add(pool)

    def empty_cache(self) -> None:
        """``release_cached_blocks({0, 0})``: the default pool's cache only while no capture is under way; then each
        freeable pool, asserting its use count is 0."""
        if self.underway:
            self.kept += 1
        else:
            self.emptied += 1
        for pool in sorted(self.freeable):
            if self.pools[pool] != 0:
                raise RuntimeError("it->second->use_count == 0 INTERNAL ASSERT FAILED (release_cached_blocks)")
            del self.pools[pool]
        self.freeable.clear()


class _Graph(EmulatedGraph):
    """An :class:`EmulatedGraph` with ``torch.cuda.CUDAGraph``'s bookkeeping: whether its capture ended (then
    :meth:`pool` answers and :meth:`reset` releases the pool once), and its destructor's ``reset``."""

    def __init__(self, skip, owner) -> None:
        super().__init__(skip, owner)
        self.allocator = owner.allocator
        self.mempool = None
        self.capture_ended = False
        self.invalidated = False  # a CUDA error in the capture: its end raises before the allocator leaves the pool

    def capture_begin(self, pool) -> None:
        self.mempool = pool
        self.allocator.begin(pool)

    def capture_end(self) -> None:
        self.owner.capturing_now = False  # cudaStreamEndCapture ends the stream's capture, valid or not
        if self.invalidated:
            raise CaptureError("CUDA error: operation failed due to a previous error during capture (capture_end)")
        self.allocator.end(self.mempool)
        self.capture_ended = True

    def replay(self) -> None:
        if not self.capture_ended:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        super().replay()

    def pool(self):
        if not self.capture_ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self.mempool

    def reset(self) -> None:
        if self.capture_ended:
            self.allocator.release(self.mempool)  # raises before the flag is cleared, as torch's does
            self.capture_ended = False
        self.ops = []

    def __del__(self) -> None:  # ~CUDAGraph: reset() in a noexcept destructor
        try:
            self.reset()
        except Exception as error:  # noqa: BLE001 - std::terminate on CUDA
            self.allocator.aborts.append(str(error))


class EmulatedGraphs(CudaGraphs):
    """``sohsm.train.cuda_graphs.CudaGraphs`` on the CPU: :class:`EmulatedGraph` captured by :func:`emulated_capture`,
    streams as names and the allocator's pools as :class:`EmulatedAllocator` keeps them; ``after_failure`` and
    ``before_capture`` are the real ones, run on these primitives.

    A capture fails as ``torch.cuda.graph`` does in torch 2.13: where the body read a value back (a CUDA error: the
    capture is invalidated), the capture's end raises an error of its own before the allocator leaves the pool and
    before the current stream is restored; where the body raised anything else (a Python-level error), the capture's
    end succeeds (the allocator leaves the pool, the stream is restored) and the body's error goes on. The generator is
    not left capturing (2.13 keeps a capture's offsets apart). An eager step (:meth:`side_stream`) raises while the
    current stream is still the capture's.

    Args:
        device: the run's device (recorded: :attr:`log` notes whether each capture, replay and eager step ran
            inside :meth:`device_context`).
        skip: given to every graph made (:class:`EmulatedGraph`).
        allocator: the process's allocator (default: a new :class:`EmulatedAllocator`).
    """

    def __init__(self, device, skip=None, allocator: EmulatedAllocator | None = None) -> None:
        super().__init__(device)
        self.skip = skip
        self.allocator = allocator or EmulatedAllocator()
        self.stream = "default"
        self.capturing_now = False
        self.inside = 0  # depth of device_context
        self.log: list[tuple[str, bool]] = []

    def note(self, what: str) -> None:
        self.log.append((what, self.inside > 0))

    @contextlib.contextmanager
    def device_context(self):
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1

    def new_stream(self):
        return "side"

    @contextlib.contextmanager
    def side_stream(self, stream):
        if self.stream != "default":
            raise RuntimeError(f"an eager step on stream {self.stream!r}: a failed capture left its stream current")
        self.note("eager")
        self.stream = stream
        try:
            yield
        finally:
            self.stream = "default"

    def new_graph(self) -> EmulatedGraph:
        return _Graph(self.skip, self)

    def new_pool(self):
        return self.allocator.new_handle()

    @contextlib.contextmanager
    def capture(self, graph: _Graph, before):
        self.note("capture")
        self.allocator.empty_cache()  # torch.cuda.graph's enter
        previous, self.stream = self.stream, before.capture_stream
        graph.capture_begin(before.pool)
        self.capturing_now = True
        try:
            with emulated_capture(graph):
                yield graph
        except CaptureError:
            graph.invalidated = True
            graph.capture_end()  # raises its own error; the stream stays the capture's
        except BaseException:
            graph.capture_end()  # succeeds; the body's error goes on
            self.stream = previous
            raise
        graph.capture_end()
        self.stream = previous

    def release(self, graph) -> None:
        graph.reset()

    def synchronize(self) -> None:
        """``torch.cuda.synchronize``'s stand-in: the CPU has nothing to wait for."""

    def rng_state(self):
        return torch.get_rng_state()

    def set_rng_state(self, state) -> None:
        torch.set_rng_state(state)
        _RNN_RESEED[0] = True  # CUDAGeneratorImpl::set_current_seed clears no_reset_rnn_state_

    # the primitives CudaGraphs.after_failure puts things right with
    def current_stream(self):
        return self.stream

    def set_stream(self, stream) -> None:
        self.stream = stream

    @contextlib.contextmanager
    def on_stream(self, stream):
        previous, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = previous

    def capturing(self) -> bool:
        return self.capturing_now

    def end_allocating(self, pool) -> None:
        self.allocator.end(pool)

    def release_pool(self, pool) -> None:
        self.allocator.release(pool)

    def generator_state(self):
        return None  # torch 2.13: a failed capture leaves the generator as it was

    def set_generator_state(self, state) -> None:
        raise AssertionError("no generator state to restore under torch 2.13")


@contextlib.contextmanager
def cudnn_rnn_dropout():
    """Model cuDNN's dropout between a recurrent layer's layers (torch 2.13, ``RNN.cpp`` ``get_dropout_state``): the
    first training forward of an ``nn.RNNBase`` with ``num_layers > 1`` and ``dropout > 0`` after the generator's
    state was set (:meth:`EmulatedGraphs.set_rng_state`; the first ever, too) re-seeds cuDNN's dropout state with a
    seed drawn on the device and read back (``.item()``): refused while capturing."""
    originals = {cls: cls.forward for cls in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)}

    def wrap(original):
        def reseeding(module, *args, **kwargs):
            if module.training and module.num_layers > 1 and module.dropout > 0 and _RNN_RESEED[0]:
                _RNN_RESEED[0] = False
                torch.empty((), dtype=torch.long).random_().item()  # the seed, read back
            return original(module, *args, **kwargs)
        return reseeding

    _RNN_RESEED[0] = True
    try:
        for cls, original in originals.items():
            cls.forward = wrap(original)
        yield
    finally:
        for cls, original in originals.items():
            cls.forward = original


def capturing() -> bool:
    """Whether an emulated capture is recording now (a test's code that behaves otherwise while captured)."""
    return _CAPTURING[0] > 0


_CAPTURING = [0]
_RNN_RESEED = [True]
