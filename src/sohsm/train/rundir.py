"""A run directory between sessions: does it hold a run, can it be written, what does its config say, is any
of its budget left.

Also the random state a checkpoint keeps, so that a resumed run draws what an
uninterrupted one would.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sohsm.fields import Field, FieldError, escape, suggest
from sohsm.train.checkpoint import BEST, LAST, METRICS_FILE
from sohsm.train.config import RunConfig
from sohsm.train.early import check_run_dir  # noqa: F401  (the loop's, from here)
from sohsm.train.metrics import read_metrics
from sohsm.train.task import Task, task_of_dict


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that got somewhere: a checkpoint, or records of its steps.

    ``config.json`` and ``vocab.json`` alone are what a run stopped before its first
    step leaves; such a directory may be trained in again.
    """
    if any((run_dir / name).exists() for name in (LAST, BEST)):
        return True
    metrics = run_dir / METRICS_FILE
    try:
        return metrics.is_file() and bool(read_metrics(metrics))
    except (OSError, ValueError):  # unreadable, or not UTF-8: something is there, leave it alone
        return True


def check_restartable(run_dir: Path, checkpoint_every: int) -> None:
    """Refuse to start a run without ``last.pt`` again from step 0 where that would destroy more than it redoes.

    A run killed before its first checkpoint leaves at most records of steps before
    ``checkpoint_every`` and no ``best.pt``: it may start again. A ``best.pt`` or records
    of later steps say that ``last.pt`` was there and is gone (deleted, or lost): starting
    again would overwrite ``best.pt`` and ``metrics.jsonl``.

    Raises:
        ValueError: one line saying what is there and what to do.
    """
    if (run_dir / BEST).exists():
        what = f"{BEST} but no {LAST}"
    else:
        try:
            steps = [int(r.get("step", 0)) for r in read_metrics(run_dir / METRICS_FILE)] if (
                run_dir / METRICS_FILE).is_file() else []
        except (OSError, ValueError, TypeError):
            steps = []
        if not steps or not checkpoint_every or max(steps) < checkpoint_every:
            return
        what = f"records up to step {max(steps):,} in {METRICS_FILE} but no {LAST} (checkpoints every " \
               f"{checkpoint_every:,} steps)"
    raise ValueError(f"{run_dir} holds {what}: resuming would start again from step 0 and overwrite what is there; "
                     f"to continue from {BEST}, copy it to {run_dir / LAST} and resume (its weights; the optimizer "
                     "starts "
                     "afresh), or train in another directory")


def check_writable(run_dir: Path) -> None:
    """Refuse a directory that cannot be created or written, without creating anything."""
    path = run_dir.absolute()
    while not path.exists():
        if path.parent == path:
            break
        path = path.parent
    if not path.is_dir():
        raise ValueError(f"cannot write to run directory {run_dir}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write to run directory {run_dir}: {path} is not writable")


def read_config(path: Path) -> tuple[type[Task], RunConfig]:
    """The task and config of a run's ``config.json``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable run config ({error})") from None
    task_class = task_of_dict(data)
    return task_class, task_class.config_class.from_saved(data)


def read_progress(path: Path) -> dict[str, Any]:
    """Step, epoch, tokens and seconds of training in a checkpoint, read without loading its weights.

    Raises:
        ValueError: the file is not a readable checkpoint.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {"step": int(checkpoint["step"]), "epoch": int(checkpoint["position"]["epoch"]),
                "tokens": int(checkpoint["tokens"]), "elapsed_s": float(checkpoint["elapsed_s"])}
    except Exception as error:  # torch raises many types for a damaged file
        raise ValueError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None


def spent_budgets(config: RunConfig, progress: Mapping[str, Any]) -> list[str]:
    """The budgets of ``config`` that a run at ``progress`` (:func:`read_progress`) has spent, in the order the
    training loop checks them: ``"done"`` (every epoch), ``"max_tokens"``, ``"time_budget"``. Empty: it trains on."""
    spent = []
    if progress["epoch"] >= config.epochs:
        spent.append("done")
    if config.max_tokens is not None and progress["tokens"] >= config.max_tokens:
        spent.append("max_tokens")
    if config.time_budget is not None and progress["elapsed_s"] >= config.time_budget:
        spent.append("time_budget")
    return spent


class NothingToTrain(FieldError):
    """A resumed run whose budgets are spent: nothing is left to train until one is raised (the message says which,
    and to what)."""


def check_budget_left(run_dir: Path, config: RunConfig) -> None:
    """Refuse to resume a run at the end of its budgets, naming them and a larger value of each.

    A checkpoint that cannot be read passes: the loader says what is wrong with it.

    Raises:
        NothingToTrain: every epoch done, or ``max_tokens`` read, or ``time_budget`` spent.
    """
    try:
        progress = read_progress(run_dir / LAST)
    except ValueError:
        return
    spent = spent_budgets(config, progress)
    if not spent:
        return
    facts = [_spent_fact(config, budget, progress) for budget in spent]
    raise NothingToTrain(escape(f"nothing left to train in {run_dir}: {' and '.join(what for what, _ in facts)} "
                                f"(step {progress['step']:,}); to train on, ask "
                                "for more: ") + " and ".join("{}" for _ in facts), *(more for _, more in facts))


def _spent_fact(config: RunConfig, budget: str, progress: Mapping[str, Any]) -> tuple[str, Field]:
    """What spending ``budget`` means, and the setting that would give twice as much (one epoch more); the tokens
    read are the run's own count (its summary's: whole steps, which pass the budget by part of one)."""
    if budget == "done":
        epochs = "its one epoch" if config.epochs == 1 else f"all {config.epochs} epochs"
        return f"{epochs} done", suggest("epochs", config.epochs + 1)
    if budget == "max_tokens":
        assert config.max_tokens is not None  # the budget spent is one that is set
        read = progress["tokens"]
        what = f"its {read:,} tokens read" if read == config.max_tokens else \
            f"{read:,} tokens read of a {config.max_tokens:,}-token budget"
        return what, suggest("max_tokens", 2 * config.max_tokens)
    assert config.time_budget is not None  # the budget spent is one that is set
    return f"its {config.time_budget:g} s of training spent", suggest("time_budget", 2 * config.time_budget)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Torch's random state (and CUDA's on a GPU), for a checkpoint."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Take up a checkpoint's :func:`rng_state` again."""
    torch.set_rng_state(state["torch"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
