"""The learning rate of each step: a linear warm-up, then a constant rate or a cosine decay.

    rate = lr x warm-up x schedule x epoch decay (``optim.lr_decay``) x annealing (``optim.anneal``)

    warm-up(s)  = min(1, (s + 1) / warmup)                      s: steps taken before this one
    constant(s) = 1
    cosine(s)   = floor + (1 - floor) (1 + cos(pi p)) / 2,      p = (s - warmup) / (total - 1 - warmup), in [0, 1]

The cosine falls from the full rate to :data:`COSINE_FLOOR` of it at the run's last
planned step (the floor of GPT-3's and Chinchilla's schedules), the recipe decoder-only
transformers are trained with. Both factors are functions of the step alone, so a resumed
run follows them exactly; ``total`` is the run's planned steps (its ``epochs`` and
``max_tokens``), so a resume that changes the budget stretches the rest of the curve.

A resume from a checkpoint without optimizer state (a ``best.pt`` copied over a damaged ``last.pt``) starts
Adagrad's or Adam's statistics afresh, whose first updates are as large as the rate allows: it warms up
again over the run's warm-up (:data:`RESTART_WARMUP` steps where the run has none) from the step it resumed at.
"""
from __future__ import annotations

import math

from sohsm.train.config import OptimConfig

#: where the cosine ends, as a fraction of the full rate
COSINE_FLOOR = 0.1
#: the steps a resume without optimizer state warms up over when the run itself has no warm-up
RESTART_WARMUP = 100


def schedule_factor(schedule: str, step: int, warmup: int, total_steps: int) -> float:
    """The factor of the rate of the step after ``step`` steps: warm-up times ``schedule``'s shape.

    >>> [round(schedule_factor("cosine", s, 2, 6), 3) for s in range(7)]
    [0.5, 1.0, 1.0, 0.775, 0.325, 0.1, 0.1]
    >>> schedule_factor("constant", 0, 4, 100), schedule_factor("constant", 50, 4, 100)
    (0.25, 1.0)
    """
    factor = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    if schedule == "constant":
        return factor
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r}")
    span = max(1, total_steps - 1 - warmup)  # the last planned step (s = total - 1) takes the floor
    progress = min(1.0, max(0.0, (step - warmup) / span))
    return factor * (COSINE_FLOOR + (1 - COSINE_FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


def planned_steps(planned_tokens: int, tokens_per_epoch: int, steps_per_epoch: int, tokens_per_step: int) -> int:
    """The steps a run of ``planned_tokens`` takes: its whole epochs' steps, then full steps of the last one's
    part (an epoch may end on a shorter step; a budget stops at the first step that reaches it). At least one.

    >>> planned_steps(1000, 400, 4, 100)       # two epochs of 4 steps, then 2 of 100 tokens
    10
    """
    epochs, rest = divmod(planned_tokens, tokens_per_epoch)
    return max(1, epochs * steps_per_epoch + math.ceil(rest / tokens_per_step))


class LearningRate:
    """The rate of every step of a run: the epoch's rate (``optim.lr_decay``) x what annealing left
    (``lr_scale``) x the warm-up and schedule's factor over the ``total_steps`` the budget plans."""

    def __init__(self, optim: OptimConfig, total_steps: int) -> None:
        self.optim, self.total_steps = optim, total_steps
        #: a warm-up or a cosine moves the rate every step; else it changes at epochs and annealings only
        self.moves_every_step = optim.warmup > 0 or optim.lr_schedule != "constant"

    def at(self, epoch: int, step: int, lr_scale: float, restarted_at: int | None = None) -> float:
        """The rate of the step after ``step`` steps, in (0-based) ``epoch``; ``restarted_at``: the step where the
        optimizer's state started afresh (a warm-up again from there, :func:`restart_factor`)."""
        rate = self.optim.rate_in_epoch(epoch) * lr_scale
        if self.moves_every_step:
            rate *= schedule_factor(self.optim.lr_schedule, step, self.optim.warmup, self.total_steps)
        if restarted_at is not None:
            rate *= restart_factor(step, restarted_at, self.optim.warmup)
        return rate


def restart_factor(step: int, restarted_at: int, warmup: int) -> float:
    """The warm-up again of a run whose optimizer state started afresh at step ``restarted_at``: over the run's
    own ``warmup`` steps, or :data:`RESTART_WARMUP` where it has none.

    >>> [restart_factor(s, 10, 4) for s in (10, 11, 13, 20)]
    [0.25, 0.5, 1.0, 1.0]
    """
    return min(1.0, max(0, step - restarted_at + 1) / restart_span(warmup))


def restart_span(warmup: int) -> int:
    """The steps of the warm-up again after a restart of the optimizer's state (the run's own, or a default)."""
    return warmup if warmup > 0 else RESTART_WARMUP
