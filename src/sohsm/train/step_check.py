"""The check of a captured step's replay against an eager step: what a step changes saved and put back, and how far
apart two outcomes of one step are.

A CUDA graph replays what it recorded; a replay that computes finite but wrong numbers (an op left out, a tensor
replaced behind its back, a kernel that behaves otherwise under capture) would go unnoticed by the divergence
watch. :class:`~sohsm.train.step_graph.StepGraph` therefore runs the step once eagerly on the batch, puts back
everything it changed (:func:`take_snapshot`, :func:`restore`), replays the graph on the same batch, and trusts the
graph only if the two agree (:func:`difference` within :data:`CHECK_TOLERANCE`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sohsm.train.step import StepResult, TrainStep

#: how far a replay may stand from the eager step it is checked against (:func:`difference`: the relative
#: difference of the loss, of the gradient norm and of the parameters' update), by the dtype the step computes in.
#: A replay launches the very kernels the eager step launched, on the same data: they differ only where a kernel
#: adds in no fixed order (atomic additions in an embedding's or ``index_add``'s backward), about 1e-6 relative in
#: float32, so 1e-4 leaves a hundredfold margin while a skipped, stale or frozen op moves the step by far more (a
#: skipped update: a difference of 1). In bf16 the products keep 8 bits (4e-3 a value) and such a reordering can
#: move a sum by a few of them: about 1e-3 once summed over a step.
CHECK_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1e-3, torch.float16: 1e-3}


class Snapshot(NamedTuple):
    """What a step changes, saved to be put back: every tensor it writes with a copy (and, for a buffer, its version
    counter), the optimizer's host values, the random state, the head's host bookkeeping, the carried state and the
    divergence watch's host mirror."""

    tensors: list
    optimizer: list
    rng: Any
    head: Any
    carried: Any
    watch_next: int | None


class Reference(NamedTuple):
    """An eager step's outcome, which a replay must reproduce: its loss, gradient norm, the parameters it wrote, and
    what else later steps read (the carried state, the head's step tensors: a self-organized head's waiting ring)."""

    loss_sum: Tensor
    grad_norm: Tensor | None
    params: list
    kept: list


def take_snapshot(train_step: TrainStep, task: Any, graphs: Any) -> Snapshot:
    """Everything a step changes (parameters, gradients, optimizer state, buffers, the head's step tensors, the
    watch's record and counter, the carried state), copied; and the host values that go with it."""
    pairs, seen = [], set()

    def keep(t, version: bool = False) -> None:
        if isinstance(t, Tensor) and id(t) not in seen:
            seen.add(id(t))
            pairs.append((t, t.detach().clone(), t._version if version else None))

    for p in train_step.params:
        keep(p)
        keep(p.grad)
    optimizer = []
    for state in train_step.optimizer.state.values():
        for value in state.values():
            keep(value)
        optimizer.append((state, {k: v for k, v in state.items() if not isinstance(v, Tensor)}))
    for buffer in train_step.forward.buffers():
        keep(buffer, version=True)
    for t in train_step.head.step_tensors():
        keep(t)
    watch = train_step.watch
    if watch is not None:
        keep(watch.record)
        keep(watch.step)
    carried = task.carried_state()
    for t in carried or ():
        keep(t)
    return Snapshot(pairs, optimizer, graphs.rng_state(), train_step.head.host_state(), carried,
                    None if watch is None else watch._next)


@torch.no_grad()
def restore(snapshot: Snapshot, train_step: TrainStep, task: Any, graphs: Any) -> None:
    """Put back what :func:`take_snapshot` saved, into the same storage (what a captured graph reads). A buffer only
    where its version counter moved (one not written keeps its version, as a head's check of its assignment wants);
    the rest always (torch's fused optimizer steps write without moving the counters)."""
    for t, saved, version in snapshot.tensors:
        if version is None or t._version != version:
            t.copy_(saved)
    for state, values in snapshot.optimizer:
        state.update(values)
    graphs.set_rng_state(snapshot.rng)
    train_step.head.restore_host_state(snapshot.head)
    task.set_carried_state(snapshot.carried)
    if snapshot.watch_next is not None:
        assert train_step.watch is not None  # the snapshot took the counter of this watch
        train_step.watch._next = snapshot.watch_next


def reference_of(result: StepResult, params: list, kept: list | None = None) -> Reference:
    """An eager step's :class:`Reference`: its loss, gradient norm, ``params`` and ``kept`` as it left them, copied."""
    return Reference(result.loss_sum.detach().clone(),
                     None if result.grad_norm is None else result.grad_norm.detach().clone(),
                     [p.detach().clone() for p in params], [t.detach().clone() for t in kept or ()])


def _apart(replayed: Tensor, eager: Tensor) -> Tensor:
    """How far a tensor a replay wrote stands from the eager step's: the relative L2 distance of floating ones (equal
    values, NaN for NaN too, count 0; NaN against a number infinitely far), 0 or infinity for the rest (indices)."""
    a, b = replayed.detach(), eager.detach().to(replayed.device)
    if not a.is_floating_point():
        return torch.where((a != b).any(), math.inf, 0.0).double()
    a, b = a.double(), b.double()
    diff = torch.where((a == b) | (a.isnan() & b.isnan()), torch.zeros_like(a), a - b).nan_to_num(nan=math.inf)
    far = diff.pow(2).sum().sqrt() / b.nan_to_num(nan=0.0).pow(2).sum().sqrt().clamp_min(1e-30)
    return torch.where(diff.abs().sum() == 0, torch.zeros_like(far), far).nan_to_num(nan=math.inf)


def difference(reference: Reference, result: StepResult, params: list, snapshot: Snapshot,
               kept: list | None = None) -> float:
    """The largest relative difference between a replay (``result``, ``params`` and ``kept`` as it left them) and its
    eager step: of the loss, of the gradient norm, of the parameters' update (``|replayed - eager| / |eager's
    update|`` over all of them) and of each kept tensor (:func:`_apart`). Equal values (NaN for NaN too) differ by 0;
    NaN against a number counts as infinitely far. One read back."""

    def relative(a: Tensor, b: Tensor) -> Tensor:
        a, b = a.detach().double().reshape(()), b.detach().double().reshape(()).to(a.device)
        same = (a == b) | (a.isnan() & b.isnan())
        far = ((a - b).abs() / b.abs().clamp_min(1e-30)).nan_to_num(nan=math.inf)
        return torch.where(same, torch.zeros_like(far), far)

    terms = [relative(result.loss_sum, reference.loss_sum)]
    if result.grad_norm is not None and reference.grad_norm is not None:
        terms.append(relative(result.grad_norm, reference.grad_norm))
    before = {id(t): saved for t, saved, _ in snapshot.tensors}
    device = terms[0].device
    apart = torch.zeros((), dtype=torch.float64, device=device)
    update = torch.zeros((), dtype=torch.float64, device=device)
    for p, eager in zip(params, reference.params):
        apart += (p.detach().double() - eager.double()).pow(2).sum().to(device)
        update += (eager.double() - before[id(p)].double()).pow(2).sum().to(device)
    far = (apart.sqrt() / update.sqrt().clamp_min(1e-30)).nan_to_num(nan=math.inf)
    terms.append(torch.where(apart == 0, torch.zeros_like(far), far))
    terms.extend(_apart(t, eager).reshape(()) for t, eager in zip(kept or (), reference.kept))
    return float(torch.stack([t.to(device) for t in terms]).max())
