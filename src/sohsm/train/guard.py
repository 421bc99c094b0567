"""What keeps a training run's work safe: stop signals, divergence checks, and output that may vanish.

* :class:`StopSignals`: Ctrl-C (SIGINT), ``kill`` / ``timeout`` / a scheduler's
  preemption (SIGTERM) and a closed terminal (SIGHUP) all ask the loop to stop
  after the step in flight; the loop then writes ``last.pt`` and returns, so
  nothing since the last checkpoint is lost. A second signal aborts at once.
* :class:`DivergenceWatch` (without a device sync per step), :func:`check_step`
  (one per step) and :func:`check_finite_parameters`: a non-finite loss,
  gradient or parameter stops the run with :class:`DivergenceError`; nothing
  non-finite is stepped into the model or written to a checkpoint, so
  ``last.pt`` and ``best.pt`` stay the last good ones (the training loop's error says which it holds, and what
  to change: :class:`sohsm.train.result.RunDiverged`).
* :func:`write_line`: a progress line whose reader went away (``sohsm lm train
  ... | head``) stops the run like a signal instead of killing it mid-step.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

#: the signals that ask a run to stop after its current step (SIGHUP does not exist on Windows)
STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)


class DivergenceError(ValueError):
    """Training produced a non-finite loss, gradient or parameter; nothing of that step was saved."""


class StopSignals:
    """Turns SIGINT, SIGTERM and SIGHUP into a request to stop after the current step.

    Use as a context manager around the loop and read :attr:`requested` after
    each step; :attr:`signum` says which signal (or ``SIGPIPE``, see
    :func:`write_line`) asked. A second signal raises ``KeyboardInterrupt`` at
    once, unless it comes within ``grace_s`` seconds of the first (a launcher such as
    ``torchrun`` passes on a signal its workers got as well). After SIGHUP, standard
    output and error that were a terminal point to ``os.devnull`` (the terminal is
    gone; writing to it would fail mid-save).
    Outside the main thread signals cannot be caught, and the guard does nothing.
    """

    def __init__(self, grace_s: float = 0.0) -> None:
        self.signum: int | None = None
        self.grace_s = grace_s
        self._first_at = 0.0
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    def request(self, signum: int) -> None:
        """Ask for a stop as if ``signum`` had arrived (the first request wins)."""
        if self.signum is None:
            self.signum = int(signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if time.monotonic() - self._first_at < self.grace_s:
                return  # the same request passed on (torchrun forwards the Ctrl-C its workers also got)
            raise KeyboardInterrupt
        self._first_at = time.monotonic()
        if signum == getattr(signal, "SIGHUP", None):
            silence_terminal()
        self.request(signum)

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():  # None: a handler not set from Python
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


def silence_terminal() -> None:
    """Point standard output and error to ``os.devnull`` where they are a terminal."""
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                _to_devnull(fd)
        except (AttributeError, OSError, ValueError):  # a replaced stream without a file descriptor
            continue


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def write_line(text: str, stop: StopSignals) -> None:
    """Print a progress line above the bar; if nobody reads standard output any more, stop the run.

    A closed pipe (``| head``) raises ``BrokenPipeError`` on the write. The run
    then stops after its step as on a signal (``SIGPIPE``), and standard output
    points to ``os.devnull`` so the rest of the session (and Python's exit) can
    still write.
    """
    try:
        tqdm.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        try:
            _to_devnull(sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):
            pass
        stop.request(getattr(signal, "SIGPIPE", 13))


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# -- divergence ---------------------------------------------------------------------------------
def _grad_values(grad: Tensor) -> Tensor:
    """The stored values of a gradient: a row-sparse one's non-zero rows (coalesced), a dense one whole."""
    return grad.coalesce().values() if grad.is_sparse else grad


def gradient_norm(params: Iterable[torch.nn.Parameter]) -> Tensor:
    """The 2-norm of all gradients together (what ``clip_grad_norm_`` returns), without changing them.

    Row-sparse gradients (sampled and tree heads with ``sparse=True``) count by their values.
    """
    grads = [_grad_values(p.grad.detach()) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if not any(g.is_sparse for g in grads) and hasattr(torch.nn.utils, "get_total_norm"):  # torch 2.6+: foreach
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also takes row-sparse gradients; returns the norm before clipping.

    torch's own refuses sparse gradients; here they are scaled like the dense ones, so a head
    with ``sparse=True`` trains under the paper's clipping as every other head does.
    """
    params = [p for p in params if p.grad is not None]
    if not any(p.grad is not None and p.grad.is_sparse for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = gradient_norm(params)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in params:
        grad = p.grad
        assert grad is not None  # the parameters without one were left out above
        if grad.is_sparse:
            p.grad = grad.coalesce() * scale
        else:
            grad.mul_(scale)
    return norm


def clip_scale(grad_norm: Tensor, max_norm: float) -> Tensor:
    """What the gradients are divided by to clip them to ``max_norm`` (``clip_grad_norm_``'s factor, inverted): at
    least 1. A fused optimizer step takes it as its ``grad_scale`` and clips inside its own kernel."""
    return ((grad_norm + 1e-6) / max_norm).clamp(min=1.0).to(torch.float32)  # float32, as the fused kernels take it


def check_step(loss: Tensor, grad_norm: Tensor, step: int) -> None:
    """Refuse a step whose loss or gradient is not finite, before the optimizer applies it.

    One device sync per step.

    Raises:
        DivergenceError: naming the step and what went wrong.
    """
    values = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float().reshape(()).to(loss.device)])
    if bool(torch.isfinite(values).all()):
        return
    loss_value, norm_value = values.tolist()
    what = (f"the loss is {loss_value}" if not math.isfinite(loss_value)
            else f"the gradient norm is {norm_value}")
    raise DivergenceError(f"training diverged at step {step}: {what}")


class DivergenceWatch:
    """Notes on the device whether a step's loss or gradient is not finite; the host reads it only when asked.

    :func:`check_step` reads one flag back every step, a device synchronisation that on
    a GPU costs as much as a small model's step. Here each step only updates device
    tensors (a step counter, and the first bad step with its loss and gradient norm), the caller
    keeps the bad step from changing the model on the device (:meth:`TrainStep
    <sohsm.train.step.TrainStep>`: the fused optimizers' ``found_inf``, else zeroed
    gradients), and :meth:`raise_if_diverged` is called where the loop reads values
    anyway: at each log line, dev evaluation and checkpoint. So nothing non-finite is
    stepped into the model or saved, and a run that diverged stops at its next log
    point (at most ``log_every`` steps later) with the same message as before.

    The step number lives on the device too (:attr:`step`, one addition a step), so a step replayed from a
    captured CUDA graph (:mod:`sohsm.train.step_graph`) names the right one; the host only mirrors it and
    writes it (one fill, no read) where the mirror does not hold, never while a graph is captured.
    """

    def __init__(self, device: torch.device) -> None:
        #: the first bad step, its loss and gradient norm (float64); step -1: none yet
        self.record = torch.full((3,), -1.0, dtype=torch.float64, device=device)
        #: the step being noted, counted on the device
        self.step = torch.zeros((), dtype=torch.float64, device=device)
        self._next = 1  # host mirror: the step the next note records (the device counter holds one less)

    def at_step(self, step: int) -> None:
        """Make the device counter hold ``step - 1`` before step ``step`` is noted (a fill where the mirror differs)."""
        if self._next != step:
            self.step.fill_(step - 1)
            self._next = step

    def replayed(self, step: int) -> None:
        """Step ``step`` was noted by a replayed graph, not by :meth:`note`: the mirror moves on as the counter did."""
        self._next = step + 1

    def note(self, loss: Tensor, grad_norm: Tensor, step: int) -> Tensor:
        """Record step ``step``; returns a 0-dim bool tensor on the device: whether it is bad. Reads nothing back.

        One check covers both values: their sum minus itself is 0 exactly when both are finite.
        """
        self.at_step(step)
        self.step += 1
        self._next = step + 1
        values = torch.stack([self.step, loss.detach().reshape(()).to(torch.float64),
                              grad_norm.detach().reshape(()).to(self.step.device, torch.float64)])
        total = values[1] + values[2]
        bad = (total - total) != 0
        torch.where(bad & (self.record[0] < 0), values, self.record, out=self.record)
        return bad

    def raise_if_diverged(self) -> None:
        """Raise :class:`DivergenceError` naming the first bad step, if there was one (one read of the record)."""
        step, loss_value, norm_value = self.record.tolist()
        if step < 0:
            return
        what = (f"the loss is {loss_value}" if not math.isfinite(loss_value)
                else f"the gradient norm is {norm_value}")
        raise DivergenceError(f"training diverged at step {int(step)}: {what}")


def check_eval(nll_nats: float, step: int) -> None:
    """Refuse a dev evaluation whose mean loss is NaN (an infinite one, a word of probability 0, may stand).

    Raises:
        DivergenceError: naming the step.
    """
    if math.isnan(nll_nats):
        raise DivergenceError(f"training diverged at step {step}: the dev loss is nan")


def check_finite_parameters(modules: Iterable[torch.nn.Module], step: int) -> None:
    """Refuse to checkpoint a model with a non-finite parameter (an update that overflowed).

    Raises:
        DivergenceError: naming the step and the first such parameter.
    """
    for module in modules:
        for name, param in module.named_parameters():
            if not bool(torch.isfinite(param).all()):
                raise DivergenceError(f"training diverged at step {step}: parameter {name} is not finite")


def check_loaded_parameters(modules: Iterable[torch.nn.Module], path) -> None:
    """Refuse a checkpoint whose weights are not finite (saved by a diverged run of an older version).

    Raises:
        ValueError: naming the checkpoint.
    """
    try:
        check_finite_parameters(modules, 0)
    except DivergenceError:
        raise ValueError(f"{path} holds weights that are not finite (a diverged model); it cannot be used") from None
