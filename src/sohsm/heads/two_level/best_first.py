"""Exact top-k of a two-level head by best-first search over its clusters.

``P(c | h)`` bounds the probability of every word of ``c``, since
``log P(w | h) = log P(c | h) + log P(w | h, c) <= log P(c | h)``. Every row first
scores the words of its most probable cluster; a cluster can then only hold a
better word if its ``log P(c | h)`` exceeds the row's k-th best score so far, so
each unfinished row scores exactly those clusters, all in one grouped pass of the
per-cluster kernel (:mod:`sohsm.heads.two_level.ops.per_cluster`), with bands each band's
weight where it is stored. A well-trained head visits a few clusters per row; an untrained one,
whose cluster distribution is flat, would visit most of them: such a row is finished by the
dense path instead (every word scored at once), decided before each round by how many words
its open clusters hold (:data:`DENSE_FRACTION`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.ops.layout import ClusterLayout
from sohsm.heads.two_level.ops.per_cluster import RowGroups, banded_in_cluster_logits, group_rows


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


#: a row whose clusters still open hold more than this share of the vocabulary is finished by the dense path
#: (every word scored at once, :func:`ordered_topk`): its cluster distribution is too flat for the search to pay
DENSE_FRACTION = 0.25


@torch.no_grad()
def best_first_topk(
    cluster_log_probs: Tensor, hidden_w: Tensor, weight: Tensor | tuple[Tensor, ...], layout: ClusterLayout, k: int,
    chunk_pairs: int = 8192, *, bands=None, dense: Callable[[Tensor], Tensor] | None = None,
    dense_fraction: float = DENSE_FRACTION,
) -> TopKResult:
    """Exact top-k words of each row by best-first search over the clusters.

    Each row scores its most probable cluster, then in rounds its next 1, 2, 4, ... most probable clusters that
    may still hold a better word than its k-th best so far (``log P(c | h)`` above it), until none may. Before each
    round, a row whose open clusters hold more than ``dense_fraction`` of the words is handed to ``dense`` (its
    exact log-probabilities over every word) instead: a flat cluster distribution costs no more than a dense pass.

    Args:
        cluster_log_probs: ``[B, C]`` normalised ``log P(c | h)`` (``-inf`` for an empty cluster), ``B >= 1``.
        hidden_w: ``[B, d_w]`` the input of the in-cluster softmax, in the weight's dtype (with bands, every band's
            view side by side).
        weight: ``[N, d_w]`` word vectors, rows grouped by cluster as ``layout`` says; with ``bands``, each band's
            weight (a tuple), scored where it is stored.
        layout: where each word's row sits.
        k: how many words per row, ``1 <= k <= N``.
        chunk_pairs: (row, cluster) pairs scored at a time.
        bands: the layout's :class:`~sohsm.heads.two_level.word_bands.BandRows` where ``weight`` is per band.
        dense: ``rows [R] -> [R, N]`` exact log-probabilities of those rows (``None``: always search).
        dense_fraction: the share of the words above which a row takes ``dense``.

    Returns:
        :class:`TopKResult`: values and word ids, best first (equal scores: lower word id
        first), and the clusters visited per row (every non-empty cluster for a row done densely).
    """
    batch, device = cluster_log_probs.size(0), cluster_log_probs.device
    n_clusters, n_words = cluster_log_probs.size(1), layout.word_of_slot.numel()
    best_values = cluster_log_probs.new_full((batch, k), float("-inf"))
    best_words = torch.zeros(batch, k, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    first = cluster_log_probs.argmax(dim=1)  # [B]
    merge = functools.partial(_merge_cluster_scores, hidden_w, cluster_log_probs, weight, layout,
                              best_values=best_values, best_words=best_words, bands=bands)
    visited = torch.zeros(batch, n_clusters, dtype=torch.bool, device=device)
    sizes = layout.sizes_t.to(cluster_log_probs.dtype)
    searched = torch.ones(batch, dtype=torch.bool, device=device)
    if dense is not None:
        # before any word is scored: where even the clusters above the average word of the row's best cluster
        # hold over dense_fraction of the words, the search would not pay (a guess; exactness does not rest on it)
        best = cluster_log_probs.gather(1, first[:, None])
        likely = cluster_log_probs >= best - sizes[first][:, None].log()
        flat = (likely.to(sizes.dtype) @ sizes) > dense_fraction * n_words
        if bool(flat.any()):
            flat_rows = flat.nonzero().squeeze(1)
            best_values[flat_rows], best_words[flat_rows] = ordered_topk(dense(flat_rows), k)
            visited[flat_rows] = ~layout.empty_clusters
            searched[flat_rows] = False
    if bool(searched.all()):
        merge(rows, first)
    elif bool(searched.any()):
        merge(rows[searched], first[searched])
    visited[rows[searched], first[searched]] = True
    width = 1
    while True:
        # clusters that may still hold a word better than the row's k-th best
        open_clusters = (cluster_log_probs > best_values[:, -1:]) & ~visited & searched[:, None]
        if dense is not None:
            flat = (open_clusters.to(sizes.dtype) @ sizes) > dense_fraction * n_words
            if bool(flat.any()):
                flat_rows = flat.nonzero().squeeze(1)
                best_values[flat_rows], best_words[flat_rows] = ordered_topk(dense(flat_rows), k)
                visited[flat_rows] = ~layout.empty_clusters
                open_clusters[flat_rows] = False
        if not bool(open_clusters.any()):
            break
        top = cluster_log_probs.masked_fill(~open_clusters, float("-inf")).topk(min(width, n_clusters), dim=1)
        pair_rows, column = (top.values > float("-inf")).nonzero(as_tuple=True)  # row-major: grouped by row
        pair_clusters = top.indices[pair_rows, column]
        for lo in range(0, pair_rows.numel(), chunk_pairs):
            merge(pair_rows[lo : lo + chunk_pairs], pair_clusters[lo : lo + chunk_pairs])
        visited[pair_rows, pair_clusters] = True
        width *= 2
    return TopKResult(best_values, best_words, visited.sum(dim=1))


def ordered_topk(log_probs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``log_probs.topk(k)`` with equal scores in word-id order (lower first), as the search orders them: the
    ``k`` best of each row, and where scores equal to the k-th reach past ``k``, the lowest ids among them."""
    values, indices = log_probs.topk(k, dim=1)
    kth = values[:, -1:]
    tied_past = (log_probs >= kth).sum(dim=1) > k
    if bool(tied_past.any()):  # rows with more equal scores than places: a stable sort decides
        tied_rows = tied_past.nonzero().squeeze(1)
        order = log_probs[tied_rows].argsort(dim=1, descending=True, stable=True)[:, :k]
        indices[tied_rows], values[tied_rows] = order, log_probs[tied_rows].gather(1, order)
    by_word = indices.argsort(dim=1, stable=True)
    values, indices = values.gather(1, by_word), indices.gather(1, by_word)
    pick = values.argsort(dim=1, descending=True, stable=True)
    return values.gather(1, pick), indices.gather(1, pick)


