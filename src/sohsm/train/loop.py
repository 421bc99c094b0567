"""The training loop of every task: budgets, dev evaluation, checkpoints, resume, signals.

The loop knows no model: a task (:mod:`sohsm.train.task`; the language model's
is :class:`~sohsm.train.lm_task.LMTask`, the summariser's
:class:`~sohsm.train.s2s_task.S2STask`) cuts its data into batches and has the
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
or parameter stops the run with :class:`~sohsm.train.guard.DivergenceError` and
leaves the checkpoints as they were (:mod:`sohsm.train.guard`).

Before anything is written, the settings are checked against the data and the
device (:meth:`~sohsm.train.task.Task.check_fits`); while a session trains it holds the run
directory's lock (:mod:`sohsm.train.lock`). Files of a run directory:
:mod:`sohsm.train.checkpoint`; records: :mod:`sohsm.train.metrics`.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from sohsm.heads import Head
from sohsm.train.builders import build_optimizer, resolve_device, run_signature, unique_parameters
from sohsm.train.checkpoint import (
    BEST,
    CONFIG_FILE,
    LAST,
    METRICS_FILE,
    VOCAB_FILE,
    load_checkpoint,
    reading_checkpoint,
    remove_orphans,
    save_checkpoint,
    write_json,
)
from sohsm.train.config import RunConfig, apply_overrides, config_differences
from sohsm.train.evaluation import EvalResult, evaluate
from sohsm.train.guard import (
    StopSignals,
    check_eval,
    check_finite_parameters,
    check_loaded_parameters,
    check_step,
    clip_gradients,
    gradient_norm,
    write_line,
)
from sohsm.train.lock import RunLock
from sohsm.train.metrics import MetricsLog
from sohsm.train.progress import progress_bar
from sohsm.train.rundir import check_writable, holds_run, read_config, rng_state, set_rng_state
from sohsm.train.task import Task, task_of

# the language model's names, where code written against earlier versions finds them
from sohsm.models.lstm_lm import LSTMLanguageModel  # noqa: E402,F401
from sohsm.train.lm_task import check_vocabulary  # noqa: E402,F401

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


@dataclass
class _Progress:
    """Everything about where training is, saved in every checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    epoch: int = 0
    cursor: int = 0  # where the epoch stands, in the task's units (a BPTT row, a batch)
    best_ppl: float | None = None
    # the open train-record interval: summed loss (nats x tokens), tokens, steps, clock at its start
    log_sum: float = 0.0
    log_tokens: int = 0
    log_steps: int = 0
    log_start_s: float = 0.0


class _Clock:
    """Seconds of training: runs during steps, paused during evaluation and checkpointing."""

    def __init__(self, total: float, device: torch.device) -> None:
        self.total, self._start, self._cuda = total, None, device.type == "cuda"

    def start(self) -> None:
        self._start = time.perf_counter()

    def pause(self) -> None:
        if self._start is not None:
            if self._cuda:
                torch.cuda.synchronize()
            self.total += time.perf_counter() - self._start
            self._start = None

    def now(self) -> float:
        return self.total + (time.perf_counter() - self._start if self._start is not None else 0.0)


