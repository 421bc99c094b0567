"""One training session: the loop over batches with its records, evaluations and checkpoints.

:func:`sohsm.train.loop.train` and :func:`~sohsm.train.loop.resume_training` set a
session up (data, model, head, optimizer, the run directory and its lock);
:func:`run_session` trains until a budget is spent or a signal arrives, then
evaluates and writes ``last.pt``. With several processes every rank runs it:
they take the same steps and stop at the same one, and only rank 0 writes
(the checkpoint's contents are gathered from all ranks first).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from sohsm.heads import Head, SelfOrganizingHead
from sohsm.train.builders import head_k, run_signature
from sohsm.train.checkpoint import BEST, CONFIG_FILE, LAST, METRICS_FILE, save_checkpoint
from sohsm.train.config import RunConfig
from sohsm.train.distributed import Ranks
from sohsm.train.evaluation import EvalResult, EvaluationStopped, evaluate
from sohsm.train.guard import StopSignals, check_eval, check_finite_parameters, write_line
from sohsm.train.metrics import MetricsLog
from sohsm.train.progress import progress_bar
from sohsm.train.rundir import rng_state
from sohsm.train.schedule import planned_steps, schedule_factor
from sohsm.train.step import TrainStep
from sohsm.train.task import Task

#: dev evaluations an epoch when a config leaves ``eval_every`` unset
EVALS_PER_EPOCH = 4

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


@dataclass
class Progress:
    """Everything about where training is, saved in every checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    epoch: int = 0
    cursor: int = 0  # where the epoch stands, in the task's units (a BPTT row, a batch)
    best_ppl: float | None = None
    lr_scale: float = 1.0  # what annealing (``optim.anneal``) has left of the learning rate
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


def progress_of(checkpoint: Mapping[str, Any]) -> Progress:
    """Where a checkpoint's run stood: step, tokens, clock, epoch, best dev perplexity, open log interval."""
    position, log = checkpoint["position"], checkpoint["log"]
    return Progress(
        step=int(checkpoint["step"]), tokens=int(checkpoint["tokens"]), elapsed_s=float(checkpoint["elapsed_s"]),
        epoch=int(position["epoch"]), best_ppl=checkpoint["best_ppl"], log_sum=float(log["sum"]),
        log_tokens=int(log["tokens"]), log_steps=int(log["steps"]), log_start_s=float(log["start_s"]),
        lr_scale=float(checkpoint.get("lr_scale", 1.0)),
    )


