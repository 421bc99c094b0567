"""One training step of any task: forward (DDP, autocast, compile), backward, clip, check, update.

::

    loss = ddp(Forward(task, model, head))(batch)     # autocast inside; DDP averages the gradients
    precision.backward(loss); precision.unscale_(optimizer)
    loss_sum = all-reduce(loss x tokens)              # for the records and the check
    norm = gradient norm                              # the same on every rank
    bad = watch.note(loss_sum, norm)                  # one finiteness check, on the device
    optimizer.step(grad_scale=clip factor, found_inf=bad)   # a fused step clips and skips inside its kernel;
                                                      # another is clipped and zeroed before it

A bad step changes nothing, on every rank. In its static form (:meth:`TrainStep.set_static`) every ordinary step
issues the same ops on the same storage, which :mod:`sohsm.train.step_graph` captures as one CUDA graph.

With one process the collective is skipped and nothing else changes. Nothing in a
step reads a value back to the host (on a GPU each read is a synchronisation): the
divergence flag stays on the device until the loop's next log line, evaluation or
checkpoint (:class:`~sohsm.train.guard.DivergenceWatch`), and the head skips its
per-call target check (a task's targets are vocabulary ids, in range by
construction). Two cases still read one flag a step: fp16, whose loss scaler reads
its overflow flag anyway, and heads with row-sparse weight gradients (``sparse=True``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from sohsm.heads import Head
from sohsm.train.builders import unique_parameters
from sohsm.train.distributed import Ranks
from sohsm.train.guard import DivergenceError, DivergenceWatch, check_step, clip_gradients, clip_scale, gradient_norm
from sohsm.train.precision import MIN_SCALE, Precision
from sohsm.train.task import Task


class Forward(nn.Module):
    """The model and the head as one module: what DDP wraps, so the head runs inside DDP's forward.

    A head that keeps statistics finds its process group there (the self-organized
    head's ``set_process_group("auto")``). With ``compile`` the model and the head
    are called through :func:`torch.compile` (the head without its target check,
    as in eager steps); their parameters and ``state_dict`` stay
    those of the eager modules.
    """

    # kept in the instance's __dict__, outside the module tree (see __init__)
    _calls: tuple[nn.Module, Callable[..., Any]]  # torch.compile of a module is a module
    _task: Task
    _precision: Precision

    def __init__(self, task: Task, model: nn.Module, head: Head, precision: Precision, compile: bool = False):
        super().__init__()
        self.model, self.head = model, head
        # a task's targets are ids of its vocabulary, so in range by construction: the head's per-call check
        # (on the device, without a read-back) would only add kernels to every step
        head.check_targets = False
        # kept out of the module tree: the compiled wrappers share the eager modules' parameters
        self.__dict__["_calls"] = ((torch.compile(model), torch.compile(head)) if compile else (model, head))
        self.__dict__["_task"], self.__dict__["_precision"] = task, precision

    def forward(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(mean loss over this rank's targets, targets)`` of a batch."""
        model, head = self._calls
        with self._precision.autocast():
            hidden, targets = self._task.hidden_states(model, batch)  # [*, d], [*]
            return head(hidden, targets).loss, targets


class StepResult(NamedTuple):
    """What a step did, the same on every rank.

    Attributes:
        loss_sum: the loss summed over all ranks' targets (float64, on the device).
        tokens: targets of all ranks.
        skipped: the update was skipped (fp16 gradients overflowed).
        grad_norm: the gradient norm before clipping (on the device), where the step computed one.
    """

    loss_sum: Tensor
    tokens: int
    skipped: bool
    grad_norm: Tensor | None = None


class TrainStep:
    """Forward, backward, clipping, the divergence check and the update of one batch.

    Args:
        task, model, head, optimizer: the run's parts (the optimizer over model and head).
        ranks: the run's processes (:class:`~sohsm.train.distributed.Ranks`).
        clip: gradient-norm clipping, ``None`` for none.
        amp: ``None``, ``"bf16"`` or ``"fp16"`` (:class:`~sohsm.train.precision.Precision`).
        compile: call model and head through :func:`torch.compile`.
    """

    def __init__(self, task: Task, model: nn.Module, head: Head, optimizer: torch.optim.Optimizer, ranks: Ranks,
                 clip: float | None, amp: str | None = None, compile: bool = False, static: bool = False) -> None:
        self.task, self.optimizer, self.ranks, self.clip = task, optimizer, ranks, clip
        self.precision = Precision(amp, ranks.device)
        self.forward = ranks.wrap(Forward(task, model, head, self.precision, compile))
        self.head = head
        self.params = unique_parameters(model, head)
        plain = ranks.world == 1 and amp is None and not compile
        #: the task's own step (:meth:`~sohsm.train.task.Task.step_by_hand`), if it has one for this run
        self.by_hand = task.step_by_hand(model, head, optimizer) if plain and not static else None
        #: the divergence flag kept on the device (see the module docstring); ``None``: checked every step
        self.watch = (DivergenceWatch(ranks.device) if self.by_hand is None and amp != "fp16" and not head.sparse
                      else None)
        #: the optimizer's step takes ``found_inf`` and ``grad_scale`` (torch's fused steps, DeviceAdagrad)
        self.fused = (all(group.get("fused") for group in optimizer.param_groups)
                      or bool(getattr(optimizer, "_step_supports_amp_scaling", False)))
        #: the step keeps its tensors from step to step (:meth:`set_static`)
        self.static = False
        self.set_static(static)

    def set_static(self, static: bool) -> None:
        """Keep the step's tensors from step to step, so that every ordinary step issues the same ops on the same
        storage (what a captured CUDA graph replays, :mod:`sohsm.train.step_graph`): gradients are zeroed, not
        set to ``None``, and a self-organized head's waiting statistics go to a fixed ring
        (:meth:`~sohsm.heads.Head.set_static`)."""
        self.static = bool(static)
        self.head.set_static(self.static)
        self.precision.cache_enabled = not self.static

    @property
    def clips_in_step(self) -> bool:
        """Whether clipping and the skip of a bad step happen inside the optimizer's fused step (its ``grad_scale``
        and ``found_inf``), with no pass over the gradients of their own."""
        return self.fused and self.watch is not None and self.precision.scaler is None

    def raise_if_diverged(self) -> None:
        """Raise :class:`~sohsm.train.guard.DivergenceError` if a step since the start was not finite (one read)."""
        if self.watch is not None:
            self.watch.raise_if_diverged()

    def _skip_if(self, bad: Tensor) -> None:
        """Make the coming optimizer step leave the model alone where ``bad`` (a device flag) is set, reading nothing.

        A fused step takes the flag as ``found_inf`` (as under a GradScaler) and skips on the device; any
        other step gets zero gradients, so nothing non-finite reaches the weights (its weight decay or
        momentum may still move them a little: the run stops at the next check and saves nothing of it).
        """
        if self.fused:
            vars(self.optimizer)["found_inf"] = bad.float()  # 0-dim, as a GradScaler gives it
            return
        for p in self.params:
            if p.grad is None:
                continue
            if p.grad.is_sparse:  # a row-sparse gradient (word vectors' embeddings): its stored values
                grad = p.grad.coalesce()
                p.grad = torch.sparse_coo_tensor(grad.indices(), grad.values().masked_fill(bad, 0.0), grad.shape)
            else:
                p.grad.masked_fill_(bad, 0.0)

    def __call__(self, batch: Any, step: int) -> StepResult:
        """Train on ``batch`` as step number ``step`` (every rank on its share).

        Raises:
            sohsm.train.guard.DivergenceError: the loss or the gradient is not finite
                (on every rank at once; nothing was updated, except by a task's own step).
        """
        if self.by_hand is not None:  # forward, gradient and update done by the task, in place
            loss_sum, tokens = self.by_hand(batch)
            check_step(loss_sum / max(tokens, 1), torch.zeros(()), step)
            return StepResult(loss_sum, tokens, False)
        if self.watch is not None:
            self.watch.at_step(step)  # the host's side of the step counter, outside any captured graph
        loss, targets = self.forward(batch)
        self.optimizer.zero_grad(set_to_none=not self.static)
        self.precision.backward(loss)
        self.precision.unscale_(self.optimizer)
        n = targets.numel()
        loss_sum = self.ranks.sum_(loss.detach().to(torch.float64) * n)  # a new tensor: summed in place
        tokens = n * self.ranks.world  # every rank reads an equal share of the columns
        if self.watch is not None:
            if self.clips_in_step:  # one norm; the fused step clips (grad_scale) and skips a bad step (found_inf)
                norm = gradient_norm(self.params)
                bad = self.watch.note(loss_sum, norm, step)
                vars(self.optimizer)["found_inf"] = bad.float()  # 0-dim, as a GradScaler gives it
                if self.clip is not None:
                    vars(self.optimizer)["grad_scale"] = clip_scale(norm, self.clip)
            else:
                norm = clip_gradients(self.params, self.clip) if self.clip is not None else gradient_norm(self.params)
                self._skip_if(self.watch.note(loss_sum, norm, step))
            try:
                stepped = self.precision.step(self.optimizer)
            finally:
                vars(self.optimizer).pop("found_inf", None)
                vars(self.optimizer).pop("grad_scale", None)
            return StepResult(loss_sum, tokens, not stepped, norm)
        norm = clip_gradients(self.params, self.clip) if self.clip is not None else gradient_norm(self.params)
        overflow_ok = self.precision.skips_overflow()
        check_step(loss_sum / tokens, torch.zeros(()) if overflow_ok else norm, step)
        stepped = self.precision.step(self.optimizer)
        scaler = self.precision.scaler  # a step is skipped only under fp16's scaler
        if not stepped and scaler is not None and scaler.get_scale() < MIN_SCALE:
            raise DivergenceError(f"training diverged at step {step}: the fp16 gradients stay non-finite "
                                  f"(loss scale below {MIN_SCALE:g})")
        return StepResult(loss_sum, tokens, not stepped, norm)
