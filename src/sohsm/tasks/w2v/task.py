"""The word-embedding task: word2vec's CBOW or skip-gram, trained by the shared loop with any head.

One step reads one piece of ``batch_words`` corpus words (:mod:`sohsm.tasks.w2v.data`);
the cursor of an epoch is the piece, and the batches of a piece follow from
``(seed, epoch, piece)``, so a checkpoint's position is ``{epoch, piece}`` and a
resumed run reads the same batches. Dev evaluation scores the first
``data.eval_rows`` rows of the corpus's dev split (full windows, no sub-sampling):
the perplexity of the centre word, a held-out check that the vectors learn.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from sohsm.data.loading import Corpus, load_corpus
from sohsm.data.vocab import Vocabulary
from sohsm.heads import ClusteredHead, Head
from sohsm.tasks.heads import build_run_head
from sohsm.tasks.w2v.config import W2VConfig
from sohsm.tasks.w2v.data import EpochStream, W2VBatch, eval_examples, word2vec_vocabulary
from sohsm.tasks.w2v.fast import CompiledStep, HandStep, trains_by_hand
from sohsm.tasks.w2v.kernel import INSTALL_HINT, numba_available
from sohsm.tasks.w2v.model import LinearDecaySGD, Word2Vec
from sohsm.train.checkpoint import checkpoint_format
from sohsm.train.task import Task, register_task

#: the ``format`` of a word-embedding run's checkpoints
W2V_CHECKPOINT_FORMAT = checkpoint_format("w2v")

#: the heads' preset of options for word2vec (:func:`sohsm.heads.preset`)
WORD2VEC_PRESET = "word2vec"


def load_w2v_corpus(config: W2VConfig) -> Corpus:
    """The run's corpus with ``min_count`` applied (rarer words become ``<unk>``, which the task drops)."""
    d = config.data
    return load_corpus(d.corpus, d.data_dir, min_count=d.min_count, max_size=None, cache_dir=d.cache_dir,
                       text_mode=d.text_mode)


def build_w2v_head(config: W2VConfig, vocab: Vocabulary, steps_per_epoch: int | None = None) -> Head:
    """The head named by ``config.head`` over ``vocab``, as word2vec's output layer.

    The head's ``"word2vec"`` preset gives every option it leaves unset (row-sparse gradients for the tree
    and sampled heads, word2vec's negative sampling for ``pmi``); a re-clustering head re-clusters as often
    per epoch of ``steps_per_epoch`` steps as it says (:func:`~sohsm.heads.update_every_for`). With
    ``model.head_init = "zeros"`` every weight starts at 0. The head is then built by the head builder of every task
    (:func:`~sohsm.tasks.heads.build_run_head`), over ``model.dim`` inputs, with the run's seed.
    """
    spec = config.head.spec(check=False).with_preset(WORD2VEC_PRESET)
    update_every = config.head.update_every
    if update_every is None and steps_per_epoch:
        update_every = spec.update_every_for(steps_per_epoch)
    options = dict(spec.given)
    if config.head.update_every is not None:  # the spec's from head.update_every, which build_run_head passes on
        del options["update_every"]
    head_config = dataclasses.replace(config.head, options=options, update_every=update_every)
    head = build_run_head(dataclasses.replace(config, head=head_config), vocab)
    if config.model.head_init == "zeros":
        with torch.no_grad():
            for p in head.parameters():
                p.zero_()
    return head


