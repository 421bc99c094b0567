"""What a two-level head's clusters hold: sizes, token mass and most frequent words (the paper's Table 3).

A subword run's tokens are shown as the text each stands for, quoted, so that the space a token begins with is
seen (``Ġthe`` as ``" the"``): :func:`token_text`.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sohsm.data.vocab import Vocabulary
from sohsm.heads import ClusteredHead, Head


@dataclass(frozen=True)
class ClusterSummary:
    """One cluster of a head.

    Attributes:
        cluster: the cluster id.
        size: number of words.
        tf_mass: share of the training tokens that fall in it (sum of its words' relative frequencies).
        words: its words, most frequent first.
        counts: their training counts, aligned with ``words``.
    """

    cluster: int
    size: int
    tf_mass: float
    words: list[str]
    counts: list[int]


def _clusters(head: Head) -> list:
    if not isinstance(head, ClusteredHead):
        raise ValueError(f"{type(head).__name__} has no word clusters (only two-level heads have them)")
    return head.clusters()


def _summary(cluster: int, word_ids: np.ndarray, vocab: Vocabulary, total: int, words: int | None) -> ClusterSummary:
    counts = vocab.counts[word_ids]
    order = np.argsort(-counts, kind="stable")
    if words is not None:
        order = order[:words]
    return ClusterSummary(
        cluster=cluster, size=int(word_ids.size), tf_mass=float(counts.sum()) / total if total else 0.0,
        words=[vocab.itos[int(word_ids[i])] for i in order], counts=[int(counts[i]) for i in order],
    )


def cluster_table(head: Head, vocab: Vocabulary, words: int | None = 10) -> list[ClusterSummary]:
    """Every cluster of ``head``, heaviest (by token mass) first, with its ``words`` most frequent words.

    Args:
        head: a head with clusters (``head.clusters()``).
        vocab: the run's vocabulary (its counts order the words and give the mass).
        words: words kept per cluster; ``None`` keeps all.

    Raises:
        ValueError: the head has no clusters, or its size differs from the vocabulary's.
    """
    clusters = _clusters(head)
    if head.n_classes != len(vocab):
        raise ValueError(f"the head scores {head.n_classes} words but the vocabulary has {len(vocab)}")
    total = int(vocab.counts.sum())
    table = [_summary(c, ids.cpu().numpy(), vocab, total, words) for c, ids in enumerate(clusters)]
    table.sort(key=lambda s: (-s.tf_mass, s.cluster))
    return table


def learned_first(table: list[ClusterSummary]) -> tuple[list[ClusterSummary], list[ClusterSummary]]:
    """``(clusters of two or more words, one-word clusters)``, each in ``table``'s order.

    A one-word cluster is a word on its own (a self-organized head's shortlist gives each of its most frequent
    words one: ``the``, ``<unk>``, ``<eos>``); it is heavy, so a table by mass would open with them and hide
    the learned classes a listing is for. Empty clusters stay with the first part, at its end.
    """
    return [s for s in table if s.size != 1], [s for s in table if s.size == 1]


def one_word_note(one_word: list[ClusterSummary], shown: int = 8) -> str:
    """``"4 one-word clusters not listed (the <unk> <eos> N)"``: what :func:`learned_first` set aside."""
    words = [s.words[0] for s in one_word if s.words]
    more = f" ... +{len(words) - shown}" if len(words) > shown else ""
    plural = "s" if len(one_word) != 1 else ""
    return f"{len(one_word)} one-word cluster{plural} not listed ({' '.join(words[:shown])}{more})"


def cluster_of_word(head: Head, vocab: Vocabulary, word: str, words: int | None = 10) -> ClusterSummary:
    """The cluster that holds ``word``.

    Raises:
        ValueError: the head has no clusters, or ``word`` is not in the vocabulary.
    """
    clusters = _clusters(head)
    assert isinstance(head, ClusteredHead)  # (_clusters refuses any other)
    if word not in vocab:
        raise ValueError(f"{word!r} is not in the vocabulary ({len(vocab):,} words)")
    c = int(head.assignment[vocab[word]])
    return _summary(c, clusters[c].cpu().numpy(), vocab, int(vocab.counts.sum()), words)


def token_text(run: Any) -> Callable[[str], str] | None:
    """How the entries of a loaded run's (:func:`~sohsm.train.loading.load_run`) vocabulary are shown: ``None`` for
    words (as they are); a subword run's tokens as the text each stands for, quoted (``Ġthe`` as ``" the"``).

    Raises:
        ValueError: a subword run whose ``tokenizer.json`` is missing or unreadable.
    """
    if getattr(run.config.data, "tokenizer", None) is None:
        return None
    from sohsm.tasks.lm import run_tokenizer

    subwords = run_tokenizer(run.run_dir)
    return lambda token: json.dumps(subwords.readable(token), ensure_ascii=False)


def shown(summaries: list[ClusterSummary], show: Callable[[str], str] | None) -> list[ClusterSummary]:
    """``summaries`` with their words written by ``show`` (:func:`token_text`; ``None``: as they are)."""
    if show is None:
        return summaries
    return [replace(s, words=[show(w) for w in s.words]) for s in summaries]


def token_named(name: str, vocab: Vocabulary, show: Callable[[str], str] | None) -> str:
    """The vocabulary entry a user names: itself where it is one; for subwords (``show``) also the text a token
    stands for, quoted or not (`` the``, and ``the``, which finds `` the`` where the vocabulary lacks ``the``).
    ``name`` unchanged where nothing matches (:func:`cluster_of_word` then says it is not in the vocabulary)."""
    if name in vocab or show is None:
        return name
    by_text = {show(token): token for token in vocab.itos}
    for text in (name, json.dumps(name, ensure_ascii=False), json.dumps(" " + name, ensure_ascii=False)):
        if text in by_text:
            return by_text[text]
    return name