# -- public entry points ---------------------------------------------------------------------
def train(config: RunConfig, run_dir: str | os.PathLike[str], *, progress: bool = True) -> TrainResult:
    """Train a new run in ``run_dir`` (created if needed) until a budget is spent.

    The task that trains it follows from the config's class (a
    :class:`~sohsm.train.TrainConfig` trains a language model). Every check that
    can run before training does (settings, data, batch sizes against the
    splits, memory) before ``run_dir`` is created, so a refused run leaves
    nothing behind. A directory left by a run stopped before its first step
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
    run_dir = Path(run_dir)
    if holds_run(run_dir):
        raise ValueError(f"{run_dir} already holds a training run; resume it or choose another directory")
    check_writable(run_dir)
    locations = {key: value for key, value in config.flat().items() if key.startswith("data.")}
    config = apply_overrides(config, task_class.absolute_locations(locations))
    return _start(task_class, config, run_dir, progress, restart=False)


def _start(task_class: type[Task], config: RunConfig, run_dir: Path, progress: bool, restart: bool) -> TrainResult:
    """Load and check everything, then create ``run_dir`` and train from step 0 under its lock.

    ``restart``: ``run_dir`` holds a run stopped before its first checkpoint, whose
    records (if any) are dropped.
    """
    device = resolve_device(config.device)
    task = task_class.load(config, device)
    task.check_fits(device)
    model, head = task.build(device)
    optimizer = build_optimizer(config, model, head)
    head.attach(optimizer)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
    with RunLock(run_dir):
        if (run_dir / LAST).exists() or (not restart and holds_run(run_dir)):  # another trainer was quicker
            raise ValueError(f"{run_dir} already holds a training run; resume it or choose another directory")
        remove_orphans(run_dir)
        try:
            (run_dir / METRICS_FILE).unlink(missing_ok=True)  # records of a session that left no checkpoint
            write_json(run_dir / CONFIG_FILE, config.to_dict())
            task.vocab.save(run_dir / VOCAB_FILE)
        except OSError as error:
            raise ValueError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
        return _run(config, run_dir, task, model, head, optimizer, _Progress(), device, progress, resumed=False)


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
            files differ from the checkpoint's.
        sohsm.train.guard.DivergenceError: as in :func:`train`.
    """
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ValueError(f"{run_dir} holds no training run to resume (no {CONFIG_FILE})")
    task_class, saved = read_config(run_dir / CONFIG_FILE)
    overrides = task_class.absolute_locations(dict(overrides or {}))
    differences = config_differences(saved, overrides)
    if differences:
        raise ValueError(f"cannot resume {run_dir} with other settings: " + "; ".join(differences))
    config = apply_overrides(saved, {k: v for k, v in overrides.items() if k in saved.resumable_fields})
    check_writable(run_dir)
    if not (run_dir / LAST).is_file():
        return _start(task_class, config, run_dir, progress, restart=True)
    with RunLock(run_dir):
        remove_orphans(run_dir)
        return _resume(task_class, config, saved, run_dir, progress)


