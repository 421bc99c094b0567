"""The whole training step as one CUDA graph: captured once, replayed every ordinary step.

A small model's step on a GPU is bound by the ops the host issues (tens of microseconds each, whatever
their size; ``benchmarks/step_ops.py``). A CUDA graph issues them all in one launch. :class:`StepGraph`
runs a :class:`~sohsm.train.step.TrainStep` in its static form (gradients kept, a self-organized head's
waiting statistics in a fixed ring, the divergence flag, the step count and the rate on the device: every
ordinary step issues the same ops on the same storage) and::

    eager warm-up steps (the allocator, Triton's autotuning)   ->  capture: model forward, head, backward,
    clipping and the optimizer step as one graph                ->  replay it, step after step

A step runs eagerly instead where a replay would be wrong or the graph does not fit: the first steps after
anything the graph reads was replaced (a loaded checkpoint, a gradient set to ``None``), a batch of another
shape (an epoch's short last batch), the first window of an epoch (no carried state yet). A re-clustering of a
static step writes the new layout into the tensors the graph reads, so one capture serves a run.
Re-clusterings, the fold of the waiting statistics, evaluation and checkpoints run outside the graph, after the
step, as they do eagerly: the optimizer's post-step hooks are called after each replay, and the head redoes the
host-side part of its forward (:meth:`~sohsm.heads.Head.replayed`).

The graph proves itself before it is trusted: a capture's first replay, and the first replay after each
re-clustering, is checked against an eager step on the same batch (:mod:`sohsm.train.step_check`; one extra step
each). A replay that differs, or a capture that fails, gives the graph up: what the step changed is put back, the
static form undone (adaptive softmax's ordinary step, autocast's weight cache, the rates as numbers), the step
taken eagerly, as every later one, with one warning naming the measured difference or the first cause.
``step_graph`` of a run's config: ``"auto"`` (on where CUDA is and the head and optimizer allow it, and the head's
static form is worth it: :meth:`~sohsm.heads.Head.static_decline`), ``"on"`` (refused, before anything is
written, where they do not), ``"off"``.
"""
from __future__ import annotations

import collections
import warnings
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from sohsm.heads import Head
from sohsm.train.config import STEP_GRAPH_CHOICES
from sohsm.train.cuda_graphs import CudaGraphs
from sohsm.train.device_adagrad import DeviceAdagrad
from sohsm.train.step import StepResult, TrainStep
from sohsm.train.step_check import (
    CHECK_TOLERANCE,
    Reference,
    Snapshot,
    difference as check_difference,
    reference_of,
    restore,
    take_snapshot,
)

#: eager steps with unchanged tensors before the first capture (the allocator settles, Triton's kernels are tuned)
WARMUP_STEPS = 3
#: eager steps with unchanged tensors before a later capture (after a re-clustering: its first step allocates anew)
RECAPTURE_WARMUP_STEPS = 1


def optimizer_refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer``'s step cannot be captured (``None``: it can): torch's fused steps (Adam, AdamW, SGD, and
    Adagrad where torch fuses it on CUDA, as 2.13 does) and :class:`~sohsm.train.device_adagrad.DeviceAdagrad` read
    nothing back and take the rate as a device tensor."""
    if isinstance(optimizer, DeviceAdagrad) or all(group.get("fused") for group in optimizer.param_groups):
        return None
    return (f"the {type(optimizer).__name__} step is not fused and reads its step counts on the host "
            "(a fused Adam, AdamW or SGD step, or Adagrad, can be captured)")


def device_refusal(device: torch.device) -> str | None:
    """Why ``device`` cannot replay a CUDA graph (``None``: it can)."""
    if device.type != "cuda":
        return f"a CUDA graph needs a CUDA device, and the run's device is {device}"
    return None


def model_refusal(model: torch.nn.Module | None) -> str | None:
    """Why ``model``'s step cannot be captured (``None``: it can): a recurrent layer with dropout between its layers
    (cuDNN's own dropout state, re-drawn with a value read back to the host after every restore of the random state:
    the check's restore comes right before the capture, so the read lands inside it; torch 2.13, ``RNN.cpp``
    ``get_dropout_state``)."""
    for module in () if model is None else model.modules():
        if isinstance(module, torch.nn.RNNBase) and module.num_layers > 1 and module.dropout > 0:
            return (f"cuDNN re-seeds the dropout between the {module.num_layers} {module.mode} layers with a value "
                    "read back after each restore of the random state (--layers 1, or --dropout 0, can be captured)")
    return None


def graph_refusal(device: torch.device, head: Head, *, world: int = 1, amp: str | None = None,
                  compile: bool = False, optimizer: torch.optim.Optimizer | None = None,
                  model: torch.nn.Module | None = None) -> str | None:
    """Why a run's training step cannot be captured as one CUDA graph (``None``: it can), in one clause."""
    device = torch.device(device)
    reason = device_refusal(device)
    if reason is not None:
        return reason
    if world > 1:
        return "a run of several processes all-reduces its gradients between the steps' ops"
    if amp == "fp16":
        return "fp16's loss scaler reads its overflow flag back every step (bf16 does not)"
    if compile:
        return "torch.compile captures graphs of its own (mode='reduce-overhead')"
    if head.sparse:
        return "the head hands out row-sparse gradients, whose shapes change from step to step"
    reason = model_refusal(model) or head.graph_refusal(device, torch.bfloat16 if amp == "bf16" else None)
    if reason is None and optimizer is not None:
        reason = optimizer_refusal(optimizer)
    return reason


