"""One training session: the loop over batches, as an object whose steps are its methods.

:func:`sohsm.train.loop.train` and :func:`~sohsm.train.loop.resume_training` set a
session up (data, model, head, optimizer, the run directory and its lock);
:class:`TrainingLoop` trains until a budget is spent or a signal arrives, then
evaluates and writes ``last.pt``::

    while not should_stop():
        for batch in task.batches(epoch, cursor):
            train_step(batch); log_step()
            evaluate_dev() at an epoch's end and every eval_every steps (best.pt)
            checkpoint(last.pt) every checkpoint_every steps
            break where should_stop() or the epoch ended
    finish(): evaluate, last.pt, the open interval's record

With several processes every rank runs it: they take the same steps and stop at
the same one, and only rank 0 writes (a checkpoint's contents are gathered from
all ranks first).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sohsm.heads import Head, SelfOrganizingHead
from sohsm.train.builders import head_k, run_signature
from sohsm.train.checkpoint import BEST, CONFIG_FILE, LAST, METRICS_FILE
from sohsm.train.config import RunConfig
from sohsm.train.distributed import Ranks
from sohsm.train.evaluation import EvalResult, EvaluationStopped, evaluate
from sohsm.train.guard import DivergenceError, StopSignals, check_eval, check_finite_parameters, write_line
from sohsm.train.metrics import MetricsLog
from sohsm.train.progress import progress_bar
from sohsm.train.rescue import UnsavedCheckpoints
from sohsm.train.result import STOP_REASONS, RunDiverged, TrainResult, diverged_run  # noqa: F401  (re-exported)
from sohsm.train.rundir import rng_state
from sohsm.train.schedule import LearningRate, planned_steps
from sohsm.train.state import Clock, RunState
from sohsm.train.step import TrainStep
from sohsm.train.step_graph import StepGraph, host_rates, resolve_step_graph, step_graph_refusal
from sohsm.train.task import Task
from sohsm.train.threads import cpu_threads

#: dev evaluations an epoch when a config leaves ``eval_every`` unset
EVALS_PER_EPOCH = 4

class _NoRecords:
    """The records of ranks other than 0: none."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def __enter__(self) -> _NoRecords:
        return self

    def __exit__(self, *exc) -> None:
        pass


def planned_tokens(config: RunConfig, task: Task) -> int:
    """The tokens a run trains on: its ``epochs``, or ``max_tokens`` where fewer."""
    tokens = config.epochs * task.tokens_per_epoch
    return tokens if config.max_tokens is None else min(tokens, config.max_tokens)


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


