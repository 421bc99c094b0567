"""Exact top-k of a two-level head on the device: static shapes, and a certificate instead of a search.

Best-first search (:meth:`TwoLevelSoftmax.search_topk`) visits, per row, every cluster whose
``log P(c | h)`` beats the row's k-th best word so far. Which clusters those are is only known
by reading them back, so the search synchronises with the host several times a call (the
pairs' ``nonzero``, the per-cluster grouping). Here each row scores the words of its ``M``
most probable clusters, all at once with shapes fixed by ``B``, ``M`` and the largest cluster,
and keeps the best ``k``. The answer is exact for every row whose k-th best word is at least as
probable as its ``(M + 1)``-th cluster, since ``P(w | h) <= P(c | h)`` for any word ``w`` of a
cluster ``c``: the result says which rows that holds for (:attr:`DeviceTopK.certified`), on
the device. A caller that must be exact everywhere reads that flag once and searches the rest
(:func:`exact_topk`), one synchronisation where the search has several; a trained head
certifies nearly every row with a few clusters.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.ops.grouped import tiled_logits
from sohsm.heads.two_level.ops.layout import ClusterLayout
from sohsm.heads.two_level.ops.log_prob import cluster_log_softmax

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


def device_topk(head, hidden: Tensor, k: int, clusters: int = DEFAULT_CLUSTERS, block_m: int = 16) -> DeviceTopK:
    """The top ``k`` words of a two-level ``head`` among each row's ``clusters`` most probable clusters.

    Reads nothing back to the host: every shape follows from ``hidden``'s, ``k``, ``clusters``
    and the head's largest cluster. The (row, cluster) pairs are laid out in tiles of one
    cluster each (:func:`~sohsm.heads.two_level.ops.grouped.tiled_logits`, the sync-free training path's product),
    so the word vectors are gathered once per tile, not once per pair.

    Args:
        head: a :class:`~sohsm.heads.TwoLevelSoftmax` (or a subclass, the self-organized head).
        hidden: ``[*, in_features]`` hidden states.
        k: words per row, in ``[1, N]``.
        clusters: clusters scored per row (``M``), in ``[1, C]``; ``C`` is always exact.
        block_m: (row, cluster) pairs per tile.

    Returns:
        :class:`DeviceTopK`.

    Raises:
        ValueError: ``k`` or ``clusters`` out of range, or ``hidden`` of the wrong shape.
    """
    k = head._check_k(k)
    if isinstance(clusters, bool) or not isinstance(clusters, int) or not 1 <= clusters <= head.n_clusters:
        raise ValueError(f"clusters must be an integer in [1, {head.n_clusters}], got {clusters!r}")
    hidden = head._flatten_hidden(hidden)
    # compiled, the layout is taken as last derived (deriving it checks the assignment's version: a host read)
    layout = head._layout_cache if torch.compiler.is_compiling() else head._layout
    hidden_c, hidden_w = head._split_hidden(hidden)
    cluster_log_probs = cluster_log_softmax(F.linear(hidden_c, head.cluster_weight), layout.empty_clusters)  # [B, C]
    weight = head._word_weight()  # with bands, widened to one matrix
    return topk_in_clusters(cluster_log_probs, hidden_w.to(weight.dtype), weight, layout,
                            head._sync_free_width(), k, clusters, block_m)


def topk_in_clusters(cluster_log_probs: Tensor, hidden_w: Tensor, weight: Tensor, layout: ClusterLayout, width: int,
                     k: int, clusters: int, block_m: int = 16) -> DeviceTopK:
    """:func:`device_topk` over explicit tensors: ``cluster_log_probs`` ``[B, C]`` (normalised), ``hidden_w``
    ``[B, d_w]`` in the weight's dtype, ``weight`` ``[N, d_w]`` grouped by cluster as ``layout`` says, ``width`` at
    least the largest cluster; ``1 <= k <= N`` and ``1 <= clusters <= C`` checked by the caller."""
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


def exact_topk(head, hidden: Tensor, k: int, clusters: int = DEFAULT_CLUSTERS) -> tuple[Tensor, Tensor]:
    """``log_prob(hidden).topk(k)``: :func:`device_topk`, then best-first search for the rows it could not
    certify (one read of the certificate; none searched when all rows are certified)."""
    hidden = head._flatten_hidden(hidden)
    result = device_topk(head, hidden, k, min(clusters, head.n_clusters))
    uncertified = (~result.certified).nonzero().squeeze(1)  # the one synchronisation
    if uncertified.numel() == 0:
        return result.values, result.indices
    rest = head.search_topk(hidden[uncertified], k)
    values, indices = result.values.clone(), result.indices.clone()
    values[uncertified], indices[uncertified] = rest.values, rest.indices
    return values, indices