def resolve_step_graph(setting: str, refusal: str | None) -> bool:
    """Whether a run captures its step: ``"off"`` never, ``"auto"`` where nothing refuses, ``"on"`` or an error.

    Raises:
        ValueError: ``"on"`` where ``refusal`` says why not (one line).
    """
    if setting not in STEP_GRAPH_CHOICES:
        raise ValueError(f"step_graph must be one of {', '.join(STEP_GRAPH_CHOICES)}, got {setting!r}")
    if setting == "on" and refusal is not None:
        raise ValueError(f"step_graph 'on' cannot capture this run's step: {refusal}")
    return setting != "off" and refusal is None


def step_graph_refusal(config: Any, head: Head, optimizer: torch.optim.Optimizer, ranks: Any,
                       device: torch.device, rows: int | None = None,
                       model: torch.nn.Module | None = None) -> str | None:
    """Why a run (its config's ``step_graph``, ``amp``, ``compile``) cannot capture its step (``None``: it can, or
    it does not ask to); with ``"auto"`` also why it would rather not for a step of ``rows`` rows
    (:meth:`~sohsm.heads.Head.static_decline`).

    Raises:
        ValueError: ``step_graph`` is ``"on"`` and the step cannot be captured (one line saying why).
    """
    setting = getattr(config, "step_graph", "off")
    refusal = graph_refusal(device, head, world=ranks.world, amp=getattr(config, "amp", None),
                            compile=getattr(config, "compile", False), optimizer=optimizer, model=model)
    resolve_step_graph(setting, refusal)
    if refusal is None and setting == "auto":  # could be captured, but its static form costs more than it saves
        refusal = head.static_decline(rows)
    return refusal


def device_rates(optimizer: torch.optim.Optimizer) -> None:
    """Keep each group's rate as a 0-dim float32 tensor on the parameters' device, so that a replayed step reads
    the rate the loop last wrote into it (``set_rate`` writes in place), not the rate of its capture."""
    for group in optimizer.param_groups:
        device = group["params"][0].device
        lr = group["lr"]
        if not isinstance(lr, Tensor) or lr.device != device:
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)