class TrainingLoop:
    """One session of a run: :meth:`run` trains from ``state`` until a budget is spent or a stop is asked for.

    Each step of the loop is a method (:meth:`should_stop`, :meth:`train_step`, :meth:`log_step`,
    :meth:`evaluate_dev`, :meth:`checkpoint`); what they share is attributes, ``state`` above all
    (:class:`~sohsm.train.state.RunState`, what a checkpoint saves). Every rank runs it with its own
    share of the data (``task``) and the same model, head and optimizer state.

    Args:
        config, run_dir, task, model, head, optimizer, ranks: the run's parts (the optimizer over model and head).
        state: where the run stands: a new run's :class:`RunState` (step 0), or a checkpoint's (step 1 or more).
        scaler: the checkpoint's fp16 loss-scaler state.
        show_progress: a progress bar and a line per evaluation (rank 0 only).
    """

    def __init__(self, config: RunConfig, run_dir: Path, task: Task, model: nn.Module, head: Head,
                 optimizer: torch.optim.Optimizer, ranks: Ranks, state: RunState, *,
                 scaler: dict[str, Any] | None = None, show_progress: bool = True) -> None:
        self.config, self.run_dir, self.task, self.ranks = config, run_dir, task, ranks
        self.model, self.head, self.optimizer, self.device = model, head, optimizer, ranks.device
        self.state, self.first_step = state, state.step
        self.first_tokens, self.first_elapsed_s = state.tokens, state.elapsed_s
        self.show_progress = show_progress and ranks.is_writer
        self.signature = run_signature(config, head, task.vocab, task.corpus_signature)
        self.one_step = TrainStep(task, model, head, optimizer, ranks, config.optim.clip, amp=config.amp,
                                  compile=config.compile)  # forward, backward, clip, check, update
        self.one_step.precision.load_state_dict(scaler)
        #: the step captured as one CUDA graph (:mod:`sohsm.train.step_graph`), or ``None``: every step eager
        self.step_graph = None
        refusal = step_graph_refusal(config, head, optimizer, ranks, self.device,
                                     rows=task.tokens_per_step // max(ranks.world, 1), model=model)
        if resolve_step_graph(getattr(config, "step_graph", "off"), refusal):
            self.step_graph = StepGraph(self.one_step, task)
        else:
            host_rates(optimizer)  # a checkpoint of a graphed run keeps its rates as tensors
        self.clock = Clock(state.elapsed_s, self.device)
        #: the step of each checkpoint saved (``last.pt``, ``best.pt``), this session's or the one resumed from
        self.saved_steps: dict[str, int | None] = {LAST: state.step} if state.step else {}
        if state.step and (run_dir / BEST).is_file():
            self.saved_steps[BEST] = None  # (its step is in the file)
        self.compile_s, self.compile_tokens = 0.0, 0  # steps that compiled, left out of the clock (:meth:`train_step`)
        state.interval.loss_sum = state.interval.loss_sum.to(self.device)
        self.last_eval: EvalResult | None = None
        self.last_eval_step = -1
        self.history = head.history if isinstance(head, SelfOrganizingHead) else None  # re-assignment records
        self.history_logged = len(self.history) if self.history is not None else 0
        self.planned_tokens = planned_tokens(config, task)
        self.rate = LearningRate(config.optim, planned_steps(self.planned_tokens, task.tokens_per_epoch,
                                                             task.steps_per_epoch, task.tokens_per_step))
        # ``None``: a few dev points an epoch, whatever its length (a curve to plot from the first epoch on)
        self.eval_every = (config.eval_every if config.eval_every is not None
                           else max(1, task.steps_per_epoch // EVALS_PER_EPOCH))
        self.bar: Any = None  # the progress bar, the records and the stop signals, while :meth:`run` runs
        self.records: MetricsLog | _NoRecords | None = None
        self.signals: StopSignals | None = None
        #: what the start line says of the CPU threads (:func:`~sohsm.train.threads.cpu_threads`)
        self.threads: str | None = None
        #: the checkpoints the run directory would not take (a folder made read-only mid-run), kept in memory
        self.unsaved = UnsavedCheckpoints(run_dir)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train until a budget is spent or a stop is asked for; evaluate, save ``last.pt``, return."""
        self.bar = self._progress_bar()
        resumed_at = self.first_step or None  # the checkpoint's step (a new run's is 0): records past it are dropped
        records = MetricsLog(self.run_dir, keep_until_step=resumed_at) if self.ranks.is_writer else _NoRecords()
        grace_s = 2.0 if self.ranks.world > 1 else 0.0  # torchrun passes a Ctrl-C on to workers that got it already
        with records as self.records, StopSignals(grace_s) as self.signals:
            try:
                stopped = self.train()
                self.finish(stopped)
            except DivergenceError as error:
                raise self.diverged(error) from None
            finally:
                self.bar.close()
                if self.step_graph is not None:  # its pool freed now, not whenever the session is collected
                    self.step_graph.release()
        rescued = self.unsaved.rescue() if self.ranks.is_writer else None
        if rescued is not None:
            self.run_dir = rescued
        return self.result(stopped)

    def train(self) -> str:
        """Steps until :meth:`should_stop` says why to stop (one of :data:`STOP_REASONS`), which it returns."""
        self.model.train()
        self.head.train()
        self.clock.start()
        stopped = self.should_stop()
        while stopped is None:
            self.set_rate()
            for batch, cursor, mark in self._marked(self.task.batches(self.state.epoch, self.state.cursor)):
                self.train_step(batch, cursor, mark)
                self.log_step()
                epoch_done = self.state.cursor >= self.task.epoch_length
                if epoch_done:
                    self.end_epoch()
                if epoch_done or self.due(self.eval_every):
                    self.evaluate_dev()
                if self.due(self.config.checkpoint_every):
                    self.checkpoint(LAST)
                stopped = self.should_stop()
                if stopped is not None or epoch_done:
                    break
        self.clock.pause()
        return stopped

    def finish(self, stopped: str) -> None:
        """After the last step: evaluate (unless interrupted or just done), save ``last.pt``, and record the open
        interval as ``partial`` (``last.pt`` keeps it for a resume). A session that took no step writes nothing."""
        if self.state.step == self.first_step:
            return
        if stopped != "interrupted" and self.last_eval_step != self.state.step:
            self.evaluate_dev()
        self.checkpoint(LAST)
        if self.state.interval.steps:
            self.write_train_record(partial=True)

    # -- its steps ------------------------------------------------------------------------------
    def should_stop(self) -> str | None:
        """Why to stop now, the same on every rank (a signal or the clock on one rank stops all); ``None``: go on."""
        config, state = self.config, self.state
        assert self.signals is not None  # set while :meth:`run` runs
        requested, out_of_time = self.ranks.any(
            self.signals.requested, config.time_budget is not None and self.clock.now() >= config.time_budget)
        if requested:
            return "interrupted"
        if state.epoch >= config.epochs:
            return "done"
        if config.max_tokens is not None and state.tokens >= config.max_tokens:
            return "max_tokens"
        if out_of_time:
            return "time_budget"
        return None

    def compilations(self) -> int:
        """Compilations so far in this process that a step can cause: ``torch.compile``'s (with ``--compile``) and
        the task's own (:meth:`~sohsm.train.task.Task.compilations`: word2vec's Numba loops)."""
        return (compile_count() if self.config.compile else 0) + self.task.compilations()

    def _marked(self, batches: Iterator[tuple[Any, int]]) -> Iterator[tuple[Any, int, tuple[int, float]]]:
        """``batches`` with, for each, :meth:`compilations` and the time before it was made: a step that compiles
        in making its batch (word2vec's windows) is a step that compiled."""
        batches = iter(batches)
        while True:
            mark = (self.compilations(), time.perf_counter())
            try:
                batch, cursor = next(batches)
            except StopIteration:
                return
            yield batch, cursor, mark

    def train_step(self, batch: Any, cursor: int, mark: tuple[int, float] | None = None) -> None:
        """Train on ``batch`` (a self-organizing head may re-cluster in the update) and count it; ``cursor``:
        where the epoch stands after it; ``mark``: :meth:`compilations` and the time before the batch was made
        (default: now). A step that compiled (its batch, or its training) is left out of the training time, its
        seconds and tokens counted apart (:attr:`compile_s`)."""
        if self.rate.moves_every_step or self._warming_up_again():
            self.set_rate()
        run = self.step_graph or self.one_step
        compiles, started = mark or (self.compilations(), time.perf_counter())
        result = run(batch, self.state.step + 1)  # all ranks' loss and targets
        if self.compilations() != compiles:  # something compiled in it: not training time
            seconds = time.perf_counter() - started
            self.clock.leave_out(seconds)
            self.bar.leave_out(result.tokens)
            self.compile_s += seconds
            self.compile_tokens += result.tokens
        self.state.interval.add(result.loss_sum, result.tokens)
        self.state.step += 1
        self.state.tokens += result.tokens
        self.state.cursor = cursor
        self.bar.update(result.tokens)

    def log_step(self) -> None:
        """After a step: the loss beside the bar now and then, re-clusterings, a train record every ``log_every``."""
        state = self.state
        if self.bar.wants_loss(state.step - self.first_step) and state.interval.tokens:  # a loss between records
            self.bar.show_loss(state.interval.mean_loss(), self.head.loss_is_nll, record=False)
        self.log_reclusterings()
        if state.step % self.config.log_every == 0:
            self.write_train_record()
            state.interval.restart(self.clock.now())

    def end_epoch(self) -> None:
        self.state.epoch, self.state.cursor = self.state.epoch + 1, 0
        self.task.end_epoch()

    def evaluate_dev(self) -> None:
        """Score the dev data (the clock paused), record it; save ``best.pt`` if it is the best so far, else anneal
        the rate (``optim.anneal``). With one process a stop signal abandons it (several sum it together)."""
        self.one_step.raise_if_diverged()
        with self.clock.paused():
            signals = self.signals
            assert signals is not None  # set while :meth:`run` runs
            should_stop = (lambda: signals.requested) if self.ranks.world == 1 else None
            try:
                result = evaluate(self.model, self.head, self.task, sum_over=self.ranks.sum_, should_stop=should_stop)
            except EvaluationStopped:
                return
            check_eval(result.nll_nats, self.state.step)
            self.write_eval_record(result)
            if self.state.best_ppl is None or result.ppl < self.state.best_ppl:
                self.state.best_ppl = result.ppl
                self.checkpoint(BEST)
            elif self.config.optim.anneal > 1:  # the dev perplexity stalled: a smaller step from here on
                self.state.lr_scale /= self.config.optim.anneal
                self.set_rate()

    def checkpoint(self, name: str) -> None:
        """Save ``name`` (``last.pt``, ``best.pt``) with the clock paused: every rank makes it, rank 0 writes it."""
        with self.clock.paused():
            self.one_step.raise_if_diverged()
            self.state.elapsed_s = self.clock.total
            contents = self.checkpoint_contents()
            if name == BEST:  # read to evaluate, decode and inspect; a resume reads last.pt
                del contents["optimizer"]
            if self.ranks.is_writer:
                self.unsaved.save(name, contents)
            self.saved_steps[name] = self.state.step

    def diverged(self, error: DivergenceError) -> RunDiverged:
        """``error`` with what the run directory still holds and what to change (:func:`diverged_run`)."""
        return diverged_run(error, self.config, self.saved_steps)

    def _warming_up_again(self) -> bool:
        """Whether the rate still climbs after a restart of the optimizer's state (one more step sets the full)."""
        restarted = self.state.restarted_at
        return restarted is not None and self.rate.at(0, self.state.step - 1, 1.0, restarted) < self.rate.at(
            0, self.state.step - 1, 1.0)

    def set_rate(self) -> None:
        rate = self.rate.at(self.state.epoch, self.state.step, self.state.lr_scale, self.state.restarted_at)
        if self.step_graph is not None:  # a replay reads the rate on the device, until the graph is given up
            self.step_graph.set_rate(rate)
            return
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):  # a captured step reads it there (one fill, no read)
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate

    # -- what they write ------------------------------------------------------------------------
    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A ``metrics.jsonl`` record: its kind, where the run stands, then ``fields``."""
        state = self.state
        return {"kind": kind, "step": state.step, "tokens": state.tokens, "elapsed_s": round(self.clock.now(), 3),
                **fields}

    def write_train_record(self, partial: bool = False) -> None:
        """The open interval's mean loss and speed (one device read), also shown beside the bar."""
        self.one_step.raise_if_diverged()  # the divergence flag is read where the loop reads values anyway
        interval = self.state.interval
        nll = interval.mean_loss()
        seconds = self.clock.now() - interval.start_s
        scores = (dict(nll_nats=nll, ppl=math.exp(min(nll, 700.0))) if self.head.loss_is_nll
                  else dict(objective=self.head.objective, loss=nll))  # a sampled objective has no perplexity
        record = self.record("train", epoch=round(self.state.epoch_float(self.task.epoch_length), 4), **scores,
                             tokens_per_s=interval.tokens / seconds if seconds > 0 else None,
                             lr=float(self.optimizer.param_groups[0]["lr"]), interval_steps=interval.steps)
        if partial:
            record["partial"] = True
        assert self.records is not None  # set while :meth:`run` runs
        self.records.write(record)
        self.bar.show_loss(nll, self.head.loss_is_nll)

    def write_eval_record(self, result: EvalResult) -> None:
        """A dev evaluation's record, and its line above the bar."""
        epoch = self.state.epoch_float(self.task.epoch_length)
        assert self.records is not None and self.signals is not None  # set while :meth:`run` runs
        self.records.write(self.record(
            "eval", split="valid", epoch=round(epoch, 4), nll_nats=result.nll_nats, ppl=result.ppl,
            ppl_cluster=result.ppl_cluster, ppl_in_cluster=result.ppl_in_cluster, eval_tokens=result.tokens,
            tokens_per_s=result.tokens_per_s, **self.task.eval_record_fields(result)))
        self.last_eval, self.last_eval_step = result, self.state.step
        if self.show_progress:
            parts = ("" if result.ppl_cluster is None else  # a head without clusters has no parts to show
                     f" | cluster ppl {_fmt(result.ppl_cluster)} | in-cluster ppl {_fmt(result.ppl_in_cluster)}")
            write_line(f"step {self.state.step:,} | epoch {epoch:.2f} | valid ppl {result.ppl:.2f}{parts}",
                       self.signals)

    def log_reclusterings(self) -> None:
        """A record for each re-clustering of a self-organizing head since the last step."""
        if self.history is None or len(self.history) == self.history_logged:
            return
        assert self.records is not None  # set while :meth:`run` runs
        for entry in self.history[self.history_logged:]:
            self.records.write(self.record("recluster", **{("head_step" if k == "step" else k): v
                                                           for k, v in entry.items()}))
        self.history_logged = len(self.history)

    def checkpoint_contents(self) -> dict[str, Any]:
        """The checkpoint dict, made on every rank (the ranks' random states are gathered; a task's
        :meth:`~sohsm.train.task.Task.position` gathers what the ranks carry)."""
        state = self.state
        check_finite_parameters((self.model, self.head), state.step)  # never save a diverged model over a good one
        position = {"epoch": state.epoch, **self.task.position(state.cursor)}
        rngs = self.ranks.gather_objects(rng_state(self.device))
        extra: dict[str, Any] = {"world_size": self.ranks.world, "rng_ranks": rngs} if self.ranks.world > 1 else {}
        scaler = self.one_step.precision.state_dict()
        if scaler is not None:
            extra["scaler"] = scaler
        return {**extra, "format": self.task.checkpoint_format, "model": self.model.state_dict(),
                "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                "config": self.config.to_dict(), "vocab": self.task.vocab.to_dict(), "rng": rngs[0],
                "position": position, **state.to_checkpoint(), "signature": self._signature()}

    # -- around the loop ------------------------------------------------------------------------
    def _signature(self) -> dict[str, Any]:
        return {**self.signature, "K": head_k(self.head, self.signature.get("K"))}  # K may be set at step 1

    def _progress_bar(self):
        """Print the task's start-up lines and return the session's progress bar (disabled where not shown)."""
        state, task = self.state, self.task
        lines = (task.startup_lines(self.model, self.head, self.device, self.planned_tokens, state.tokens)
                 if self.show_progress else [])
        if lines and self.threads:  # after the memory, which follows the device
            lines[0] += " | " + self.threads
        speed = [f"{self.config.amp} autocast (--amp)"] if self.config.amp else []
        speed += ["compiled (--compile; compiling is not counted as training time)"] if self.config.compile else []
        if lines and speed:  # after the device, which ends the first line
            lines[0] += " | " + ", ".join(speed)
        if self.show_progress and self.ranks.world > 1:
            lines.append(f"processes  {self.ranks.world} ({torch.distributed.get_backend()}), each on "
                         f"1/{self.ranks.world} of every batch; this one (rank 0) writes")
        return progress_bar(lines, self.planned_tokens, state.tokens, state.elapsed_s, self.config.time_budget,
                            self.device, self.show_progress, clock=self.clock.now, unit=task.unit)

    def due(self, every: int | None) -> bool:
        """Whether the step just taken is one of every ``every`` (0 or ``None``: never)."""
        if not every:
            return False
        return self.state.step % every == 0

    def result(self, stopped: str) -> TrainResult:
        state, run_dir = self.state, self.run_dir
        assert self.signals is not None  # set by :meth:`run`
        state.elapsed_s = self.clock.total
        paths = {"run_dir": run_dir, "metrics": run_dir / METRICS_FILE, "last": run_dir / LAST,
                 "best": run_dir / BEST, "config": run_dir / CONFIG_FILE}
        return TrainResult(run_dir=run_dir, stopped=stopped, step=state.step, tokens=state.tokens,
                           elapsed_s=state.elapsed_s, epoch=state.epoch_float(self.task.epoch_length),
                           best_ppl=state.best_ppl, last_eval=self.last_eval, signature=self._signature(), paths=paths,
                           stop_signal=self.signals.signum, writer=self.ranks.is_writer,
                           session_tokens=state.tokens - self.first_tokens,
                           session_s=state.elapsed_s - self.first_elapsed_s, compile_s=self.compile_s,
                           compile_tokens=self.compile_tokens,
                           compiled="--compile" if self.config.compile else self.task.compiles)


def compile_count() -> int:
    """How many frames :func:`torch.compile` has compiled in this process (its counters, read on the host): a
    step that changes it compiled (the first, a recompilation)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def run_session(config: RunConfig, run_dir: Path, task: Task, model: nn.Module, head: Head,
                optimizer: torch.optim.Optimizer, ranks: Ranks, state: RunState, *,
                scaler: dict[str, Any] | None = None, show_progress: bool = True) -> TrainResult:
    """Train one session from ``state`` (:class:`TrainingLoop`); the one call :mod:`sohsm.train.loop` makes."""
    with cpu_threads(getattr(config, "threads", None), ranks.device, ranks.world) as threads:
        loop = TrainingLoop(config, run_dir, task, model, head, optimizer, ranks, state, scaler=scaler,
                            show_progress=show_progress)
        loop.threads = threads
        return loop.run()
