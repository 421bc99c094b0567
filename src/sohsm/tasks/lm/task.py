"""The language-modelling task: a token stream read in truncated-BPTT windows, the LSTM state carried.

One step reads a window of ``bptt`` rows of the ``[T, B]`` training layout
(:func:`sohsm.data.batchify`), carrying the LSTM state (detached) from the
previous window of the same epoch (a transformer carries none: each window is read
on its own, its context is the window, and its state stays ``None``)::

    rows 0 .. T-1 of B columns        step k reads rows [row, row + bptt) and predicts the next row
    |w0 w1 ...| |...| ... |...|       after the window: row += bptt; at row T-1 the epoch ends,
     window 0   win 1      last        the state is reset and row goes back to 0

The cursor of an epoch is the row; a checkpoint's position is ``{epoch, row, state}``.

With several processes (:mod:`sohsm.train.distributed`) each rank reads its own
``batch_size / N`` columns of the same layout and its share of the dev columns;
a checkpoint holds the LSTM state of all columns, gathered in rank order, which
is the state one process would hold.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sohsm.data.batching import batchify, bptt_batches
from sohsm.data.loading import Corpus, load_corpus
from sohsm.data.subwords import TOKENIZER_FILE, Subwords, packaged_name
from sohsm.data.vocab import Vocabulary
from sohsm.fields import FieldError, escape, has
from sohsm.heads import Head, HeadDefaults
from sohsm.models.lstm_lm import detach_state
from sohsm.models.transformer_lm import TransformerLM
from sohsm.tasks.heads import hierarchy_parts, saved_clusters, takes_tree
from sohsm.tasks.hierarchies import load_hierarchy
from sohsm.tasks.lm.config import LMConfig, with_vocabulary_options
from sohsm.tasks.lm.evaluation import stream_hidden_states
from sohsm.tasks.lm.model import build_model_and_head
from sohsm.tasks.lm.preflight import check_run_fits
from sohsm.tasks.lm.progress import startup_lines
from sohsm.tasks.lm.scores import split_scores
from sohsm.train.checkpoint import check_same_data, checkpoint_format
from sohsm.train.distributed import Ranks
from sohsm.train.precision import autocast_fails
from sohsm.train.task import Task, register_task


@register_task
class LMTask(Task):
    """A corpus read as ``batch_size`` columns of running text, in windows of ``bptt`` rows."""

    name = "lm"
    config_class = LMConfig
    checkpoint_format = checkpoint_format("lm")
    location_fields = ("data.data_dir", "data.cache_dir", "data.clusters_from")
    corpus_fields = ("data.corpus",)

    config: LMConfig

    def __init__(self, config: LMConfig, corpus: Corpus, device: torch.device) -> None:
        self.config, self.corpus = config, corpus
        self.vocab, self.corpus_signature = corpus.vocab, corpus.signature
        self.data_name = f"corpus {corpus.name!r}"
        self.data = batchify(corpus.train, config.batch_size, device)  # [T, B]
        self.epoch_length = self.data.size(0) - 1  # the last row is only a target
        if self.epoch_length < 1:
            raise FieldError(escape(f"the training split ({corpus.train.numel()} tokens) is too short for ") + "{}",
                             has("batch_size", config.batch_size))
        self.tokens_per_epoch = self.epoch_length * config.batch_size
        self.state: tuple[Tensor, ...] | None = None  # an LSTM's (h, c)
        #: the head options :meth:`complete_config` added from the model and vocabulary, and why (none on a resumed run)
        self.vocabulary_options = HeadDefaults({})
        self.ranks = Ranks(device=device)
        d = config.data
        #: the hierarchy the head takes (``data.clusters_from``), read before anything is written
        self.hierarchy = (load_hierarchy(d.clusters_from, self.vocab, d.clusters_format, d.clusters_cut,
                                         two_level=not takes_tree(config.head.name)) if d.clusters_from else None)

    def complete_config(self) -> LMConfig:
        """The run's config with the head options its model and vocabulary settle (:func:`with_vocabulary_options`:
        the head's own defaults, e.g. ``div_value=4`` for a tied LSTM's self-organized head over 20,000 words or
        more), kept in its ``config.json``."""
        self.config, self.vocabulary_options = with_vocabulary_options(self.config, len(self.vocab),
                                                                       self.vocab.unseen)
        return self.config

    @classmethod
    def load(cls, config: LMConfig, device: torch.device) -> LMTask:
        return cls(config, load_lm_corpus(config), device)

    @classmethod
    def load_saved(cls, config: LMConfig, device: torch.device, run_dir: Path) -> LMTask:
        """The corpus as the run read it: a subword run's with the run's own ``tokenizer.json``."""
        return cls(config, load_lm_corpus(config, run_dir=run_dir), device)

    def write_run_files(self, run_dir: Path) -> None:
        """A subword run keeps its tokenizer (``tokenizer.json``): what it is resumed and used with."""
        if self.corpus.tokenizer is not None:
            self.corpus.tokenizer.save(run_dir / TOKENIZER_FILE)

    @classmethod
    def absolute_locations(cls, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`Task.absolute_locations`, and a tokenizer file made absolute (``bpe:SIZE`` stays)."""
        out = super().absolute_locations(overrides)
        if isinstance(out.get("data.tokenizer"), str):
            out["data.tokenizer"] = normalise_tokenizer(out["data.tokenizer"])
        return out

    def check_fits(self, device: torch.device) -> None:
        check_run_fits(self.config, self.corpus, device)
        amp = self.config.amp
        if amp is not None:
            transformer = self.config.model.architecture == "transformer"
            probe = (TransformerLM(2, hidden_size=4, layers=1, attention_heads=1, context=1) if transformer
                     else torch.nn.LSTM(4, 4)).to(device)
            example = (torch.zeros(1, 1, dtype=torch.long, device=device) if transformer
                       else torch.zeros(1, 1, 4, device=device))
            failure = autocast_fails(amp, device, lambda: probe(example))
            if failure:
                model = "transformer" if transformer else "LSTM"
                raise ValueError(f"amp {amp!r} cannot run the {model} on the {device.type} here ({failure})")

    def shard(self, ranks: Ranks) -> None:
        """Keep this rank's ``batch_size / N`` training columns; dev columns are shared out at evaluation."""
        self.ranks = ranks
        if ranks.world == 1:
            return
        c = self.config
        if c.batch_size % ranks.world:
            raise FieldError.on("batch_size", f"({c.batch_size}) must be a multiple of the number of processes "
                                f"({ranks.world}): each trains on an equal share of the columns")
        if c.eval_batch_size < ranks.world:
            raise FieldError.on("eval_batch_size", f"({c.eval_batch_size}) must be at least the number of "
                                f"processes ({ranks.world}): each evaluates a share of the columns")
        self.data = self.data[:, self._columns()].contiguous()  # [T, B/N]

    def _columns(self) -> slice:
        """This rank's training columns."""
        return self.ranks.share(self.config.batch_size)

    def build(self, device: torch.device) -> tuple[nn.Module, Head]:
        clusters, tree = (None, None) if self.hierarchy is None else hierarchy_parts(
            self.config.head.name, self.hierarchy.tree, len(self.vocab))
        return build_model_and_head(self.config, self.vocab, device, clusters=clusters, tree=tree)

    @classmethod
    def build_saved(cls, config: LMConfig, vocab: Vocabulary, saved_head, device) -> tuple[nn.Module, Head]:
        return build_model_and_head(config, vocab, device, clusters=saved_clusters(config, saved_head))

    # -- training ---------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        """A step takes ``bptt`` rows of the ``epoch_length``."""
        return -(-self.epoch_length // self.config.bptt)

    @property
    def tokens_per_step(self) -> int:
        """A step reads ``bptt`` rows of all ``batch_size`` columns (an epoch's last may read fewer)."""
        return self.config.bptt * self.config.batch_size

    def batches(self, epoch: int, cursor: int) -> Iterator[tuple[tuple[Tensor, Tensor], int]]:
        for inputs, targets in bptt_batches(self.data, self.config.bptt, start=cursor):
            cursor += inputs.size(0)
            yield (inputs, targets), cursor

    def hidden_states(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        inputs, targets = batch
        self.state = detach_state(self.state)
        hidden, self.state = model(inputs, self.state)  # [t, B, d]; the head flattens it to [t*B, d]
        return hidden, targets

    def carried_state(self) -> tuple[Tensor, ...] | None:
        """The LSTM's state after the last window (``None`` for a transformer, and at an epoch's start)."""
        return None if self.state is None else tuple(self.state)

    def set_carried_state(self, state: tuple[Tensor, ...] | None) -> None:
        self.state = state

    def end_epoch(self) -> None:
        self.state = None

    def position(self, cursor: int) -> dict[str, Any]:
        state = None if self.state is None else [self.ranks.gather(s.detach(), dim=1) for s in self.state]
        return {"row": cursor, "state": state}  # state: [layers, B, hidden], all columns

    def restore(self, position: Mapping[str, Any], device: torch.device) -> int:
        state = position["state"]
        columns = self._columns()
        self.state = None if state is None else tuple(s[:, columns].to(device).contiguous() for s in state)
        return int(position["row"])

    # -- evaluation and display -------------------------------------------------------
    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        return stream_hidden_states(model, self.corpus.valid, self.config.eval_batch_size, self.config.bptt,
                                    columns=self.ranks.share(self.config.eval_batch_size))

    def eval_record_fields(self, result) -> dict[str, Any]:
        """A subword run's dev record adds perplexity per word and bits per byte of the valid split (they compare
        across tokenizers; :mod:`sohsm.tasks.lm.scores`); a word run's perplexity is already per word."""
        c = self.corpus
        if c.tokenizer is None or c.valid is None:
            return {}
        scores = split_scores(result, c.valid.numel(), c.words.get("valid"), c.text_bytes.get("valid"), True)
        return {"ppl_word": scores.ppl_word, "bits_per_byte": scores.bits_per_byte}

    def startup_lines(self, model, head, device, planned_tokens, done_tokens) -> list[str]:
        lines = startup_lines(self.config, self.corpus, model, head, device, planned_tokens, self.tokens_per_epoch,
                              done_tokens)
        if self.vocabulary_options.options:
            given = ", ".join(f"{key}={value}" for key, value in self.vocabulary_options.options.items())
            lines.append(f"head option {given}: {self.vocabulary_options.reason}")
        return lines + ([self.hierarchy.summary()] if self.hierarchy is not None else [])


def load_lm_corpus(config: LMConfig, data_dir: str | None = None, cache_dir: str | None = None,
                   run_dir: str | os.PathLike[str] | None = None) -> Corpus:
    """The corpus of a run config, tokenised (from the cache when it can); ``data_dir`` and ``cache_dir``
    replace the config's locations where given.

    ``run_dir``: the run of this config, whose ``tokenizer.json`` a subword run reads its text with (its
    tokenizer is never trained again: a ``bpe:SIZE`` run resumes and evaluates with the one it trained).

    Raises:
        ValueError: a subword run whose directory lost its ``tokenizer.json``.
    """
    d = config.data
    tokenizer: str | Subwords | None = d.tokenizer
    if tokenizer is not None and run_dir is not None:
        tokenizer = run_tokenizer(run_dir)
    return load_corpus(d.corpus, d.data_dir if data_dir is None else data_dir, min_count=d.min_count,
                       max_size=d.max_size, cache_dir=d.cache_dir if cache_dir is None else cache_dir,
                       text_mode=d.text_mode, tokenizer=tokenizer)


def run_tokenizer(run_dir: str | os.PathLike[str]) -> Subwords:
    """The tokenizer a subword run was trained with, from its ``tokenizer.json``.

    Raises:
        ValueError: the file is missing or not a tokenizer.
    """
    path = Path(run_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ValueError(f"{run_dir} has no {TOKENIZER_FILE}: a subword run reads its text with the tokenizer it "
                         "was trained with, kept there (copy it back from where the run was made)")
    return Subwords.from_file(path)


def normalise_tokenizer(tokenizer: str) -> str:
    """``bpe:SIZE`` and a packaged tokenizer's name stay; a tokenizer file's path becomes absolute, so a resume from
    elsewhere finds it."""
    if tokenizer.startswith("bpe:") or packaged_name(tokenizer) is not None:
        return tokenizer
    path = Path(tokenizer).expanduser()
    return str(path.resolve()) if path.exists() else tokenizer


def check_vocabulary(corpus: Corpus, vocab: Vocabulary, trained_on: str, where: str | os.PathLike[str]) -> None:
    """Refuse a corpus whose vocabulary or files differ from those a checkpoint was trained on.

    Args:
        corpus: the corpus as loaded now.
        vocab: the checkpoint's vocabulary.
        trained_on: the checkpoint's corpus signature (:attr:`sohsm.data.Corpus.signature`).
        where: the checkpoint, for the message.

    Raises:
        ValueError: naming what differs.
    """
    check_same_data(where, vocab, trained_on, corpus.vocab, corpus.signature, f"corpus {corpus.name!r}")
