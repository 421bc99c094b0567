"""Several heads trained under identical settings, one run directory each, resumable run by run.

A comparison is a list of :class:`PlannedRun`: a directory name under ``OUT``
and the complete :class:`~sohsm.tasks.lm.LMConfig` of that run, which
differ between runs only in ``head``. :func:`plan_comparison` checks every
run before anything is written and says what each needs::

    OUT/<name>  absent, or no run in it           -> "new":     train(config, OUT/<name>)
                a run whose budget is not spent   -> "partial": resume_training(OUT/<name>, config)
                a run whose budget is spent       -> "done":    skipped

A run directory made by ``sohsm lm train --run-dir OUT/<name>`` with the same
settings is accepted as that run; one with other settings is refused, naming
what differs. :func:`run_comparison` then trains or resumes each run in turn
(the budgets, logging intervals and device of the comparison apply to every
run, also to a resumed one); :func:`sohsm.runs.results.write_comparison_report`
then writes the report from the run directories.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sohsm.fields import FieldError
from sohsm.head_catalogue import REFERENCE_HEAD
from sohsm.tasks.lm import LMConfig, build_model_and_head, load_lm_corpus, normalise_corpus, normalise_tokenizer
from sohsm.tasks.lm.config import with_vocabulary_options
from sohsm.train.builders import resolve_device
from sohsm.train.checkpoint import CONFIG_FILE, LAST, write_json
from sohsm.train.config import config_differences
from sohsm.train.loop import TrainResult, resume_training, train
from sohsm.train.rundir import check_writable, holds_run, read_config, read_progress, spent_budgets

#: the file of a comparison's folder that lists its runs and the command that trained them
COMPARISON_FILE = "compare.json"

#: what a planned run needs
STATUSES = ("new", "partial", "done")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison.

    Attributes:
        name: its directory under the comparison's folder (``full``, ``self_organized-k20``, ...).
        config: the run's complete configuration (as ``sohsm lm train`` builds it from its options).
    """

    name: str
    config: LMConfig


@dataclass(frozen=True)
class RunPlan:
    """What a planned run needs.

    Attributes:
        run: the planned run, with ``data.corpus`` as a run directory stores it.
        path: its run directory.
        status: ``"new"``, ``"partial"`` (resume) or ``"done"`` (skip), see :data:`STATUSES`.
        tokens: training tokens of the run so far (0 for a new one).
    """

    run: PlannedRun
    path: Path
    status: str
    tokens: int = 0

    @property
    def overrides(self) -> dict[str, Any]:
        """Every field of the run's config, as :func:`resume_training` takes them."""
        return self.run.config.flat()


@dataclass
class ComparisonResult:
    """What :func:`run_comparison` did: the session result of each run it trained (``None`` when skipped)."""

    plans: list[RunPlan]
    results: list[TrainResult | None] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return any(r is not None and r.stopped == "interrupted" for r in self.results)


# -- planning ---------------------------------------------------------------------------------
def plan_comparison(out: str | os.PathLike[str], runs: Sequence[PlannedRun]) -> list[RunPlan]:
    """Check every run of a comparison and say what each needs; writes nothing.

    A new run's head is built once on the corpus (on the CPU), so that an option
    the head refuses fails here, before any run starts.

    Raises:
        ValueError: a bad or repeated run name, runs that differ in more than their
            head, a config value or head option the run refuses, an existing run directory with other settings or
            without
            a checkpoint, or an unwritable folder.
        sohsm.data.DataError: the corpus is unknown, missing or corrupt.
    """
    out = Path(out)
    if not runs:
        raise ValueError("a comparison needs at least one run")
    seen: set[str] = set()
    for run in runs:
        if not _NAME.fullmatch(run.name):
            raise ValueError(f"run name {run.name!r} must be letters, digits, '_', '.' or '-'")
        if run.name in seen:
            raise ValueError(f"run name {run.name!r} appears twice in the comparison")
        seen.add(run.name)
    _check_same_settings(runs)
    corpora: dict[tuple, Any] = {}
    completed = [_completed(_normalised(run), corpora) for run in runs]
    _check_distinct(completed)
    plans = [_plan(out / run.name, run) for run in completed]
    _check_new_runs_build([p.run for p in plans if p.status == "new"], corpora)
    return plans


#: settings that belong to the head although they live elsewhere: whether its word vectors are the embedding
HEAD_BOUND = frozenset({"model.tie_weights"})


def _check_same_settings(runs: Sequence[PlannedRun]) -> None:
    """Refuse runs whose configs differ in anything but the head (and :data:`HEAD_BOUND`): the comparison would
    not be like for like."""
    first = {k: v for k, v in runs[0].config.flat().items() if not k.startswith("head.")}
    for run in runs[1:]:
        for key, value in run.config.flat().items():
            if not key.startswith("head.") and key not in HEAD_BOUND and value != first[key]:
                raise ValueError(f"run {run.name} differs from run {runs[0].name} in {key} ({value!r} against "
                                 f"{first[key]!r}); the runs of a comparison differ only in their head")


