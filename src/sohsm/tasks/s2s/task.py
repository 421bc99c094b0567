"""The headline-generation task: article -> title pairs in padded batches, for the attention encoder-decoder.

One step reads one batch of ``batch_size`` pairs; an epoch is a shuffle of all
training pairs drawn from ``(seed, epoch)``, so the cursor of an epoch is the
batch number and a resumed run reads the same batches. Only the rows of real
title words (and each title's ``<eos>``) reach the head: padding counts neither
in the loss nor in a self-organized head's cluster statistics.

``clusters_from`` names a language-model run trained on the training titles
(``sohsm s2s titles``, then ``sohsm lm train``): the head takes that run's word
clusters and keeps them fixed, as the paper does; or a hierarchy file
(:mod:`sohsm.tasks.hierarchies`). ``data.dataset = "reverse"`` trains on the
synthetic reverse task instead (:mod:`sohsm.data.reverse`); ``data.pairs`` on a folder
of pairs made from your own Gigaword (:mod:`sohsm.data.gigaword`).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sohsm.data.files import cached_sha256
from sohsm.data.headlines import TrainingPairs, load_pairs_folder, load_training_pairs
from sohsm.data.pairs import PairBatch, build_title_vocab, encode, epoch_batches, input_size, make_batch, pad_id
from sohsm.data.reverse import reverse_data, reverse_vocab
from sohsm.data.vocab import Vocabulary, vocabulary_difference
from sohsm.heads import ClusteredHead, Head
from sohsm.models.seq2seq import AttentionSeq2Seq
from sohsm.tasks.heads import build_run_head, hierarchy_parts, saved_clusters, takes_tree
from sohsm.tasks.hierarchies import LoadedHierarchy, load_hierarchy, read_run_head
from sohsm.tasks.s2s.config import S2SConfig
from sohsm.train.checkpoint import checkpoint_format
from sohsm.train.task import Task, register_task


@register_task
class S2STask(Task):
    """Gigaword pairs in shuffled, padded batches; dev perplexity on the dev pairs."""

    name = "s2s"
    config_class = S2SConfig
    checkpoint_format = checkpoint_format("s2s")
    location_fields = ("data.data_dir", "data.pairs", "data.clusters_from")
    data_name = "the training titles"

    config: S2SConfig

    def __init__(self, config: S2SConfig, pairs: TrainingPairs, device: torch.device) -> None:
        d = config.data
        self.config, self.pairs, self.device = config, pairs, device
        assert pairs.train.targets is not None and pairs.valid.targets is not None  # training pairs have titles
        if d.dataset == "reverse":
            self.vocab = reverse_vocab(d.symbols, pairs.train.targets)
        else:
            self.vocab = build_title_vocab(pairs.train.targets, d.min_count, d.max_size)
        self.train_ids = (encode(pairs.train.sources, self.vocab), encode(pairs.train.targets, self.vocab))
        self.valid_ids = (encode(pairs.valid.sources, self.vocab), encode(pairs.valid.targets, self.vocab))
        self.epoch_length = -(-len(pairs.train) // config.batch_size)
        self.tokens_per_epoch = sum(len(t) + 1 for t in self.train_ids[1])
        if d.dataset == "reverse":
            self.corpus_signature = (f"reverse symbols={d.symbols} pairs={d.train_pairs} valid={d.valid_pairs} "
                                     f"pairs_seed={d.pairs_seed}")
        else:
            files = " ".join(f"{Path(f).name}:{cached_sha256(f)[:16]}" for f in pairs.train.files)
            self.corpus_signature = (f"{d.dataset} {files} pairs={len(pairs.train)} min_count={d.min_count} "
                                     f"max_size={d.max_size}")
        self.clusters, self.hierarchy = task_hierarchy(config, self.vocab)

    @classmethod
    def load(cls, config: S2SConfig, device: torch.device) -> S2STask:
        d = config.data
        if d.dataset == "reverse":
            return cls(config, reverse_data(d.symbols, d.train_pairs, d.valid_pairs, d.pairs_seed), device)
        if d.pairs is not None:
            return cls(config, load_pairs_folder(d.pairs), device)
        return cls(config, load_training_pairs(d.data_dir, d.extra), device)

    def build(self, device: torch.device) -> tuple[AttentionSeq2Seq, Head]:
        tree = self.hierarchy.tree if self.hierarchy is not None and takes_tree(self.config.head.name) else None
        return build_model_and_head(self.config, self.vocab, device, clusters=self.clusters, tree=tree)

    @classmethod
    def build_saved(cls, config: S2SConfig, vocab: Vocabulary, saved_head, device) -> tuple[AttentionSeq2Seq, Head]:
        return build_model_and_head(config, vocab, device, clusters=saved_clusters(config, saved_head))

    # -- training ---------------------------------------------------------------------
    def _batch(self, ids: tuple[list, list], rows) -> PairBatch:
        sources, targets = ids
        return make_batch([sources[i] for i in rows], [targets[i] for i in rows], self.vocab, self.device)

    def batches(self, epoch: int, cursor: int) -> Iterator[tuple[PairBatch, int]]:
        order = epoch_batches(len(self.train_ids[0]), self.config.batch_size, self.config.seed, epoch)
        for i in range(cursor, len(order)):
            yield self._batch(self.train_ids, order[i]), i + 1

    def hidden_states(self, model: nn.Module, batch: PairBatch) -> tuple[Tensor, Tensor]:
        return target_rows(model, batch, pad_id(self.vocab))

    def position(self, cursor: int) -> dict[str, Any]:
        return {"batch": cursor}

    def restore(self, position: Mapping[str, Any], device: torch.device) -> int:
        return int(position["batch"])

    # -- evaluation and display -------------------------------------------------------
    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        n, size = len(self.valid_ids[0]), self.config.eval_batch_size
        for lo in range(0, n, size):
            yield target_rows(model, self._batch(self.valid_ids, range(lo, min(n, lo + size))), pad_id(self.vocab))

    def startup_lines(self, model, head, device, planned_tokens, done_tokens) -> list[str]:
        m, c = self.config.model, self.config
        params = sum(p.numel() for p in {id(p): p for x in (model, head) for p in x.parameters()}.values())
        clusters = head.n_clusters if isinstance(head, ClusteredHead) else None
        source = (f"from {c.data.pairs}" if c.data.pairs is not None
                  else f"({self.pairs.extra_dropped:,} extra pairs dropped for overlap)")
        what = (f"{c.data.dataset}: {len(self.pairs.train):,} training pairs {source}, {len(self.vocab):,} words | "
                f"encoder-decoder LSTM "
                f"{m.emb_size}/{m.hidden_size} with attention | head {c.head.name}"
                + (f", {clusters} clusters" + (" (fixed, from a language model)" if self.clusters is not None else "")
                   if clusters else "")
                + f" | {params / 1e6:.1f}M parameters | {device}")
        plan = f"plan: {planned_tokens:,} target tokens ({planned_tokens / self.tokens_per_epoch:.2f} epochs)"
        if done_tokens:
            plan += f"; resuming at {done_tokens:,}"
        return [what, plan] + ([self.hierarchy.summary()] if self.hierarchy is not None else [])


def target_rows(model: nn.Module, batch: PairBatch, pad: int) -> tuple[Tensor, Tensor]:
    """``(hidden [M, d], targets [M])`` of the batch's real target words: padding rows are left out."""
    assert batch.target_out is not None  # a training or dev batch has its titles
    hidden = model(batch.source, batch.source_lengths, batch.target_in)  # [T, B, d]
    real = batch.target_out != pad  # [T, B]
    return hidden[real], batch.target_out[real]  # [M, d], [M]


