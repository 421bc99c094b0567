"""What the training loop trains on: a *task* supplies batches and the data to evaluate on.

The split follows fairseq's task / model / criterion: the task reads the data and
cuts it into batches; :meth:`Task.hidden_states` has the model turn a batch into
hidden states and their targets; the head scores them. The loop
(:mod:`sohsm.train.loop`) owns everything else, once for every task: budgets,
exact resume, atomic checkpoints, ``metrics.jsonl``, progress, stop signals,
the divergence guard, the run lock and dev evaluation::

    task.batches(epoch, cursor) --> batch --> task.hidden_states(model, batch) --> (hidden [M, d], targets [M])
                                                                             --> head(hidden, targets).loss

An epoch is ``task.epoch_length`` cursor positions (BPTT rows for a language
model, batches for a summariser); a checkpoint stores the epoch, the cursor and
whatever the task carries across batches (:meth:`Task.position`), so a resumed
run reads the same batches an uninterrupted one would.

Each task lives in its own package under :mod:`sohsm.tasks` (its config, batches,
model builder, pre-flight checks and run loading together) and registers itself
with :func:`register_task`; importing :mod:`sohsm.tasks` imports every task. The
registry imports that package the first time it is asked (:func:`task_named` and
the other look-ups), so that a run can be trained or loaded by name whatever was
imported before, while ``import sohsm`` (the heads) loads no task. A run directory
names its task in ``config.json`` (``"task"``; absent: ``lm``, as in runs written
before it was stored).
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from sohsm.data.corpora import CORPORA
from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head
from sohsm.train.builders import build_optimizer
from sohsm.train.checkpoint import check_same_data, reading_checkpoint
from sohsm.train.config import RunConfig
from sohsm.train.distributed import Ranks


class Task(ABC):
    """The data side of a training run.

    Attributes:
        name: the task's name in ``config.json`` (``"lm"``, ``"s2s"``, ``"w2v"``).
        config_class: the run config it trains from.
        checkpoint_format: the ``format`` its checkpoints carry.
        config: the run's config.
        vocab: the words the head scores (saved as ``vocab.json`` and in every checkpoint).
        corpus_signature: names the data and its checksum, for the run signature.
        data_name: what the data is called in messages.
        epoch_length: cursor positions in an epoch.
        tokens_per_epoch: target tokens in an epoch (for the plan and the progress bar).
    """

    name: ClassVar[str]
    config_class: ClassVar[type[RunConfig]]
    checkpoint_format: ClassVar[str]
    #: dotted config fields that name files or folders (made absolute by :meth:`absolute_locations`)
    location_fields: ClassVar[tuple[str, ...]] = ()
    #: dotted config fields that name a corpus: a known name, or a path to your own text (made absolute)
    corpus_fields: ClassVar[tuple[str, ...]] = ()
    #: what the run's data is called in messages (``"corpus 'ptb'"``)
    data_name: str = "the data"
    #: what ``tokens_per_epoch`` counts, in words and per second, as the progress bar, its estimate and the
    #: summary name it (a word2vec run counts training rows, not corpus words)
    unit: ClassVar[tuple[str, str]] = ("tokens", "tok")

    config: RunConfig
    vocab: Vocabulary
    corpus_signature: str
    epoch_length: int
    tokens_per_epoch: int

    @property
    def steps_per_epoch(self) -> int:
        """Training steps in an epoch (the default dev-evaluation interval follows from it): one cursor
        position a step unless a task says otherwise."""
        return self.epoch_length

    @property
    def tokens_per_step(self) -> int:
        """Target tokens of a full training step (all ranks; where a learning-rate schedule ends follows from
        it): an epoch's mean unless a task says otherwise."""
        return max(1, self.tokens_per_epoch // self.steps_per_epoch)

    # -- setting up -------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def load(cls, config: Any, device: torch.device) -> Task:
        """Read the run's data (raising ``ValueError`` or ``DataError`` in one line)."""

    @classmethod
    def load_saved(cls, config: Any, device: torch.device, run_dir: Path) -> Task:
        """Read the data of the run in ``run_dir`` again, to resume it: as :meth:`load` does, unless the task
        keeps part of its data in the run directory (:meth:`write_run_files`; a language model's tokenizer),
        which is then read from there and never made again."""
        return cls.load(config, device)

    def write_run_files(self, run_dir: Path) -> None:
        """Write what the run directory keeps of the data besides ``vocab.json`` (a subword run's tokenizer), when
        a run starts; nothing unless a task says otherwise."""

    @classmethod
    def absolute_locations(cls, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """``overrides`` with relative data locations made absolute, so a run is found again from elsewhere.

        The locations are the fields :attr:`location_fields` names, and the corpora those
        :attr:`corpus_fields` names (:func:`normalise_corpus`).
        """
        out = dict(overrides)
        for key in cls.location_fields:
            if isinstance(out.get(key), str):
                out[key] = str(Path(out[key]).expanduser().resolve())
        for key in cls.corpus_fields:
            if out.get(key) is not None:
                out[key] = normalise_corpus(out[key])
        return out

    def check_fits(self, device: torch.device) -> None:
        """Refuse settings that cannot train on this data and device, before anything is written."""

    def shard(self, ranks: Ranks) -> None:
        """Keep this rank's share of the training and dev data (several processes, see
        :mod:`sohsm.train.distributed`); :meth:`position` then gathers what the ranks carry.

        Raises:
            ValueError: the task cannot be split this way (here: any task that does not say how).
        """
        if ranks.world > 1:
            raise ValueError(f"the {self.name} task trains in one process only, not {ranks.world}")

    def check_checkpoint(self, checkpoint: Mapping[str, Any], path) -> None:
        """Refuse to resume a checkpoint trained on other data (other words, other files).

        Compares the checkpoint's vocabulary and corpus signature with :attr:`vocab` and
        :attr:`corpus_signature` (:func:`~sohsm.train.checkpoint.check_same_data`).
        """
        with reading_checkpoint(path, values=True):
            trained_on = checkpoint["signature"]["corpus"]
            trained_vocab = Vocabulary.from_dict(checkpoint["vocab"])
        check_same_data(path, trained_vocab, trained_on, self.vocab, self.corpus_signature, self.data_name)

    @abstractmethod
    def build(self, device: torch.device) -> tuple[nn.Module, Head]:
        """The model and head of the run, initialised from ``config.seed``."""

    @classmethod
    @abstractmethod
    def build_saved(cls, config: Any, vocab: Vocabulary, saved_head: Mapping[str, Any],
                    device: torch.device) -> tuple[nn.Module, Head]:
        """The model and head of a checkpoint of ``config``, ready for its state dicts (no data is read).

        ``saved_head`` is the checkpoint's head state: a head whose shape follows from
        the data (fixed clusters from ``data.clusters_from``) is built in that shape.
        """

    def complete_config(self) -> Any:
        """The config a new run is written and built with: its own (``self.config``), with what the task settles
        from its data where the flags left it open. Called once when a run starts, before :meth:`build`; a resumed
        run keeps what its ``config.json`` says. The default settles nothing."""
        return self.config

    def build_optimizer(self, model: nn.Module, head: Head) -> torch.optim.Optimizer:
        """The optimizer over ``model`` and ``head`` (called once per session, after :meth:`build`; a resumed
        session loads the checkpoint's optimizer state into it).

        The default is the config's ``optim`` section (:func:`sohsm.train.builders.build_optimizer`);
        a task whose update rule is its own (word2vec's linearly falling sparse SGD) returns that.
        """
        return build_optimizer(self.config, model, head)

    def step_by_hand(self, model: nn.Module, head: Head,
                     optimizer: torch.optim.Optimizer) -> Callable[[Any], tuple[Tensor, int]] | None:
        """A training step this task computes itself, or ``None`` (the default) for the loop's own.

        The loop's step runs ``hidden_states``, the head, autograd and ``optimizer.step()``.
        A task whose model and head it can train faster by hand (word2vec's per-row update
        of a binary tree or negative sampling) returns a callable that trains one batch in
        place and returns ``(loss_sum, targets)``: the loss summed over the batch's targets
        (a float64 scalar) and their number; the loop still checks the loss, counts, logs,
        evaluates and checkpoints. Called once per session, with one process only, and
        without ``amp`` or ``compile``.

        .. note:: such a step updates before the loop sees its loss, so a non-finite loss
            stops the run after the weights moved (no checkpoint is written from them).
        """
        return None

    # -- training ---------------------------------------------------------------------
    @abstractmethod
    def batches(self, epoch: int, cursor: int) -> Iterator[tuple[Any, int]]:
        """The rest of epoch ``epoch`` from ``cursor``: ``(batch, cursor after it)`` pairs."""

    @abstractmethod
    def hidden_states(self, model: nn.Module, batch: Any) -> tuple[Tensor, Tensor]:
        """``(hidden [*, d], targets [*])`` of a batch: the rows the head scores (padding left out)."""

    def carried_state(self) -> tuple[Tensor, ...] | None:
        """What the next training step reads from the steps before it and replaces (an LSTM's state across the
        windows of truncated BPTT), or ``None``: nothing (the default), or nothing yet. A captured step
        (:mod:`sohsm.train.step_graph`) reads it from fixed buffers and gives it back by :meth:`set_carried_state`."""
        return None

    def set_carried_state(self, state: tuple[Tensor, ...] | None) -> None:
        """Carry ``state`` (as :meth:`carried_state` gives it) into the next step."""

    def end_epoch(self) -> None:
        """Forget what was carried across the batches of the epoch that ended."""

    def position(self, cursor: int) -> dict[str, Any]:
        """Where an epoch stands, for a checkpoint (the loop adds ``epoch``); every rank calls it."""
        return {"cursor": cursor}

    def restore(self, position: Mapping[str, Any], device: torch.device) -> int:
        """Take up a checkpoint's :meth:`position` again; returns the cursor."""
        return int(position["cursor"])

    # -- evaluation and display -------------------------------------------------------
    @abstractmethod
    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        """``(hidden [*, d], targets [*])`` of the dev data, batch by batch, model in eval mode."""

    def eval_record_fields(self, result: Any) -> dict[str, Any]:
        """What a dev evaluation's record in ``metrics.jsonl`` adds to ``result``'s figures (``EvalResult``): none
        by default; a language model over subwords adds perplexity per word and bits per byte."""
        return {}

    def startup_lines(self, model: nn.Module, head: Head, device: torch.device, planned_tokens: int,
                      done_tokens: int) -> list[str]:
        """What a session prints before it trains: data, model, head, device and the plan."""
        return []

    #: what :meth:`compilations` counts, as a summary names it (``"+ 21.0 s compiling (WHAT; not counted)"``)
    compiles: ClassVar[str] = "--compile"

    def compilations(self) -> int:
        """How many times code this task runs in a step (making its batch or training on it) has been compiled in
        this process, besides ``torch.compile`` (word2vec's Numba loops): a step that raises it spent its time
        compiling, which the loop leaves out of the training time and its speed, as it does a step that
        ``--compile`` compiled. None by default."""
        return 0


_TASKS: dict[str, type[Task]] = {}

#: the package whose import registers the built-in tasks (named, not imported here: the loop imports no task)
TASK_PACKAGE = "sohsm.tasks"


def _registered() -> dict[str, type[Task]]:
    """The registry, with the built-in tasks in it (their package is imported on the first look-up)."""
    importlib.import_module(TASK_PACKAGE).import_tasks()
    return _TASKS


def register_task(task: type[Task]) -> type[Task]:
    """Class decorator: register ``task`` under ``task.name`` (a duplicate name is refused)."""
    if not (isinstance(task, type) and issubclass(task, Task)):
        raise TypeError(f"register_task takes a Task subclass, got {task!r}")
    if task.name in _TASKS and _TASKS[task.name] is not task:
        raise ValueError(f"a task named {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def task_names() -> list[str]:
    """The registered tasks' names, sorted."""
    return sorted(_registered())


def task_named(name: str) -> type[Task]:
    """The task registered as ``name``."""
    tasks = _registered()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(tasks))}")
    return tasks[name]


def task_of(config: RunConfig) -> type[Task]:
    """The task that trains ``config``."""
    for task in _registered().values():
        if type(config) is task.config_class:
            return task
    raise ValueError(f"no task trains a {type(config).__name__}")


def task_of_dict(data: Mapping[str, Any]) -> type[Task]:
    """The task of a ``config.json``: its ``"task"`` field, else the language model (older runs have none)."""
    name = data.get("task", "lm") if isinstance(data, Mapping) else "lm"
    return task_named(name if isinstance(name, str) else repr(name))


def normalise_corpus(corpus: str) -> str:
    """Known names stay names; a path to your own text becomes absolute so a resume from elsewhere finds it."""
    if corpus in CORPORA:
        return corpus
    path = Path(corpus).expanduser()
    return str(path.resolve()) if path.exists() else corpus
