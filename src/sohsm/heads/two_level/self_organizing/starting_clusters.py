"""The self-organized head's starting clusters, and where it keeps the words training never shows.

A tokenizer's vocabulary can hold far more rows than a corpus uses: WikiText-2's training split uses about 27,000 of
Llama 3's 128,256 tokens. A word of count 0 has no statistics, so Algorithm 1 places it by its tie rule alone,
among the words the corpus uses; their in-cluster softmax then gives it probability that a used word would need.

``unseen_words="apart"`` keeps those words in clusters of their own: ``J = ceil(unseen / max_size)`` clusters more
than ``n_clusters``, after them, hold the unseen words alone, from the start and at every re-assignment, and
Algorithm 1 places the seen words over the ``n_clusters`` as before. The cluster softmax learns to give those ``J``
clusters little mass (as adaptive softmax's last tail cluster, which holds the rarest words), and the seen words'
clusters hold seen words only: a target's in-cluster softmax no longer scores the unseen words.
``"spread"`` places unseen words as every other word: by the initial rule, then by Algorithm 1's tie order.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from sohsm.clustering import frequency_binning, random_assignment

#: where a self-organized head keeps the words of count 0 (``unseen_words``)
UNSEEN_WORDS = ("spread", "apart")


class UnseenApart(NamedTuple):
    """``unseen_words="apart"``'s plan: which words Algorithm 1 places, and how many clusters it leaves alone.

    Attributes:
        seen: ``[S]`` ids of the self-organised words with a count: the only words re-assigned.
        reserved: ``J``, the clusters after the ``n_clusters`` learned ones, which hold the unseen words alone.
    """

    seen: Tensor
    reserved: int


def split_by_frequency(counts: Tensor, shortlist: int) -> tuple[Tensor, Tensor]:
    """``(the shortlist most frequent words, the rest)``, each in descending count (ties: lower id first)."""
    order = torch.sort(counts.to(torch.float64), descending=True, stable=True).indices
    return order[:shortlist], order[shortlist:]


def plan_apart(counts: Tensor, tail: Tensor, max_size: int) -> UnseenApart | None:
    """The plan for the self-organised words ``tail``; ``None`` when every one has a count (nothing to keep apart)."""
    unseen = counts[tail] == 0
    n_unseen = int(unseen.sum())
    if n_unseen == 0:
        return None
    return UnseenApart(tail[~unseen], math.ceil(n_unseen / max_size))


def starting_assignment(counts: Tensor | None, n_classes: int, n_clusters: int, shortlist: int, init: str,
                        seed: int, unseen_words: str, max_size: int
                        ) -> tuple[Tensor | str, Tensor | None, UnseenApart | None]:
    """``(assignment, tail, apart)``: the starting clusters of the head's words (or ``init``'s name, for
    :class:`~sohsm.heads.two_level.softmax.TwoLevelSoftmax` to apply), the self-organised words in descending count
    (``None`` without a shortlist or ``"apart"``), and ``"apart"``'s plan (its ``reserved`` clusters come in
    addition to ``shortlist + n_clusters``).

    The ``shortlist`` most frequent words take clusters ``0 .. shortlist - 1``, one each; the rest share the
    ``n_clusters`` learned clusters after them, by ``init`` (``"random"`` or ``"frequency"``), but for the unseen
    ones where ``unseen_words="apart"``: they take the reserved clusters after those, in turn.
    """
    if unseen_words not in UNSEEN_WORDS:
        raise ValueError(f"unseen_words must be one of {UNSEEN_WORDS}, got {unseen_words!r}")
    if unseen_words == "apart" and counts is None:
        raise ValueError("unseen_words='apart' needs the word counts (counts=...): they say which words are unseen")
    nothing_apart = unseen_words == "spread" or (counts is not None and not bool((counts == 0).any()))
    if not shortlist and nothing_apart:
        return init, None, None  # every word self-organised as the two-level head starts them
    assert counts is not None  # a shortlist and "apart" are refused without them
    short, tail = split_by_frequency(counts, shortlist)
    apart = plan_apart(counts, tail, max_size) if unseen_words == "apart" else None
    placed = tail if apart is None else apart.seen
    # fewer words than clusters (the unseen words apart, on a small corpus): the clusters past them start empty
    over = min(n_clusters, placed.numel())
    if not over:
        clusters = torch.empty(0, dtype=torch.long)
    elif init == "random":
        clusters = random_assignment(placed.numel(), over, torch.Generator().manual_seed(seed))
    else:
        clusters = frequency_binning(counts[placed], over)
    assignment = torch.empty(n_classes, dtype=torch.long)
    assignment[short] = torch.arange(shortlist)
    assignment[placed] = clusters + shortlist
    if apart is not None:  # the unseen words in turn over the reserved clusters: sizes within one of each other
        unseen = tail[counts[tail] == 0]
        assignment[unseen] = shortlist + n_clusters + torch.arange(unseen.numel()) % apart.reserved
    return assignment, tail if shortlist else None, apart
