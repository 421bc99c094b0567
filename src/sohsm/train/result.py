"""What a training session gives back: its result (:class:`TrainResult`), or the error of a run that diverged
(:class:`RunDiverged`, which says what the run directory still holds and what to change)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sohsm.fields import Field, FieldError, escape, suggest
from sohsm.train.checkpoint import BEST, LAST
from sohsm.train.config import RunConfig, apply_overrides
from sohsm.train.evaluation import EvalResult
from sohsm.train.guard import DivergenceError

#: why a training session ended
STOP_REASONS = ("done", "max_tokens", "time_budget", "interrupted")


@dataclass
class TrainResult:
    """What a training session did.

    Attributes:
        run_dir: the run directory.
        stopped: why the session ended, one of :data:`STOP_REASONS`.
        step, tokens, elapsed_s, epoch: totals over all sessions (``epoch`` fractional).
        best_ppl: best dev perplexity so far (``None`` before any evaluation).
        last_eval: the last dev evaluation of this session, if any.
        signature: head, clusters, K, vocabulary, corpus, seed, version.
        paths: the run's files (``metrics``, ``last``, ``best``, ...), whether written yet or not.
        stop_signal: for ``stopped == "interrupted"``, the signal that asked
            (``signal.SIGINT``, ``SIGTERM``, ``SIGHUP``, or ``SIGPIPE`` when standard output closed).
        writer: whether this process wrote the run's files (with several processes, rank 0 only).
        session_tokens, session_s: the tokens and seconds of training of this session alone (its speed, as its
            progress bar gives it; a new run's are its totals).
        compile_s, compile_tokens: the seconds and tokens of this session's steps that compiled (``compile``, or the
            task's own code: word2vec's Numba loops): the seconds are left out of ``elapsed_s``, and both out of the
            speed.
        compiled: what compiled, as the summary names it (:attr:`sohsm.train.task.Task.compiles`).
    """

    run_dir: Path
    stopped: str
    step: int
    tokens: int
    elapsed_s: float
    epoch: float
    best_ppl: float | None
    last_eval: EvalResult | None
    signature: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)
    stop_signal: int | None = None
    writer: bool = True
    session_tokens: int = 0
    session_s: float = 0.0
    compile_s: float = 0.0
    compile_tokens: int = 0
    compiled: str = "--compile"

    @property
    def tokens_per_s(self) -> float:
        """This session's speed: its tokens over its seconds of training, steps that compiled left out (0 where it
        trained none)."""
        return (self.session_tokens - self.compile_tokens) / self.session_s if self.session_s > 0 else 0.0


#: the clipping a diverged run is told to try where it had none (the paper's text8 setting)
CLIP_SUGGESTED = 0.25


class RunDiverged(FieldError, DivergenceError):
    """A session diverged (:class:`~sohsm.train.guard.DivergenceError`): the message adds what the run directory
    still holds and the settings to change, as fields (a command line names them by its flags)."""


def _takes(config: RunConfig, overrides: dict[str, Any]) -> bool:
    """Whether ``config`` with ``overrides`` is a valid config of its task (a suggestion must be one)."""
    try:
        apply_overrides(config, overrides)
    except ValueError:
        return False
    return True


def diverged_run(error: DivergenceError, config: RunConfig, saved_steps: Mapping[str, int | None]) -> RunDiverged:
    """``error`` with what the run directory still holds (``saved_steps``: the step of each checkpoint saved, by
    file name) and what to change: a resumed run keeps its settings and takes the same steps again, so a lower
    rate (a tenth of the run's, where the config takes it) or clipping means a new run."""
    held = [name for name in (LAST, BEST) if name in saved_steps]
    if LAST in held:
        saved = (f"{' and '.join(held)} (step {saved_steps[LAST]:,}) "
                 f"{'were' if len(held) > 1 else 'was'} left as {'they were' if len(held) > 1 else 'it was'}, "
                 "the last good ones")
    elif held:
        saved = f"{BEST} (step {saved_steps[BEST]:,}) was left as it was; no {LAST} was written yet"
    else:
        due = f"due at step {config.checkpoint_every:,}" if config.checkpoint_every else "due at the end"
        saved = f"nothing was saved: it diverged before its first checkpoint ({due})"
    changes: list[tuple[str, Field | None]] = []
    rate = getattr(config, "learning_rate", config.optim.learning_rate)  # a task's own default, else the optimizer's
    lower = float(f"{rate / 10:.3g}")
    if _takes(config, {"optim.lr": lower}):
        changes.append(("a lower learning rate ({}, a tenth of this run's)", suggest("optim.lr", lower)))
    else:
        changes.append(("a lower learning rate", None))
    if config.optim.clip is None and _takes(config, {"optim.clip": CLIP_SUGGESTED}):
        changes.append(("gradient clipping ({})", suggest("optim.clip", CLIP_SUGGESTED)))
    where = "in another run directory" + ("" if held else " (or in this one, removed first)")
    template = (f"{escape(str(error))}; {escape(saved)}; a resumed run keeps its settings and takes the same steps "
                f"again: train a new run with {' or '.join(text for text, _ in changes)} {where}")
    return RunDiverged(template, *(field for _, field in changes if field is not None))
