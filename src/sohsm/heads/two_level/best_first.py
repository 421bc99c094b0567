"""Exact top-k of a two-level head by best-first search over its clusters.

``P(c | h)`` bounds the probability of every word of ``c``, since
``log P(w | h) = log P(c | h) + log P(w | h, c) <= log P(c | h)``. Every row first
scores the words of its most probable cluster; a cluster can then only hold a
better word if its ``log P(c | h)`` exceeds the row's k-th best score so far, so
each unfinished row scores exactly those clusters, all in one grouped pass of the
per-cluster kernel (:mod:`sohsm.heads.two_level.ops.per_cluster`). A well-trained head
visits a few clusters per row; an untrained one, whose cluster distribution is
flat, may visit all of them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.ops.layout import ClusterLayout
from sohsm.heads.two_level.ops.per_cluster import group_rows, in_cluster_logits


class TopKResult(NamedTuple):
    """Exact top-k words of a two-level head.

    Attributes:
        values: ``[B, k]`` log-probabilities, best first.
        indices: ``[B, k]`` word ids.
        clusters_visited: ``[B]`` clusters whose words were scored for each row.
    """

    values: Tensor
    indices: Tensor
    clusters_visited: Tensor


@torch.no_grad()
def best_first_topk(
    cluster_log_probs: Tensor, hidden_w: Tensor, weight: Tensor, layout: ClusterLayout, k: int,
    chunk_pairs: int = 8192,
) -> TopKResult:
    """Exact top-k words of each row by best-first search over the clusters.

    Args:
        cluster_log_probs: ``[B, C]`` normalised ``log P(c | h)`` (``-inf`` for an empty cluster), ``B >= 1``.
        hidden_w: ``[B, d_w]`` the input of the in-cluster softmax, in the weight's dtype.
        weight: ``[N, d_w]`` word vectors, rows grouped by cluster as ``layout`` says.
        layout: where each word's row sits.
        k: how many words per row, ``1 <= k <= N``.
        chunk_pairs: (row, cluster) pairs scored at a time after the first cluster of each row.

    Returns:
        :class:`TopKResult`: values and word ids, best first (equal scores: lower word id
        first), and the clusters visited per row.
    """
    batch, device = cluster_log_probs.size(0), cluster_log_probs.device
    best_values = cluster_log_probs.new_full((batch, k), float("-inf"))
    best_words = torch.zeros(batch, k, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    first = cluster_log_probs.argmax(dim=1)  # [B]
    _merge_cluster_scores(hidden_w, cluster_log_probs, weight, layout, rows, first, best_values, best_words)
    # clusters that may still hold a word better than the row's k-th best (the first one is done)
    open_clusters = cluster_log_probs > best_values[:, -1:]
    open_clusters[rows, first] = False
    visited = 1 + open_clusters.sum(dim=1)
    pair_rows, pair_clusters = open_clusters.nonzero(as_tuple=True)  # row-major: grouped by row
    for lo in range(0, pair_rows.numel(), chunk_pairs):
        _merge_cluster_scores(
            hidden_w, cluster_log_probs, weight, layout, pair_rows[lo : lo + chunk_pairs],
            pair_clusters[lo : lo + chunk_pairs], best_values, best_words,
        )
    return TopKResult(best_values, best_words, visited)


def _merge_cluster_scores(
    hidden_w: Tensor, cluster_log_probs: Tensor, weight: Tensor, layout: ClusterLayout, rows: Tensor,
    clusters: Tensor, best_values: Tensor, best_words: Tensor,
) -> None:
    """Score the words of ``clusters[j]`` for row ``rows[j]`` (pairs sorted by row) and fold
    each row's best into ``best_values`` / ``best_words`` (in place)."""
    k = best_values.size(1)
    groups = group_rows(clusters, cluster_log_probs.size(1))
    pair_order = groups.order  # pairs sorted by cluster
    sorted_rows = rows[pair_order]
    log_probs = F.log_softmax(in_cluster_logits(hidden_w[sorted_rows], weight, layout, groups), dim=1)
    log_probs += cluster_log_probs[sorted_rows, groups.row_cluster][:, None]
    top = min(k, log_probs.size(1))
    values, positions = log_probs.topk(top, dim=1)  # [P, top]
    slots = (layout.offsets_t[groups.row_cluster][:, None] + positions).clamp_(max=weight.size(0) - 1)
    words = layout.word_of_slot[slots]
    # lay each row's candidates side by side: [rows, pairs per row * top], then keep the best k
    unique_rows, per_row = torch.unique_consecutive(rows, return_counts=True)
    width = int(per_row.max()) * top
    rank_in_row = torch.arange(rows.numel(), device=rows.device) - (per_row.cumsum(0) - per_row).repeat_interleave(per_row)
    rank_sorted = rank_in_row[pair_order]
    local_row = torch.searchsorted(unique_rows, sorted_rows)
    column = rank_sorted[:, None] * top + torch.arange(top, device=rows.device)
    cand_values = values.new_full((unique_rows.numel(), width), float("-inf"))
    cand_words = torch.zeros(unique_rows.numel(), width, dtype=torch.long, device=rows.device)
    cand_values[local_row[:, None], column] = values
    cand_words[local_row[:, None], column] = words
    merged_values = torch.cat([best_values[unique_rows], cand_values], dim=1)
    merged_words = torch.cat([best_words[unique_rows], cand_words], dim=1)
    # best k by score, equal scores by word id: the answer does not depend on cluster numbering
    by_word = merged_words.argsort(dim=1, stable=True)
    merged_values, merged_words = merged_values.gather(1, by_word), merged_words.gather(1, by_word)
    pick = merged_values.argsort(dim=1, descending=True, stable=True)[:, :k]
    best_values[unique_rows] = merged_values.gather(1, pick)
    best_words[unique_rows] = merged_words.gather(1, pick)