def _check_distinct(runs: Sequence[PlannedRun]) -> None:
    """Refuse two runs with one config (a variant without options of its own, or with its head's defaults):
    the second would train the first again."""
    seen: dict[str, str] = {}
    for run in runs:
        key = json.dumps(run.config.flat(), sort_keys=True, default=str)
        if key in seen:
            raise ValueError(f"run {run.name} would train the same run as {seen[key]} (the same head with the same "
                             "options): give a variant options of its own (NAME:HEAD:KEY=VALUE,...)")
        seen[key] = run.name


def _normalised(run: PlannedRun) -> PlannedRun:
    config = LMConfig.from_dict(run.config.to_dict())
    config.data.corpus = normalise_corpus(config.data.corpus)
    if config.data.tokenizer is not None:
        config.data.tokenizer = normalise_tokenizer(config.data.tokenizer)
    return PlannedRun(run.name, config)


def _corpus(config: LMConfig, corpora: dict[tuple, Any]):
    """The run's corpus, read once for every run of the comparison that reads the same."""
    d = config.data
    key = (d.corpus, d.data_dir, d.min_count, d.max_size, d.cache_dir, d.text_mode, d.tokenizer)
    if key not in corpora:
        corpora[key] = load_lm_corpus(config)
    return corpora[key]


def _completed(run: PlannedRun, corpora: dict[tuple, Any]) -> PlannedRun:
    """The run (checked) with the head options its vocabulary settles (:func:`with_vocabulary_options`), as ``lm
    train`` would write them: a folder is compared with, and trained from, that."""
    run.config.validate()
    vocab = _corpus(run.config, corpora).vocab
    config, _ = with_vocabulary_options(run.config, len(vocab), vocab.unseen)
    return PlannedRun(run.name, config)


def _plan(path: Path, run: PlannedRun) -> RunPlan:
    if not holds_run(path):
        check_writable(path)
        return RunPlan(run, path, "new")
    if not (path / CONFIG_FILE).is_file() or not (path / LAST).is_file():
        raise ValueError(f"{path} holds a run without a checkpoint ({LAST}) yet: it is still starting, or it "
                         "stopped before its first checkpoint; delete it to train it again")
    differences = config_differences(read_config(path / CONFIG_FILE)[1], run.config.flat())
    if differences:
        raise FieldError.joined(f"{path} holds a run with other settings than this comparison: ", differences)
    progress = read_progress(path / LAST)
    return RunPlan(run, path, "done" if spent_budgets(run.config, progress) else "partial", progress["tokens"])


def _check_new_runs_build(runs: Sequence[PlannedRun], corpora: dict[tuple, Any]) -> None:
    """Build each new run's model and head on the CPU, so that refused options fail before training starts."""
    for run in runs:
        config = run.config
        resolve_device(config.device)
        try:
            with torch.random.fork_rng(devices=[]):
                build_model_and_head(config, _corpus(config, corpora).vocab, "cpu")
        except ValueError as error:
            raise ValueError(f"run {run.name}: {error}") from None


# -- running ----------------------------------------------------------------------------------
def run_comparison(plans: Sequence[RunPlan], *, progress: bool = True,
                   announce: Callable[[int, RunPlan], None] | None = None) -> ComparisonResult:
    """Train the new runs, resume the partial ones, skip the done ones, in order; stop at an interruption.

    Args:
        plans: from :func:`plan_comparison`.
        progress: progress bars and evaluation lines of each run (as in :func:`~sohsm.train.train`).
        announce: called as ``announce(index, plan)`` before each run that trains.
    """
    outcome = ComparisonResult(list(plans))
    for index, plan in enumerate(plans):
        if plan.status == "done":
            outcome.results.append(None)
            continue
        if announce is not None:
            announce(index, plan)
        if plan.status == "new":
            result = train(plan.run.config, plan.path, progress=progress)
        else:
            result = resume_training(plan.path, plan.overrides, progress=progress)
        outcome.results.append(result)
        if result.stopped == "interrupted":
            break
    return outcome


def save_comparison(out: str | os.PathLike[str], plans: Sequence[RunPlan], command: str) -> Path:
    """Write ``compare.json`` (the command and the runs, in order), which a report rewritten later reads."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"command": command,
            "runs": [{"name": p.run.name, "head": p.run.config.head.name} for p in plans]}
    write_json(out / COMPARISON_FILE, data)
    return out / COMPARISON_FILE


def load_comparison(out: str | os.PathLike[str]) -> tuple[str | None, list[Path]]:
    """The command and run directories of a comparison folder.

    From ``compare.json`` when there is one; otherwise every sub-folder holding
    a run, the full softmax's (:data:`~sohsm.head_catalogue.REFERENCE_HEAD`) first, then by name.
    """
    out = Path(out)
    if (out / COMPARISON_FILE).is_file():
        data = json.loads((out / COMPARISON_FILE).read_text(encoding="utf-8"))
        return data.get("command"), [out / r["name"] for r in data.get("runs", [])]
    runs = [p for p in sorted(out.iterdir()) if (p / CONFIG_FILE).is_file()] if out.is_dir() else []
    return None, sorted(runs, key=lambda p: (p.name != REFERENCE_HEAD, p.name))