def _merge_cluster_scores(
    hidden_w: Tensor, cluster_log_probs: Tensor, weight: Tensor | tuple[Tensor, ...], layout: ClusterLayout,
    rows: Tensor, clusters: Tensor, best_values: Tensor, best_words: Tensor, bands=None,
) -> None:
    """Score the words of ``clusters[j]`` for row ``rows[j]`` (pairs sorted by row) and fold
    each row's best into ``best_values`` / ``best_words`` (in place)."""
    k = best_values.size(1)
    groups = group_rows(clusters, cluster_log_probs.size(1))
    pair_order = groups.order  # pairs sorted by cluster
    sorted_rows = rows[pair_order]
    if bands is None:
        assert isinstance(weight, Tensor)  # one weight
        logits = _pair_logits(hidden_w[sorted_rows], weight, layout, groups)
    else:
        assert isinstance(weight, tuple)  # each band's weight
        logits = banded_in_cluster_logits(hidden_w[sorted_rows], weight, bands, layout, groups)
    log_probs = F.log_softmax(logits, dim=1)
    log_probs += cluster_log_probs[sorted_rows, groups.row_cluster][:, None]
    top = min(k, log_probs.size(1))
    values, positions = ordered_topk(log_probs, top)  # [P, top]; equal scores: lower position (word id) first
    slots = (layout.offsets_t[groups.row_cluster][:, None] + positions).clamp_(max=layout.word_of_slot.numel() - 1)
    words = layout.word_of_slot[slots]
    # lay each row's candidates side by side: [rows, pairs per row * top], then keep the best k
    unique_rows, per_row = torch.unique_consecutive(rows, return_counts=True)
    width = int(per_row.max()) * top
    rank_in_row = (torch.arange(rows.numel(), device=rows.device)
                   - (per_row.cumsum(0) - per_row).repeat_interleave(per_row))
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


def _pair_logits(hidden_sorted: Tensor, weight: Tensor, layout: ClusterLayout, groups: RowGroups) -> Tensor:
    """``[P, S]`` each sorted row's scores against its cluster's words (``-inf`` past its size): one product per
    present cluster on its block of ``weight``, as the per-cluster kernel's ``in_cluster_logits`` computes them,
    taking each block as it is reached (a search reaches a few clusters, not every one)."""
    sizes, offsets = layout.sizes, layout.offsets
    width = max([1] + [sizes[c] for c in groups.clusters])
    logits = hidden_sorted.new_full((hidden_sorted.size(0), width), float("-inf"))
    for c, h, out in zip(groups.clusters, hidden_sorted.split(groups.row_counts), logits.split(groups.row_counts)):
        if sizes[c] == 1:  # a word alone in its cluster has in-cluster log-probability 0 whatever it scores
            out[:, 0] = 0.0
        else:
            torch.mm(h, weight[offsets[c] : offsets[c] + sizes[c]].t(), out=out[:, : sizes[c]])
    return logits
