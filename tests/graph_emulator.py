"""A CUDA graph's contract, kept on the CPU: what the tests of the captured training step run it under.

A CUDA graph records the kernels a stretch of code launches and replays exactly them, on the same memory,
with the same scalar arguments: whatever the code decided on the host at capture (a Python number, a shape,
a branch on a value read back) is frozen, and reading a value back during a capture fails. :class:`EmulatedGraph`
keeps that contract with torch ops on the CPU:

* :func:`emulated_capture` records every op the code dispatches (through a ``TorchDispatchMode``) with its
  very tensor arguments and outputs, and refuses a read back to the host (``aten::_local_scalar_dense``,
  ``item()``; ``nonzero``, whose output shape is read back) as CUDA refuses it while a stream captures;
* a capture does not change the model: it runs the ops for their shapes, then puts back every tensor that
  existed before it and that an op wrote (and the random state), as a CUDA capture launches nothing;
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
    """The recorded ops of one capture; :meth:`replay` runs them again (see the module docstring)."""

    def __init__(self) -> None:
        self.ops: list = []
        self.replays = 0

    def replay(self) -> None:
        with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():  # kernels (in place: versions move), no autograd
            self._run()
        self.replays += 1

    def _run(self) -> None:
        for func, args, kwargs, outputs in self.ops:
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
    try:
        with recorder:
            yield graph
    finally:
        with torch.no_grad():
            for base, before in recorder.saved.values():
                base.copy_(before)
        torch.set_rng_state(rng)


def no_sync() -> None:
    """``torch.cuda.synchronize``'s stand-in: the CPU has nothing to wait for."""