def host_rates(optimizer: torch.optim.Optimizer, rate: float | None = None) -> None:
    """Undo :func:`device_rates` (a checkpoint of a graphed run resumed without a graph, a graph given up): each
    group's rate a Python number again, ``rate`` where the loop's own number is known (a float32 tensor rounds it)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            group["lr"] = float(group["lr"]) if rate is None else rate




#: what :class:`StepGraph` captures with: a class taking the run's device (:class:`CudaGraphs`); ``None``: torch's
#: CUDA graphs (tests put an emulation that runs on the CPU here)
GRAPH_API = None

class _Captured:
    """One captured step: the graph, its fixed inputs and outputs, and the key it is valid for."""

    def __init__(self, key, graph, batch, spec, state_in, state_out, result) -> None:
        self.key, self.graph, self.batch, self.spec = key, graph, batch, spec
        self.state_in, self.state_out, self.result = state_in, state_out, result


class StepGraph:
    """A :class:`~sohsm.train.step.TrainStep` whose ordinary steps replay one captured CUDA graph (module docstring).

    Args:
        train_step: the run's step; made static here.
        task: the run's task (its carried state goes through fixed buffers).
        warmup: eager steps with unchanged tensors before a capture (default :data:`WARMUP_STEPS`).
        graphs: what captures and replays (default: :data:`GRAPH_API`, else :class:`CudaGraphs` of the run's device).

    Attributes:
        captures, replays, eager_steps: how the session's steps ran.
        checks: replays checked against an eager step (each capture's first, and the first after each re-clustering
            written in place; :mod:`sohsm.train.step_check`); ``difference``: the largest relative difference such a
            check measured.
        failed: why the graph was given up (the session then runs eagerly, its step no longer static), or ``None``.
    """

    def __init__(self, train_step: TrainStep, task: Any, *, warmup: int | None = None, graphs: Any = None) -> None:
        self.train_step, self.task = train_step, task
        self.optimizer, self.head = train_step.optimizer, train_step.head
        self.warmup = WARMUP_STEPS if warmup is None else warmup
        self.graphs = graphs if graphs is not None else (GRAPH_API or CudaGraphs)(train_step.ranks.device)
        with self.graphs.device_context():
            self.stream = self.graphs.new_stream()
        train_step.set_static(True)
        device_rates(self.optimizer)
        compute = torch.bfloat16 if train_step.precision.amp == "bf16" else train_step.params[0].dtype
        #: how far a checked replay may stand from its eager step (:data:`CHECK_TOLERANCE`)
        self.tolerance = CHECK_TOLERANCE.get(compute, 1e-3)
        self.captured: _Captured | None = None
        self.failed: str | None = None
        self.captures = self.replays = self.eager_steps = self.checks = 0
        self.difference = 0.0
        self._key_seen: tuple | None = None
        self._steps_with_key = 0
        self._rewrites_checked = self.head.static_rewrites()
        self._rate: float | None = None

    def set_rate(self, rate: float) -> None:
        """The loop's rate for the coming steps: written into the device tensors a replay reads (one fill each, no
        read), or the groups' numbers once the graph was given up."""
        self._rate = rate
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate

    # -- the step ---------------------------------------------------------------------------------
    def __call__(self, batch: Any, step: int) -> StepResult:
        """Train on ``batch`` as step ``step``: by a replay, a capture and its checked first replay, or eagerly."""
        with self.graphs.device_context():
            return self._step(batch, step)

    def _step(self, batch: Any, step: int) -> StepResult:
        key = self._key(batch)
        if self.failed is None and key is not None:
            if self.captured is not None and self.captured.key == key:
                if self.head.static_rewrites() != self._rewrites_checked:  # a re-clustering rewrote the layout
                    return self._checked_replay(batch, step)
                return self._replay(batch, step)
            if key != self._key_seen:
                self._key_seen, self._steps_with_key = key, 0
            warmup = self.warmup if not self.captures else min(self.warmup, RECAPTURE_WARMUP_STEPS)
            if self._steps_with_key >= warmup:
                return self._capture(batch, step, key)
        return self._eager(batch, step)

    def _eager(self, batch: Any, step: int) -> StepResult:
        self.eager_steps += 1
        with self.graphs.side_stream(self.stream):
            result = self.train_step(batch, step)
        self._steps_with_key += 1
        return result

    def release(self) -> None:
        """Drop the captured graph and release its memory pool (at the end of a session, and before a new capture or
        a fallback), rather than when the garbage collector gets to it."""
        captured, self.captured = self.captured, None
        if captured is not None:
            self.graphs.release(captured.graph)

    # -- what a graph is valid for ------------------------------------------------------------------
    def _key(self, batch: Any) -> tuple | None:
        """What must equal the capture's for a replay to be right; ``None``: the step cannot be captured (a batch
        that is not tensors, or gradients not allocated). An epoch's first window (no carried state) has a key of
        its own."""
        leaves, spec = tree_flatten(batch)
        if not leaves or not all(isinstance(t, Tensor) for t in leaves):
            return None
        state = self.task.carried_state()  # None at an epoch's start where one is carried: another key
        params = tuple((p.data_ptr(), p.grad.data_ptr() if p.grad is not None else None)
                       for p in self.train_step.params)
        if any(grad is None for _, grad in params):
            return None  # gradients not (or no longer) allocated: the next eager step allocates them
        optimizer_state = tuple(t.data_ptr() for s in self.optimizer.state.values() for t in s.values()
                                if isinstance(t, Tensor))
        rates = tuple(g["lr"].data_ptr() if isinstance(g["lr"], Tensor) else g["lr"]
                      for g in self.optimizer.param_groups)
        buffers = tuple(b.data_ptr() for b in self.train_step.forward.buffers())  # the model's and the head's
        return (spec, tuple((t.shape, t.dtype, t.device) for t in leaves),
                None if state is None else tuple((s.shape, s.dtype) for s in state),
                params, optimizer_state, rates, buffers, self.head.static_fingerprint())

    # -- capture and replay -------------------------------------------------------------------------
    def _capture(self, batch: Any, step: int, key: tuple) -> StepResult:
        """Check, capture, replay: an eager step on the batch (its outcome kept), everything it changed put back, the
        capture, its replay on the same batch, the two compared (:func:`~sohsm.train.step_check.difference`); the
        graph is kept only if they agree, else given up (:meth:`_give_up`) and the step taken eagerly."""
        leaves, spec = tree_flatten(batch)
        static_batch = [t.clone() for t in leaves]
        state = self.task.carried_state()
        state_in = None if state is None else tuple(s.clone() for s in state)
        self.task.set_carried_state(state_in)
        watch = self.train_step.watch
        if watch is not None:
            watch.at_step(step)  # outside the capture: a fill there would be replayed every step
        snapshot = take_snapshot(self.train_step, self.task, self.graphs)
        reference = self._reference(static_batch, spec, step)
        restore(snapshot, self.train_step, self.task, self.graphs)
        hooks = self.optimizer._optimizer_step_post_hooks
        self.release()
        graph = self.graphs.new_graph()
        self.graphs.synchronize()
        before = self.graphs.before_capture(self.stream)
        # torch's Adam and AdamW refuse a capture unless their groups say capturable (their fused step is the same)
        capturable = [(g, g["capturable"]) for g in self.optimizer.param_groups if "capturable" in g]
        first: list[BaseException] = []  # the body's error: the capture's end then raises one of its own
        try:
            self.optimizer._optimizer_step_post_hooks = collections.OrderedDict()  # run after each replay instead
            for group, _ in capturable:
                group["capturable"] = True
            try:
                with self.graphs.capture(graph, before):
                    try:
                        result = self.train_step(tree_unflatten(static_batch, spec), step)
                    except BaseException as error:
                        first.append(error)
                        raise
            finally:
                self.optimizer._optimizer_step_post_hooks = hooks
                for group, flag in capturable:
                    group["capturable"] = flag
        except Exception as error:  # noqa: BLE001 - any failure of a capture means: train eagerly
            self.graphs.after_failure(graph, before)
            cause = first[0] if first else error
            why = f"{type(cause).__name__}: {cause}".splitlines()[0]
            return self._give_up(f"the training step could not be captured as a CUDA graph ({why})", snapshot,
                                 batch, step)
        self.captures += 1
        self.captured = _Captured(key, graph, static_batch, spec, state_in, self.task.carried_state(), result)
        # the capture ran the step's host side once (the head's bookkeeping, the watch's mirror): its replay does not
        graph.replay()
        mismatch = self._check(reference, result, snapshot)
        if mismatch is not None:
            return self._give_up(mismatch, snapshot, batch, step)
        self._after_replay(step)
        return result

    def _load_inputs(self, batch: Any, step: int) -> None:
        """The batch and the carried state into the graph's fixed buffers; the watch's counter to the step."""
        captured = self.captured
        assert captured is not None  # replays follow a capture
        for static, value in zip(captured.batch, tree_flatten(batch)[0]):
            static.copy_(value)
        state = self.task.carried_state()
        if captured.state_in is not None:
            for static, value in zip(captured.state_in, state):
                if static is not value:
                    static.copy_(value)
            self.task.set_carried_state(captured.state_in)
        watch = self.train_step.watch
        if watch is not None:
            watch.at_step(step)

    def _replay(self, batch: Any, step: int) -> StepResult:
        assert self.captured is not None  # replays follow a capture
        self._load_inputs(batch, step)
        self.captured.graph.replay()
        return self._replayed(step)

    def _checked_replay(self, batch: Any, step: int) -> StepResult:
        """A replay checked against an eager step, as at a capture: the first after a re-clustering rewrote what the
        graph reads in place (one more eager step per re-clustering)."""
        captured = self.captured
        assert captured is not None  # replays follow a capture
        self._load_inputs(batch, step)
        snapshot = take_snapshot(self.train_step, self.task, self.graphs)
        reference = self._reference(captured.batch, captured.spec, step)
        restore(snapshot, self.train_step, self.task, self.graphs)
        captured.graph.replay()
        self._rewrites_checked = self.head.static_rewrites()
        mismatch = self._check(reference, captured.result, snapshot)
        if mismatch is not None:
            return self._give_up(mismatch, snapshot, batch, step)
        return self._replayed(step)

    def _replayed(self, step: int) -> StepResult:
        """The host side of a replayed step: the watch's mirror, the head's bookkeeping, the eager tail."""
        captured = self.captured
        assert captured is not None  # replays follow a capture
        self.replays += 1
        watch = self.train_step.watch
        if watch is not None:
            watch.replayed(step)
        self.head.replayed(int(captured.result.tokens // max(self.train_step.ranks.world, 1)))
        self._after_replay(step)
        return captured.result

    def _after_replay(self, step: int) -> None:
        """What the step's eager tail does: the carried state moves on, the optimizer's post-step hooks run."""
        assert self.captured is not None  # after a capture or a replay of it
        self.task.set_carried_state(self.captured.state_out)
        for hook in list(self.optimizer._optimizer_step_post_hooks.values()):
            hook(self.optimizer, (), {})

    # -- the check of a replay against an eager step -----------------------------------------------
    def _reference(self, batch: list, spec: Any, step: int) -> Reference:
        """The step run eagerly on ``batch`` (its static form, the optimizer's post-step hooks held back): its loss,
        gradient norm and the parameters it wrote, copied."""
        hooks = self.optimizer._optimizer_step_post_hooks
        self.optimizer._optimizer_step_post_hooks = collections.OrderedDict()
        try:
            with self.graphs.side_stream(self.stream):
                result = self.train_step(tree_unflatten(batch, spec), step)
                return reference_of(result, self.train_step.params, self._kept(self.task.carried_state()))
        finally:
            self.optimizer._optimizer_step_post_hooks = hooks

    def _kept(self, state: Any) -> list:
        """What a step writes for later steps besides the weights: the carried state, the head's step tensors."""
        return [*(state or ()), *self.head.step_tensors()]

    def _check(self, reference: Reference, result: StepResult, snapshot: Snapshot) -> str | None:
        """``None`` where the replay agrees with its eager step (within :attr:`tolerance`,
        :data:`~sohsm.train.step_check.CHECK_TOLERANCE`: the loss, the gradient norm, the weights, the carried state
        and the head's step tensors), else why not."""
        assert self.captured is not None  # a capture or a replay is checked
        kept = self._kept(self.captured.state_out)
        difference = check_difference(reference, result, self.train_step.params, snapshot, kept)
        self.checks += 1
        self.difference = max(self.difference, difference)
        if difference <= self.tolerance:
            return None
        return (f"the captured training step's replay differs from the eager step by {difference:.3g} (relative; "
                f"at most {self.tolerance:g} expected)")

    def _give_up(self, why: str, snapshot: Snapshot, batch: Any, step: int) -> StepResult:
        """Drop the graph, put back what the step changed, leave the static form (adaptive softmax's ordinary step,
        autocast's weight cache, the rates as numbers) and take the step eagerly, as every later one; warn once."""
        self.release()
        self.failed = why
        warnings.warn(f"{why}; the run goes on with eager steps", RuntimeWarning, stacklevel=3)
        restore(snapshot, self.train_step, self.task, self.graphs)
        self.train_step.set_static(False)
        host_rates(self.optimizer, self._rate)
        return self._eager(batch, step)