@register_task
class W2VTask(Task):
    """A corpus read as word2vec reads it, one piece of ``batch_words`` words per step."""

    name = "w2v"
    config_class = W2VConfig
    checkpoint_format = W2V_CHECKPOINT_FORMAT
    location_fields = ("data.data_dir", "data.cache_dir")
    corpus_fields = ("data.corpus",)
    unit = ("rows", "rows")

    config: W2VConfig

    def __init__(self, config: W2VConfig, corpus: Corpus, device: torch.device) -> None:
        self.config, self.corpus, self.device = config, corpus, device
        self.data_name = f"corpus {corpus.name!r}"
        self.vocab, train = word2vec_vocabulary(corpus.vocab, corpus.train.numpy())
        _, self.valid = word2vec_vocabulary(corpus.vocab, corpus.valid.numpy())
        self.corpus_signature = corpus.signature + f" sample={config.data.sample:g}"
        m = config.model
        self.stream = EpochStream(train, self.vocab.counts, m.architecture, m.window, config.data.sample,
                                  config.batch_words, config.seed)
        self.epoch_length = self.stream.pieces
        self.tokens_per_epoch = max(1, self.stream.expected_rows())
        #: corpus words an epoch reads (what words/s counts, as word2vec and gensim do)
        self.words_per_epoch = int(train.shape[0])
        self.rows = 0  # rows of the batch in flight, for the optimizer

    @classmethod
    def load(cls, config: W2VConfig, device: torch.device) -> W2VTask:
        return cls(config, load_w2v_corpus(config), device)

    def check_fits(self, device: torch.device) -> None:
        if self.words_per_epoch < 2:
            raise ValueError(f"the training split of {self.corpus.name!r} has {self.words_per_epoch} words of the "
                             f"vocabulary (min_count={self.config.data.min_count}); word vectors need at least 2")
        if self.valid.shape[0] < 2:
            raise ValueError(f"the dev split of {self.corpus.name!r} has {self.valid.shape[0]} words of the "
                             "vocabulary; the dev evaluation needs at least 2")

    def build(self, device: torch.device) -> tuple[Word2Vec, Head]:
        torch.manual_seed(self.config.seed)
        m = self.config.model
        model = Word2Vec(len(self.vocab), m.dim, m.architecture, m.exact_mean_gradient, m.init_range)
        head = build_w2v_head(self.config, self.vocab, self.epoch_length)
        return model.to(device), head.to(device)

    @classmethod
    def build_saved(cls, config: W2VConfig, vocab: Vocabulary, saved_head: Mapping[str, Any],
                    device: torch.device) -> tuple[Word2Vec, Head]:
        """The model and head of a checkpoint (their weights come from its state dicts, so the head's
        re-clustering interval, which follows from the corpus, is left at the head's own)."""
        m = config.model
        model = Word2Vec(len(vocab), m.dim, m.architecture, m.exact_mean_gradient, m.init_range)
        return model.to(device), build_w2v_head(config, vocab).to(device)

    def build_optimizer(self, model: nn.Module, head: Head) -> LinearDecaySGD:
        """word2vec's SGD: a per-row rate falling linearly to zero over ``epochs`` epochs, row-sparse where the
        gradients are, each row's update capped at ``row_cap`` rows' worth (the config's ``optim`` section
        only names it: :meth:`W2VConfig.validate` holds it to plain SGD)."""
        params = list({id(p): p for x in (model, head) for p in x.parameters()}.values())
        return LinearDecaySGD(params, lr=self.config.learning_rate,
                              total_steps=self.config.epochs * self.epoch_length, rows=lambda: self.rows,
                              row_cap=self.config.row_cap)

    def step_by_hand(self, model: nn.Module, head: Head,
                     optimizer: torch.optim.Optimizer) -> CompiledStep | HandStep | None:
        """word2vec's hand-written update where ``fast_path`` is on, the head's loss splits into logistic decisions
        (:func:`~sohsm.heads.binary_pairs`: a binary tree, negative sampling) and the vectors are on the CPU: the
        compiled loop (:class:`~sohsm.tasks.w2v.fast.CompiledStep`) or the torch one
        (:class:`~sohsm.tasks.w2v.fast.HandStep`), as :meth:`kernel` says; else ``None`` (generic path).

        Raises:
            ValueError: ``kernel`` is ``"numba"`` and Numba cannot be imported.
        """
        kernel = self.kernel(head)
        if kernel is None:
            return None
        # one process, no compile: the model and the optimizer that build() and build_optimizer() made
        assert isinstance(model, Word2Vec) and isinstance(optimizer, LinearDecaySGD)
        if kernel == "numba":
            if not numba_available():
                raise ValueError(f"kernel is 'numba' but numba cannot be imported: {INSTALL_HINT}, "
                                 "or --kernel torch")
            return CompiledStep(model, head, optimizer)
        if kernel == "torch":
            return HandStep(model, head, optimizer, self.config.update_rows, self.config.update_row_cap)
        return None

    def trains_by_hand(self, head: Head) -> bool:
        """Whether this run's ``head`` takes the hand-written path (see :meth:`step_by_hand`)."""
        return self.config.fast_path and trains_by_hand(head) and self.device.type == "cpu"

    def kernel(self, head: Head) -> str | None:
        """The loop that trains ``head`` by hand: ``"numba"`` or ``"torch"`` (``config.kernel``; ``"auto"``: numba
        where it can be imported), or ``None`` where the run takes the generic path."""
        if not self.trains_by_hand(head):
            return None
        if self.config.kernel == "auto":
            return "numba" if numba_available() else "torch"
        return self.config.kernel

    # -- training ---------------------------------------------------------------------
    def batches(self, epoch: int, cursor: int) -> Iterator[tuple[W2VBatch, int]]:
        for index in range(cursor, self.epoch_length):
            batch = self.stream.piece(epoch, index)
            if batch.targets.numel():
                yield _to(batch, self.device), index + 1

    def hidden_states(self, model: nn.Module, batch: W2VBatch) -> tuple[Tensor, Tensor]:
        self.rows = batch.targets.numel()
        return model(batch), batch.targets  # [B, d], [B]

    def position(self, cursor: int) -> dict[str, Any]:
        return {"piece": cursor}

    compiles = "Numba's word2vec loops, cached on disk for the next run"

    def compilations(self) -> int:
        """Numba's compilations of word2vec's loops (:func:`sohsm.tasks.w2v.kernel.compilations`)."""
        if not numba_available():
            return 0
        from sohsm.tasks.w2v.kernel import compilations

        return compilations()

    def restore(self, position: Mapping[str, Any], device: torch.device) -> int:
        return int(position["piece"])

    # -- evaluation and display -------------------------------------------------------
    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        m = self.config.model
        for batch in eval_examples(self.valid, m.architecture, m.window, self.config.data.eval_rows):
            batch = _to(batch, self.device)
            yield model(batch), batch.targets

    def startup_lines(self, model, head, device, planned_tokens, done_tokens) -> list[str]:
        c, m = self.config, self.config.model
        clusters = head.n_clusters if isinstance(head, ClusteredHead) else None
        head_params = sum(p.numel() for p in head.parameters())
        what = (f"{self.corpus.name}: {len(self.vocab) - 1:,} words (vocab {len(self.vocab):,} with <unk>, which is "
                f"neither trained nor exported; min_count {c.data.min_count}), "
                f"{self.words_per_epoch:,} training words | {m.architecture} dim {m.dim} window {m.window} "
                f"sample {c.data.sample:g} | head {c.head.name}" + (f", {clusters} clusters" if clusters else "")
                + f" ({head_params / 1e6:.1f}M parameters) | {device}")
        plan = (f"plan: {c.epochs} epochs of {self.epoch_length:,} steps ({c.batch_words:,} words each), "
                f"~{planned_tokens:,} rows, rate {c.learning_rate:g} falling linearly to 0")
        kernel = self.kernel(head)
        if kernel == "numba":
            plan += "; updated by a compiled word2vec loop (numba), one row at a time"
        elif kernel == "torch":
            plan += f"; updated by hand, {c.update_rows} rows at a time, in torch"
            if c.kernel == "auto":
                plan += f" ({INSTALL_HINT} makes it faster: word2vec's loop compiled by numba)"
        else:
            plan += "; updated through autograd"
        if done_tokens:
            plan += f"; resuming at {done_tokens:,}"
        return [what, plan]


def _to(batch: W2VBatch, device: torch.device) -> W2VBatch:
    if device.type == "cpu":
        return batch
    def move(t):
        return None if t is None else t.to(device, non_blocking=True)

    return W2VBatch(move(batch.inputs), move(batch.offsets), move(batch.counts), move(batch.targets), batch.words)
