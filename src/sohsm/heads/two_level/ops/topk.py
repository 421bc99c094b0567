"""Exact top-k of a two-level head with static shapes: a certificate instead of a search.

Best-first search (:meth:`TwoLevelSoftmax.search_topk`) visits, per row, every cluster whose
``log P(c | h)`` beats the row's k-th best word so far. Which clusters those are is only known
by reading them back, so the search synchronises with the host several times a call (the
pairs' ``nonzero``, the per-cluster grouping). Here each row scores the words of its ``M``
most probable clusters, all at once with shapes fixed by ``B``, ``M`` and the largest cluster,
and keeps the best ``k``. The answer is exact for every row whose k-th best word is at least as
probable as its ``(M + 1)``-th cluster, since ``P(w | h) <= P(c | h)`` for any word ``w`` of a
cluster ``c``: the result says which rows that holds for (:attr:`DeviceTopK.certified`), on
the device. A caller that must be exact everywhere reads that flag once and searches the rest
(:meth:`TwoLevelSoftmax.topk` on a sync-free backend), one synchronisation where the search has
several; a trained head certifies nearly every row with a few clusters.

Over explicit tensors, as every op here: the head's :meth:`~sohsm.heads.TwoLevelSoftmax.device_topk` hands them in.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.ops.grouped import tiled_logits
from sohsm.heads.two_level.ops.layout import ClusterLayout

#: clusters a row scores by default: a trained head puts most of a row's mass in a few
DEFAULT_CLUSTERS = 4
#: bytes of word vectors gathered at a time (the rest of a call's memory is its ``[B * M, width]`` scores):
#: 256k words, d 1024 and 1,024 rows would otherwise gather about 3.9 GB at once
GATHER_BYTES = 64 * 2**20


class DeviceTopK(NamedTuple):
    """The best ``k`` words among each row's ``M`` most probable clusters.

    Attributes:
        values: ``[B, k]`` log-probabilities, best first (``-inf`` where those clusters hold fewer
            than ``k`` words).
        indices: ``[B, k]`` word ids; equal scores in word-id order.
        certified: ``[B]`` True where the row's answer is the exact top-k of the whole vocabulary.
    """

    values: Tensor
    indices: Tensor
    certified: Tensor


def topk_in_clusters(cluster_log_probs: Tensor, hidden_w: Tensor, weight: Tensor, layout: ClusterLayout, width: int,
                     k: int, clusters: int, block_m: int = 16) -> DeviceTopK:
    """The top ``k`` words among each row's ``clusters`` most probable clusters, reading nothing back.

    Every shape follows from the inputs', ``k``, ``clusters`` and ``width``. The (row, cluster) pairs are laid out
    in tiles of one cluster each (:func:`~sohsm.heads.two_level.ops.grouped.tiled_logits`, the sync-free training
    path's product), so the word vectors are gathered once per tile, not once per pair.

    Args:
        cluster_log_probs: ``[B, C]`` normalised ``log P(c | h)``.
        hidden_w: ``[B, d_w]`` the word softmax's input, in the weight's dtype.
        weight: ``[N, d_w]`` word vectors grouped by cluster as ``layout`` says.
        layout: where each word's row sits.
        width: at least the largest cluster.
        k: words per row, ``1 <= k <= N`` (checked by the caller).
        clusters: clusters scored per row (``M``), ``1 <= M <= C`` (checked by the caller); ``C`` is always exact.
        block_m: (row, cluster) pairs per tile.
    """
    batch, device = cluster_log_probs.size(0), cluster_log_probs.device
    n_words, n_clusters = weight.size(0), cluster_log_probs.size(1)
    m = clusters
    ranked = cluster_log_probs.topk(min(m + 1, n_clusters), dim=1)
    top_log_probs, top_clusters = ranked.values[:, :m], ranked.indices[:, :m]  # [B, M]
    # the best any word outside the M clusters can do: the (M + 1)-th cluster's log-probability
    bound = (ranked.values[:, m] if m < n_clusters
             else cluster_log_probs.new_full((batch,), float("-inf")))

    pair_cluster = top_clusters.reshape(-1)  # [B * M], row-major
    pair_row = torch.arange(batch, device=device).repeat_interleave(m)
    logits = _pair_logits(hidden_w, weight, pair_row, pair_cluster, layout.offsets_t, width, block_m)
    columns = torch.arange(width, device=device)
    sizes = layout.sizes_t[pair_cluster]  # [B * M]
    logits = logits.masked_fill(columns >= sizes[:, None], float("-inf"))
    log_probs = F.log_softmax(logits, dim=1) + top_log_probs.reshape(-1, 1)  # [B * M, width]
    slots = (layout.offsets_t[pair_cluster][:, None] + columns).clamp(max=n_words - 1)
    words = layout.word_of_slot[slots]  # [B * M, width]
    # each row's candidates side by side, then the best k; equal scores by word id
    candidates = log_probs.reshape(batch, m * width)
    candidate_words = words.reshape(batch, m * width)
    by_word = candidate_words.argsort(dim=1, stable=True)
    candidates, candidate_words = candidates.gather(1, by_word), candidate_words.gather(1, by_word)
    if candidates.size(1) < k:  # fewer slots than k: pad with nothing
        pad = k - candidates.size(1)
        candidates = F.pad(candidates, (0, pad), value=float("-inf"))
        candidate_words = F.pad(candidate_words, (0, pad), value=0)
    pick = candidates.argsort(dim=1, descending=True, stable=True)[:, :k]
    values, indices = candidates.gather(1, pick), candidate_words.gather(1, pick)
    kth = values[:, -1]
    certified = kth > bound  # strictly: a word outside can tie at most with its cluster, never beat it
    return DeviceTopK(values, indices, certified)


def _pair_logits(hidden: Tensor, weight: Tensor, pair_row: Tensor, pair_cluster: Tensor, offsets: Tensor,
                 width: int, block_m: int) -> Tensor:
    """``[P, width]`` scores of pair ``p``'s row against the first ``width`` word vectors of its cluster's block."""
    max_rows = max(1, GATHER_BYTES // (weight.size(1) * weight.element_size()))
    logits = tiled_logits(hidden[pair_row], weight, pair_cluster, offsets, width, block_m, max_rows)
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
