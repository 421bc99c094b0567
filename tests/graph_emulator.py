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
  memory; a result of another shape fails.

So a training step that is static (the same ops on the same storage every ordinary step, nothing read back)
trains the same under it as eagerly, and one that is not fails or drifts.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


class EmulatedGraphs:
    """``sohsm.train.step_graph.CudaGraphs``' stand-in on the CPU: :class:`EmulatedGraph` captured by
    :func:`emulated_capture`, and a model of what torch leaves behind when a capture fails.

    Where the captured code raises, torch's ``torch.cuda.graph`` exits through ``capture_end``, which raises an error
    of its own ("operation failed due to a previous error during capture") before it restores the current stream,
    and leaves the CUDA generator in its capturing mode (the next eager dropout raises "Offset increment outside
    graph capture"). Here too: after such a capture :attr:`stream` stays the capture's and :attr:`generator_capturing`
    stays set, and an eager step (:meth:`side_stream`) raises while they do, until :meth:`after_failure` puts them
    right.

    Args:
        device: the run's device (recorded: :attr:`log` notes whether each capture, replay and eager step ran
            inside :meth:`device_context`).
        skip: given to every graph made (:class:`EmulatedGraph`).
    """

    def __init__(self, device, skip=None) -> None:
        self.device = torch.device(device)
        self.skip = skip
        self.stream = "default"
        self.generator_capturing = False
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
        if self.generator_capturing or self.stream != "default":
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly "
                               f"(a capture left the generator capturing; current stream {self.stream!r})")
        self.note("eager")
        self.stream = stream
        try:
            yield
        finally:
            self.stream = "default"

    def new_graph(self) -> EmulatedGraph:
        return EmulatedGraph(self.skip, self)

    @contextlib.contextmanager
    def capture(self, graph: EmulatedGraph, stream):
        self.note("capture")
        self.stream, self.generator_capturing = "capture", True
        try:
            with emulated_capture(graph):
                yield graph
        except BaseException:
            raise CaptureError("CUDA error: operation failed due to a previous error during capture "
                               "(capture_end)") from None
        self.stream, self.generator_capturing = "default", False

    def synchronize(self) -> None:
        """``torch.cuda.synchronize``'s stand-in: the CPU has nothing to wait for."""

    def rng_state(self):
        return torch.get_rng_state()

    def set_rng_state(self, state) -> None:
        torch.set_rng_state(state)

    def before_capture(self):
        return self.stream

    def after_failure(self, graph, before) -> None:
        self.stream, self.generator_capturing = before, False


def capturing() -> bool:
    """Whether an emulated capture is recording now (a test's code that behaves otherwise while captured)."""
    return _CAPTURING[0] > 0


_CAPTURING = [0]
