"""The training loop of every task: budgets, dev evaluation, checkpoints, resume, signals.

The loop knows no model: a task (:mod:`sohsm.train.task`; the language model's
is :class:`~sohsm.tasks.lm.LMTask`, the summariser's
:class:`~sohsm.tasks.s2s.S2STask`) cuts its data into batches and has the
model turn a batch into hidden states and targets; the head scores them::

    for batch in task.batches(epoch, cursor):
        hidden, targets = task.hidden_states(model, batch)
        loss = head(hidden, targets).loss      # backward, clip, check, optimizer step

A run stops when ``epochs`` are done, ``max_tokens`` training tokens have been
read or ``time_budget`` seconds of training have passed (all sessions together;
evaluation and checkpointing are not counted), or on Ctrl-C, ``kill`` (SIGTERM) or a
closed terminal (SIGHUP): the step in flight finishes first; a second signal
aborts at once. It then evaluates on dev (unless interrupted) and writes
``last.pt``, from which :func:`resume_training` continues exactly: with the same
seed the losses are those of an uninterrupted run. A non-finite loss, gradient
or parameter stops the run with :class:`~sohsm.train.result.RunDiverged` (a
:class:`~sohsm.train.guard.DivergenceError` that says which checkpoints it left as they were, and what to change
in a new run: a resumed one keeps its settings) (:mod:`sohsm.train.guard`).

Before anything is written, the settings are checked against the data and the
device (:meth:`~sohsm.train.task.Task.check_fits`); while a session trains it holds the run
directory's lock (:mod:`sohsm.train.lock`). Files of a run directory:
:mod:`sohsm.train.checkpoint`; records: :mod:`sohsm.train.metrics`.

Started by ``torchrun`` with several processes, the run is data-parallel
(:mod:`sohsm.train.distributed`): each rank trains on its share of every batch,
only rank 0 writes, and all ranks stop at the same step. One step, with
``amp`` and ``compile``: :mod:`sohsm.train.step`.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sohsm.fields import FieldError
from sohsm.train.builders import resolve_device
from sohsm.train.checkpoint import (
    BEST,
    CONFIG_FILE,
    LAST,
    METRICS_FILE,
    VOCAB_FILE,
    load_checkpoint,
    reading_checkpoint,
    remove_orphans,
    write_json,
)
from sohsm.train.config import RunConfig, apply_overrides, config_differences
from sohsm.train.distributed import Ranks
from sohsm.train.early import check_resumable
from sohsm.train.guard import check_loaded_parameters
from sohsm.train.lock import RunLock
from sohsm.train.rundir import (
    check_budget_left,
    check_restartable,
    check_run_dir,
    check_writable,
    holds_run,
    read_config,
    set_rng_state,
)
from sohsm.train.schedule import restart_span
from sohsm.train.session import STOP_REASONS, TrainResult, run_session  # noqa: F401
from sohsm.train.state import RunState
from sohsm.train.step_graph import step_graph_refusal
from sohsm.train.task import Task, task_of


# -- public entry points ---------------------------------------------------------------------
def train(config: RunConfig, run_dir: str | os.PathLike[str], *, progress: bool = True) -> TrainResult:
    """Train a new run in ``run_dir`` (created if needed) until a budget is spent.

    The task that trains it follows from the config's class (a
    :class:`~sohsm.tasks.lm.LMConfig` trains a language model). Every check that
    can run before training does (settings, data, batch sizes against the
    splits, memory) before ``run_dir`` is created, so a refused run leaves
    nothing behind. Started by ``torchrun`` (``WORLD_SIZE`` > 1), every process
    calls it and trains on its share of each batch; rank 0 writes
    (:mod:`sohsm.train.distributed`). A directory left by a run stopped before its first step
    (``config.json``, ``vocab.json``, no records, no checkpoint) counts as empty.
    Relative data locations are stored absolute.

    Args:
        config: the run's configuration (validated again here).
        run_dir: an empty or new directory.
        progress: show a tqdm bar (tokens/s, loss, ppl) and one line per evaluation.

    Returns:
        :class:`TrainResult`.

    Raises:
        ValueError: ``run_dir`` already holds a run, is in use or cannot be written,
            bad config values, settings that do not fit the data or the device,
            or the head does not take its options.
        sohsm.train.guard.DivergenceError: the loss, a gradient or a parameter became non-finite.
        sohsm.data.DataError: the data is unknown, missing or corrupt.
    """
    config.validate()
    task_class = task_of(config)
    run_dir = check_run_dir(run_dir)
    resolve_device(config.device)
    with Ranks.join(config.device) as ranks:
        def check_directory() -> None:
            if holds_run(run_dir) and not any((run_dir / name).exists() for name in (LAST, BEST)):
                raise ValueError(f"{run_dir} holds the records of a run stopped before its first checkpoint (no "
                                 f"{LAST}): resume it to start it again with its settings; to train another with "
                                 "other settings, remove it or choose another directory")
            if holds_run(run_dir):
                raise ValueError(f"{run_dir} already holds a training run; resume it or choose another directory")
            check_writable(run_dir)

        ranks.first(check_directory)
        locations = {key: value for key, value in config.flat().items() if key.startswith("data.")}
        config = apply_overrides(config, task_class.absolute_locations(locations))
        return _start(task_class, config, run_dir, progress, restart=False, ranks=ranks)


def _load_task(task_class: type[Task], config: RunConfig, ranks: Ranks,
               saved_in: Path | None = None) -> tuple[Task, torch.device]:
    """The run's task with this rank's share of the data, and this rank's device; ``saved_in``: the directory
    of the run resumed (:meth:`~sohsm.train.task.Task.load_saved`)."""
    device = resolve_device(str(ranks.device))
    task = task_class.load(config, device) if saved_in is None else task_class.load_saved(config, device, saved_in)
    task.shard(ranks)
    return task, device


def _model_head_optimizer(task: Task, config: RunConfig, ranks: Ranks, device: torch.device):
    """The model and head (the same on every rank) and the optimizer attached to the head."""
    model, head = task.build(device)
    head.check_device(device)
    ranks.seed_own_stream(config.seed)
    optimizer = task.build_optimizer(model, head)
    head.attach(optimizer)
    # "on" where it cannot be: refused before writing
    step_graph_refusal(config, head, optimizer, ranks, device, model=model)
    return model, head, optimizer


def _start(task_class: type[Task], config: RunConfig, run_dir: Path, progress: bool, restart: bool,
           ranks: Ranks) -> TrainResult:
    """Load and check everything, then create ``run_dir`` and train from step 0 under its lock (rank 0's).

    ``restart``: ``run_dir`` holds a run stopped before its first checkpoint, whose
    records (if any) are dropped.
    """
    task, device = _load_task(task_class, config, ranks)
    if not restart:  # a restarted run keeps its config.json as written
        config = task.complete_config()  # what the data settles (a language model's head options), then written
    task.check_fits(device)
    model, head, optimizer = _model_head_optimizer(task, config, ranks, device)
    lock = RunLock(run_dir)

    def create() -> None:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
        lock.acquire()
        try:
            if (run_dir / LAST).exists() or (not restart and holds_run(run_dir)):  # another trainer was quicker
                raise ValueError(f"{run_dir} already holds a training run; resume it or choose another directory")
            remove_orphans(run_dir)
            try:
                (run_dir / METRICS_FILE).unlink(missing_ok=True)  # records of a session that left no checkpoint
                write_json(run_dir / CONFIG_FILE, config.to_dict())
                task.vocab.save(run_dir / VOCAB_FILE)
                task.write_run_files(run_dir)
            except OSError as error:
                raise ValueError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
        except BaseException:
            lock.release()
            raise

    ranks.first(create)
    try:
        return run_session(config, run_dir, task, model, head, optimizer, ranks, RunState(),
                           show_progress=progress)
    finally:
        lock.release()


def resume_training(run_dir: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None, *,
                    progress: bool = True) -> TrainResult:
    """Continue the run in ``run_dir`` from its ``last.pt`` exactly where it stopped.

    A run stopped before its first checkpoint (killed while loading, or by
    ``kill -9`` before ``checkpoint_every`` steps) starts again from step 0 with
    its saved config; its records are dropped.

    Args:
        run_dir: a run directory written by :func:`train`.
        overrides: dotted config fields (``{"max_tokens": 2_000_000}``). Budgets,
            logging intervals, the device and data locations (the config's
            ``resumable_fields``) may change; any other field must equal the run's.
        progress: as in :func:`train`.

    Raises:
        ValueError: no run in ``run_dir``, or another trainer holds it; an override
            that changes the run; a damaged checkpoint; data whose vocabulary or
            files differ from the checkpoint's; another number of processes than the run's.
        sohsm.train.rundir.NothingToTrain: (a ``ValueError``) the run's budgets are spent, with the
            settings overridden: the message names a larger value of each spent one; nothing is written.
        sohsm.train.guard.DivergenceError: as in :func:`train`.
    """
    run_dir = check_resumable(run_dir)
    task_class, saved = read_config(run_dir / CONFIG_FILE)
    overrides = task_class.absolute_locations(dict(overrides or {}))
    differences = config_differences(saved, overrides)
    if differences:
        raise FieldError.joined(f"cannot resume {run_dir} with other settings: ", differences)
    config = apply_overrides(saved, {k: v for k, v in overrides.items() if k in saved.resumable_fields})
    resolve_device(config.device)
    if (run_dir / LAST).is_file():
        check_budget_left(run_dir, config)
    with Ranks.join(config.device) as ranks:
        ranks.first(lambda: check_writable(run_dir))
        if not (run_dir / LAST).is_file():
            def check_restart() -> None:
                with RunLock(run_dir):  # a run another trainer writes before its first checkpoint is in use, no more
                    check_restartable(run_dir, config.checkpoint_every)

            ranks.first(check_restart)
            return _start(task_class, config, run_dir, progress, restart=True, ranks=ranks)
        lock = RunLock(run_dir)

        def take() -> None:
            lock.acquire()
            remove_orphans(run_dir)

        ranks.first(take)
        try:
            return _resume(task_class, config, saved, run_dir, progress, ranks)
        finally:
            lock.release()


def _resume(task_class: type[Task], config: RunConfig, saved: RunConfig, run_dir: Path,
            progress: bool, ranks: Ranks) -> TrainResult:
    """Rebuild the run from ``last.pt`` and train on (rank 0 holds the lock)."""
    path = run_dir / LAST
    try:
        checkpoint = load_checkpoint(path, map_location=resolve_device(str(ranks.device)),
                                     formats=(task_class.checkpoint_format,))
    except ValueError as error:
        if f"{BEST} beside it is intact" not in str(error):
            raise
        raise ValueError(f"{error}: to continue from {BEST}, copy it to {path} and resume (the steps since it are "
                         "trained again, the optimizer started afresh)") from None
    with reading_checkpoint(path, values=True):
        trained_head = checkpoint["signature"]["head"]
        trained_world = int(checkpoint.get("world_size", 1))
    if trained_head != config.head.name:
        raise ValueError(f"{path} holds a {trained_head!r} head but the run config names {config.head.name!r}")
    if trained_world != ranks.world:
        raise ValueError(f"{path} was trained by {trained_world} process(es) and is resumed by {ranks.world}; "
                         f"resume it with {trained_world} (each keeps its share of the batch and its random state)")
    task, device = _load_task(task_class, config, ranks, saved_in=run_dir)
    task.check_checkpoint(checkpoint, path)
    task.check_fits(device)
    model, head, optimizer = _model_head_optimizer(task, config, ranks, device)
    refusal = config.head.spec(check=False).resume_refusal(checkpoint["head"])
    if refusal is not None:  # an earlier release's head state the head can load but not train on
        raise ValueError(f"{path} {refusal}")
    with reading_checkpoint(path):
        model.load_state_dict(checkpoint["model"])
        head.load_state_dict(checkpoint["head"])
        if "optimizer" in checkpoint:
            optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_state(checkpoint["rng_ranks"][ranks.rank] if ranks.world > 1 else checkpoint["rng"], device)
        state = RunState.from_checkpoint(checkpoint)
        if "optimizer" not in checkpoint:  # a best.pt copied in its place: its weights, not what the optimizer learnt
            state.restarted_at = state.step
            warnings.warn(f"{path} holds no optimizer state (best.pt keeps none): the optimizer starts afresh from "
                          f"its weights and the rate warms up again over {restart_span(config.optim.warmup)} steps",
                          stacklevel=2)
        state.cursor = task.restore(checkpoint["position"], device)
        scaler = checkpoint.get("scaler")
    check_loaded_parameters((model, head), path)
    if config.to_dict() != saved.to_dict() and ranks.is_writer:
        write_json(run_dir / CONFIG_FILE, config.to_dict())
    return run_session(config, run_dir, task, model, head, optimizer, ranks, state, scaler=scaler,
                       show_progress=progress)