def _checkpoint(config: RunConfig, task: Task, model: nn.Module, head: Head, optimizer: torch.optim.Optimizer,
                signature: dict[str, Any], p: Progress, log_sum: Tensor, device: torch.device, ranks: Ranks,
                scaler: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint dict, made on every rank (the ranks' LSTM states and random states are gathered)."""
    check_finite_parameters((model, head), p.step)  # never save a diverged model over a good checkpoint
    position = {"epoch": p.epoch, **task.position(p.cursor)}
    rngs = ranks.gather_objects(rng_state(device))
    extra = {"world_size": ranks.world, "rng_ranks": rngs} if ranks.world > 1 else {}
    if scaler is not None:
        extra["scaler"] = scaler
    return {
        **extra,
        "format": task.checkpoint_format,
        "model": model.state_dict(),
        "head": head.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": config.to_dict(),
        "vocab": task.vocab.to_dict(),
        "rng": rngs[0],
        "position": position,
        "step": p.step,
        "tokens": p.tokens,
        "elapsed_s": p.elapsed_s,
        "best_ppl": p.best_ppl,
        "lr_scale": p.lr_scale,
        "log": {"sum": float(log_sum), "tokens": p.log_tokens, "steps": p.log_steps, "start_s": p.log_start_s},
        "signature": {**signature, "K": head_k(head, signature.get("K"))},  # K may be set at step 1
    }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


class _NoLog:
    """The records of ranks other than 0: none."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def __enter__(self) -> _NoLog:
        return self

    def __exit__(self, *exc) -> None:
        pass


def run_session(config: RunConfig, run_dir: Path, task: Task, model: nn.Module, head: Head,
                optimizer: torch.optim.Optimizer, p: Progress, device: torch.device, progress: bool,
                resumed: bool, ranks: Ranks, scaler: dict[str, Any] | None = None) -> TrainResult:
    """Train from ``p`` until a budget is spent or a stop is asked for; evaluate, save ``last.pt``, return.

    Every rank calls it with its own share of the data (``task``) and the same
    model, head and optimizer state; ``scaler``: a checkpoint's fp16 loss-scaler state.
    """
    signature = run_signature(config, head, task.vocab, task.corpus_signature)
    step = TrainStep(task, model, head, optimizer, ranks, config.optim.clip, amp=config.amp,
                     compile=config.compile)
    step.precision.load_state_dict(scaler)
    progress = progress and ranks.is_writer
    history = head.history if isinstance(head, SelfOrganizingHead) else None  # re-assignment records
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
    if progress and ranks.world > 1:
        lines.append(f"processes  {ranks.world} ({torch.distributed.get_backend()}), each on 1/{ranks.world} of "
                     "every batch; this one (rank 0) writes")
    bar = progress_bar(lines, planned, p.tokens, p.elapsed_s, config.time_budget, device, progress, clock=clock.now,
                       unit=task.unit)
    # a warm-up or a cosine moves the rate every step, over the steps the budget plans
    optim = config.optim
    rate_moves = optim.warmup > 0 or optim.lr_schedule != "constant"
    total_steps = planned_steps(planned, task.tokens_per_epoch, task.steps_per_epoch, task.tokens_per_step)

    # ``None``: a few dev points an epoch, whatever its length (a curve to plot from the first epoch on)
    eval_every = (config.eval_every if config.eval_every is not None
                  else max(1, task.steps_per_epoch // EVALS_PER_EPOCH))

    def epoch_float() -> float:
        return p.epoch + p.cursor / task.epoch_length

    def base(kind: str) -> dict[str, Any]:
        return {"kind": kind, "step": p.step, "tokens": p.tokens, "elapsed_s": round(clock.now(), 3)}

    def budget_spent(guard: StopSignals) -> str | None:
        """Why to stop now, the same on every rank (a signal or the clock on one rank stops all)."""
        requested, out_of_time = ranks.any(guard.requested,
                                           config.time_budget is not None and clock.now() >= config.time_budget)
        if requested:
            return "interrupted"
        if p.epoch >= config.epochs:
            return "done"
        if config.max_tokens is not None and p.tokens >= config.max_tokens:
            return "max_tokens"
        if out_of_time:
            return "time_budget"
        return None

    def write_train_record(log: MetricsLog, partial: bool = False) -> None:
        step.raise_if_diverged()  # the divergence flag is read where the loop reads values anyway
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
        bar.show_loss(nll, head.loss_is_nll)

    def reset_interval() -> None:
        log_sum.zero_()
        p.log_tokens = p.log_steps = 0
        p.log_start_s = clock.now()

    def save(name: str) -> None:
        step.raise_if_diverged()
        checkpoint = _checkpoint(config, task, model, head, optimizer, signature, p, log_sum, device, ranks,
                                 step.precision.state_dict())
        if ranks.is_writer:
            save_checkpoint(run_dir / name, checkpoint)

    def run_eval(log: MetricsLog) -> None:
        nonlocal last_eval, last_eval_step
        step.raise_if_diverged()
        clock.pause()
        p.elapsed_s = clock.total
        # a stop signal abandons the evaluation (one process; several must finish the collective sum together)
        should_stop = (lambda: guard.requested) if ranks.world == 1 else None
        try:
            result = evaluate(model, head, task, sum_over=ranks.sum_, should_stop=should_stop)  # each rank: its share
        except EvaluationStopped:
            clock.start()
            return
        check_eval(result.nll_nats, p.step)
        record = base("eval")
        record.update(split="valid", epoch=round(epoch_float(), 4), nll_nats=result.nll_nats, ppl=result.ppl,
                      ppl_cluster=result.ppl_cluster, ppl_in_cluster=result.ppl_in_cluster,
                      eval_tokens=result.tokens, tokens_per_s=result.tokens_per_s)
        log.write(record)
        last_eval, last_eval_step = result, p.step
        if progress:
            parts = ("" if result.ppl_cluster is None else  # a head without clusters has no parts to show
                     f" | cluster ppl {_fmt(result.ppl_cluster)} | in-cluster ppl {_fmt(result.ppl_in_cluster)}")
            write_line(f"step {p.step:,} | epoch {epoch_float():.2f} | valid ppl {result.ppl:.2f}{parts}", guard)
        if p.best_ppl is None or result.ppl < p.best_ppl:
            p.best_ppl = result.ppl
            save(BEST)
        elif config.optim.anneal > 1:  # the dev perplexity stalled: a smaller step from here on
            p.lr_scale /= config.optim.anneal
            set_rate()
        clock.start()

    def set_rate() -> None:
        rate = optim.rate_in_epoch(p.epoch) * p.lr_scale
        if rate_moves:
            rate *= schedule_factor(optim.lr_schedule, p.step, optim.warmup, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = rate

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
    log_file = MetricsLog(run_dir, keep_until_step=p.step if resumed else None) if ranks.is_writer else _NoLog()
    grace_s = 2.0 if ranks.world > 1 else 0.0  # torchrun passes a Ctrl-C on to workers that got it already
    with log_file as log, StopSignals(grace_s) as guard:
        try:
            model.train()
            head.train()
            clock.start()
            stopped = budget_spent(guard)
            while stopped is None:
                set_rate()
                for batch, cursor in task.batches(p.epoch, p.cursor):
                    if rate_moves:
                        set_rate()
                    # forward, backward, clip, check, update; a self-organising head may re-cluster in the update
                    result = step(batch, p.step + 1)
                    n = result.tokens  # all ranks' targets
                    log_sum.add_(result.loss_sum)
                    p.step += 1
                    p.tokens += n
                    p.log_tokens += n
                    p.log_steps += 1
                    p.cursor = cursor
                    bar.update(n)
                    if bar.wants_loss(p.step - first_step) and p.log_tokens:  # a loss between records
                        bar.show_loss(log_sum.item() / p.log_tokens, head.loss_is_nll, record=False)
                    log_reclusterings(log)
                    if p.step % config.log_every == 0:
                        write_train_record(log)
                        reset_interval()
                    epoch_done = p.cursor >= task.epoch_length
                    if epoch_done:
                        p.epoch, p.cursor = p.epoch + 1, 0
                        task.end_epoch()
                    if epoch_done or (eval_every and p.step % eval_every == 0):
                        run_eval(log)
                    if config.checkpoint_every and p.step % config.checkpoint_every == 0:
                        save_last()
                    stopped = budget_spent(guard)
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
                       signature={**signature, "K": head_k(head, signature.get("K"))}, paths=paths,
                       stop_signal=guard.signum, writer=ranks.is_writer)