def _resume(task_class: type[Task], config: RunConfig, saved: RunConfig, run_dir: Path,
            progress: bool) -> TrainResult:
    """Rebuild the run from ``last.pt`` and train on (the caller holds the lock)."""
    device = resolve_device(config.device)
    path = run_dir / LAST
    checkpoint = load_checkpoint(path, map_location=device, formats=(task_class.checkpoint_format,))
    with reading_checkpoint(path, values=True):
        trained_head = checkpoint["signature"]["head"]
    if trained_head != config.head.name:
        raise ValueError(f"{path} holds a {trained_head!r} head but the run config names {config.head.name!r}")
    task = task_class.load(config, device)
    task.check_checkpoint(checkpoint, path)
    task.check_fits(device)
    model, head = task.build(device)
    optimizer = build_optimizer(config, model, head)
    head.attach(optimizer)
    with reading_checkpoint(path):
        model.load_state_dict(checkpoint["model"])
        head.load_state_dict(checkpoint["head"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_state(checkpoint["rng"], device)
        progress_state = _progress_of(checkpoint)
        progress_state.cursor = task.restore(checkpoint["position"], device)
    check_loaded_parameters((model, head), path)
    if config.to_dict() != saved.to_dict():
        write_json(run_dir / CONFIG_FILE, config.to_dict())
    return _run(config, run_dir, task, model, head, optimizer, progress_state, device, progress, resumed=True)


def _progress_of(checkpoint: Mapping[str, Any]) -> _Progress:
    """Where a checkpoint's run stood: step, tokens, clock, epoch, best dev perplexity, open log interval."""
    position, log = checkpoint["position"], checkpoint["log"]
    return _Progress(
        step=int(checkpoint["step"]), tokens=int(checkpoint["tokens"]), elapsed_s=float(checkpoint["elapsed_s"]),
        epoch=int(position["epoch"]), best_ppl=checkpoint["best_ppl"], log_sum=float(log["sum"]),
        log_tokens=int(log["tokens"]), log_steps=int(log["steps"]), log_start_s=float(log["start_s"]),
    )


def _checkpoint(config: RunConfig, task: Task, model: nn.Module, head: Head, optimizer: torch.optim.Optimizer,
                signature: dict[str, Any], p: _Progress, log_sum: Tensor, device: torch.device) -> dict[str, Any]:
    check_finite_parameters((model, head), p.step)  # never save a diverged model over a good checkpoint
    return {
        "format": task.checkpoint_format,
        "model": model.state_dict(),
        "head": head.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": config.to_dict(),
        "vocab": task.vocab.to_dict(),
        "rng": rng_state(device),
        "position": {"epoch": p.epoch, **task.position(p.cursor)},
        "step": p.step,
        "tokens": p.tokens,
        "elapsed_s": p.elapsed_s,
        "best_ppl": p.best_ppl,
        "log": {"sum": float(log_sum), "tokens": p.log_tokens, "steps": p.log_steps, "start_s": p.log_start_s},
        "signature": {**signature, "K": getattr(head, "update_every", signature.get("K"))},  # K may be set at step 1
    }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _run(config: RunConfig, run_dir: Path, task: Task, model: nn.Module, head: Head,
         optimizer: torch.optim.Optimizer, p: _Progress, device: torch.device, progress: bool,
         resumed: bool) -> TrainResult:
    signature = run_signature(config, head, task.vocab, task.corpus_signature)
    params = unique_parameters(model, head)
    clip = config.optim.clip
    history = getattr(head, "history", None)  # re-assignment records of self-organising heads
    seen_history = len(history) if history is not None else 0
    clock = _Clock(p.elapsed_s, device)
    log_sum = torch.tensor(p.log_sum, dtype=torch.float64, device=device)
    last_eval: EvalResult | None = None
    last_eval_step = -1
    paths = {"run_dir": run_dir, "metrics": run_dir / METRICS_FILE, "last": run_dir / LAST, "best": run_dir / BEST,
             "config": run_dir / CONFIG_FILE}

    planned = config.epochs * task.tokens_per_epoch
    if config.max_tokens is not None:
        planned = min(planned, config.max_tokens)
    lines = task.startup_lines(model, head, device, planned, p.tokens) if progress else []
    bar = progress_bar(lines, planned, p.tokens, p.elapsed_s, config.time_budget, device, progress)

    def epoch_float() -> float:
        return p.epoch + p.cursor / task.epoch_length

    def base(kind: str) -> dict[str, Any]:
        return {"kind": kind, "step": p.step, "tokens": p.tokens, "elapsed_s": round(clock.now(), 3)}

    def budget_spent() -> str | None:
        if p.epoch >= config.epochs:
            return "done"
        if config.max_tokens is not None and p.tokens >= config.max_tokens:
            return "max_tokens"
        if config.time_budget is not None and clock.now() >= config.time_budget:
            return "time_budget"
        return None

    def write_train_record(log: MetricsLog, partial: bool = False) -> None:
        nll = log_sum.item() / p.log_tokens  # the sync of a log point
        seconds = clock.now() - p.log_start_s
        record = base("train")
        scores = (dict(nll_nats=nll, ppl=math.exp(min(nll, 700.0))) if head.loss_is_nll
                  else dict(objective=head.objective, loss=nll))  # a sampled objective has no perplexity
        record.update(epoch=round(epoch_float(), 4), **scores,
                      tokens_per_s=p.log_tokens / seconds if seconds > 0 else None,
                      lr=optimizer.param_groups[0]["lr"], interval_steps=p.log_steps)
        if partial:
            record["partial"] = True
        log.write(record)
        bar.set_postfix(loss=f"{nll:.3f}", ppl=f"{scores['ppl']:.1f}" if "ppl" in scores else "-", refresh=False)

    def reset_interval() -> None:
        log_sum.zero_()
        p.log_tokens = p.log_steps = 0
        p.log_start_s = clock.now()

    def save(name: str) -> None:
        save_checkpoint(run_dir / name, _checkpoint(config, task, model, head, optimizer, signature, p, log_sum,
                                                    device))

    def run_eval(log: MetricsLog) -> None:
        nonlocal last_eval, last_eval_step
        clock.pause()
        p.elapsed_s = clock.total
        result = evaluate(model, head, task)
        check_eval(result.nll_nats, p.step)
        record = base("eval")
        record.update(split="valid", epoch=round(epoch_float(), 4), nll_nats=result.nll_nats, ppl=result.ppl,
                      ppl_cluster=result.ppl_cluster, ppl_in_cluster=result.ppl_in_cluster,
                      eval_tokens=result.tokens, tokens_per_s=result.tokens_per_s)
        log.write(record)
        last_eval, last_eval_step = result, p.step
        if progress:
            write_line(f"step {p.step:,} | epoch {epoch_float():.2f} | valid ppl {result.ppl:.2f} | "
                       f"cluster ppl {_fmt(result.ppl_cluster)} | in-cluster ppl {_fmt(result.ppl_in_cluster)}",
                       guard)
        if p.best_ppl is None or result.ppl < p.best_ppl:
            p.best_ppl = result.ppl
            save(BEST)
        clock.start()

    def save_last() -> None:
        clock.pause()
        p.elapsed_s = clock.total
        save(LAST)
        clock.start()

    def log_reclusterings(log: MetricsLog) -> None:
        nonlocal seen_history
        if history is not None and len(history) > seen_history:
            for entry in history[seen_history:]:
                record = base("recluster")
                record.update({("head_step" if k == "step" else k): v for k, v in entry.items()})
                log.write(record)
            seen_history = len(history)

    stopped: str | None = None
    first_step = p.step
    with MetricsLog(run_dir, keep_until_step=p.step if resumed else None) as log, StopSignals() as guard:
        try:
            model.train()
            head.train()
            clock.start()
            stopped = budget_spent()
            while stopped is None:
                for batch, cursor in task.batches(p.epoch, p.cursor):
                    hidden, targets = task.hidden_states(model, batch)  # [*, d], [*]
                    loss = head(hidden, targets).loss
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    norm = clip_gradients(params, clip) if clip is not None else gradient_norm(params)
                    check_step(loss, norm, p.step + 1)  # before the update: the model stays the last good one
                    optimizer.step()  # a self-organising head may re-cluster here (its post-step hook)
                    n = targets.numel()
                    log_sum.add_(loss.detach().to(torch.float64) * n)
                    p.step += 1
                    p.tokens += n
                    p.log_tokens += n
                    p.log_steps += 1
                    p.cursor = cursor
                    bar.update(n)
                    log_reclusterings(log)
                    if p.step % config.log_every == 0:
                        write_train_record(log)
                        reset_interval()
                    epoch_done = p.cursor >= task.epoch_length
                    if epoch_done:
                        p.epoch, p.cursor = p.epoch + 1, 0
                        task.end_epoch()
                    if epoch_done or (config.eval_every and p.step % config.eval_every == 0):
                        run_eval(log)
                    if config.checkpoint_every and p.step % config.checkpoint_every == 0:
                        save_last()
                    stopped = "interrupted" if guard.requested else budget_spent()
                    if stopped is not None or epoch_done:
                        break
            clock.pause()
            if p.step > first_step:  # a session that took no step (its budget was already spent) writes nothing
                if stopped != "interrupted" and last_eval_step != p.step:
                    clock.start()
                    run_eval(log)
                    clock.pause()
                save_last()
                clock.pause()
                if p.log_steps:
                    write_train_record(log, partial=True)  # the checkpoint keeps the open interval for a resume
        finally:
            bar.close()
    p.elapsed_s = clock.total
    return TrainResult(run_dir=run_dir, stopped=stopped or "done", step=p.step, tokens=p.tokens,
                       elapsed_s=p.elapsed_s, epoch=epoch_float(), best_ppl=p.best_ppl, last_eval=last_eval,
                       signature={**signature, "K": getattr(head, "update_every", signature.get("K"))}, paths=paths,
                       stop_signal=guard.signum)
