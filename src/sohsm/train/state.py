"""Where a training run stands: its counters (saved in every checkpoint), the open train-record interval, the clock.

:class:`RunState` is what a resume takes up again; :class:`LossInterval` sums the loss of the steps
since the last train record on the device, so that a step reads nothing back; :class:`Clock` counts
the seconds a time budget counts (training, not evaluation or checkpointing).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class LossInterval:
    """The steps since the last train record: their loss summed (nats x tokens, a float64 tensor on the
    training device, read only when a record is written), their tokens and steps, and the clock at the start."""

    loss_sum: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    tokens: int = 0
    steps: int = 0
    start_s: float = 0.0

    def add(self, loss_sum: Tensor, tokens: int) -> None:
        """Count one step (``loss_sum`` stays on the device)."""
        self.loss_sum.add_(loss_sum)
        self.tokens += tokens
        self.steps += 1

    def mean_loss(self) -> float:
        """The mean loss per token so far: one device read."""
        return self.loss_sum.item() / self.tokens

    def restart(self, now_s: float) -> None:
        """Open the next interval at clock time ``now_s``."""
        self.loss_sum.zero_()
        self.tokens = self.steps = 0
        self.start_s = now_s

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (its ``log``), so a resumed run's first record is the uninterrupted one's."""
        return {"sum": float(self.loss_sum), "tokens": self.tokens, "steps": self.steps, "start_s": self.start_s}

    @classmethod
    def from_dict(cls, log: Mapping[str, Any]) -> LossInterval:
        return cls(torch.tensor(float(log["sum"]), dtype=torch.float64), int(log["tokens"]), int(log["steps"]),
                   float(log["start_s"]))


@dataclass
class RunState:
    """Where training is: what every checkpoint saves and a resume takes up again."""

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    epoch: int = 0
    cursor: int = 0  # where the epoch stands, in the task's units (a BPTT row, a batch)
    best_ppl: float | None = None
    lr_scale: float = 1.0  # what annealing (``optim.anneal``) has left of the learning rate
    interval: LossInterval = field(default_factory=LossInterval)
    #: the step where the optimizer's state started afresh mid-run (a resume from a checkpoint without it), from
    #: which the rate warms up again; ``None``: the optimizer has trained since the first step
    restarted_at: int | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's counters (its ``position`` is the loop's: the epoch and the task's cursor)."""
        return {"step": self.step, "tokens": self.tokens, "elapsed_s": self.elapsed_s, "best_ppl": self.best_ppl,
                "lr_scale": self.lr_scale, "log": self.interval.to_dict(), "restarted_at": self.restarted_at}

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any]) -> RunState:
        """Where a checkpoint's run stood; its cursor is the task's to restore (:meth:`Task.restore
        <sohsm.train.task.Task.restore>`)."""
        return cls(step=int(checkpoint["step"]), tokens=int(checkpoint["tokens"]),
                   elapsed_s=float(checkpoint["elapsed_s"]), epoch=int(checkpoint["position"]["epoch"]),
                   best_ppl=checkpoint["best_ppl"], lr_scale=float(checkpoint.get("lr_scale", 1.0)),
                   interval=LossInterval.from_dict(checkpoint["log"]), restarted_at=checkpoint.get("restarted_at"))

    def epoch_float(self, epoch_length: int) -> float:
        """The epochs done, with the open one's share."""
        return self.epoch + self.cursor / epoch_length


class Clock:
    """Seconds of training: runs during steps, paused during evaluation and checkpointing (a time budget counts it)."""

    def __init__(self, total: float, device: torch.device) -> None:
        self.total, self._cuda = total, device.type == "cuda"
        self._start: float | None = None

    def start(self) -> None:
        self._start = time.perf_counter()

    def pause(self) -> None:
        if self._start is not None:
            if self._cuda:
                torch.cuda.synchronize()
            self.total += time.perf_counter() - self._start
            self._start = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Pause for the block; a clock that ran before runs again after it."""
        running = self._start is not None
        self.pause()
        try:
            yield
        finally:
            if running:
                self.start()

    def now(self) -> float:
        return self.total + (time.perf_counter() - self._start if self._start is not None else 0.0)

    def leave_out(self, seconds: float) -> None:
        """Take ``seconds`` just spent back out of the count (a step that compiled: compiling is not training)."""
        if self._start is not None:
            self._start += seconds
        else:
            self.total -= seconds