def build_model_and_head(config: S2SConfig, vocab: Vocabulary, device: torch.device | str = "cpu", *,
                         clusters: Tensor | None = None, tree: list | None = None) -> tuple[AttentionSeq2Seq, Head]:
    """The encoder-decoder and the head of a run, initialised from ``config.seed`` and moved to ``device``.

    ``clusters`` and ``tree``: a hierarchy the head takes (:func:`~sohsm.tasks.heads.build_run_head`).
    """
    torch.manual_seed(config.seed)
    m = config.model
    model = AttentionSeq2Seq(input_size(vocab), pad_id(vocab), m.emb_size, m.hidden_size)
    head = build_run_head(config, vocab, clusters=clusters, tree=tree)
    return model.to(device), head.to(device)


def load_clusters(run_dir: str | os.PathLike[str], vocab: Vocabulary) -> Tensor:
    """The word clusters of a language-model run whose vocabulary is ``vocab``: ``[N]`` cluster ids.

    Raises:
        ValueError: not a run, a head without clusters, or another vocabulary.
    """
    head, run_vocab, head_name = read_run_head(run_dir)  # a language model's, or another summariser's
    if run_vocab != vocab:
        raise ValueError(f"the clusters run {run_dir} has another vocabulary than the summariser's training titles "
                         f"({vocabulary_difference(run_vocab, vocab).replace('checkpoint', 'clusters run')}); train "
                         "it on the titles `sohsm s2s titles` writes, with the same --min-count and --max-size")
    if not isinstance(head, ClusteredHead):
        raise ValueError(f"the clusters run {run_dir} has a {head_name!r} head, which has no word clusters")
    return head.assignment.detach().cpu().clone()


def task_hierarchy(config: S2SConfig, vocab: Vocabulary) -> tuple[Tensor | None, LoadedHierarchy | None]:
    """``(clusters, hierarchy)`` from ``data.clusters_from``: a language-model run on the same titles gives
    its clusters as they are; a hierarchy file (or a run for the ``tree`` head) is mapped by words."""
    d = config.data
    if not d.clusters_from:
        return None, None
    tree_head = takes_tree(config.head.name)
    if d.clusters_format in (None, "run") and Path(d.clusters_from).is_dir() and not tree_head:
        return load_clusters(d.clusters_from, vocab), None
    loaded = load_hierarchy(d.clusters_from, vocab, d.clusters_format, d.clusters_cut, two_level=not tree_head)
    return hierarchy_parts(config.head.name, loaded.tree, len(vocab))[0], loaded
