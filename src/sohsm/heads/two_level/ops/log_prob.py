"""A two-level training step's log-probabilities over explicit tensors: the cluster softmax, then a backend's.

    log P(w | h) = log softmax_c(h_c . U^C)[C(w)] + log softmax_{w' in C(w)}(h_w . U^V_w')[w]

:func:`cluster_log_softmax` is the one place the cluster softmax is normalised (the training step,
exact evaluation and the device top-k all call it); :func:`two_level_log_prob` adds the in-cluster
part by a backend of :mod:`sohsm.heads.two_level.ops.backends`; :func:`scored_log_prob` scores every word from
the word vectors as they are stored (each band's weight in its own columns, never widened to one
``N x (d + d/div + ...)`` matrix), the evaluation path.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.base import upcast
from sohsm.heads.two_level.ops.backends import BackendInfo
from sohsm.heads.two_level.ops.gradient_sink import GradientSink
from sohsm.heads.two_level.ops.layout import ClusterLayout


def cluster_log_softmax(cluster_logits: Tensor, empty_clusters: Tensor | None) -> Tensor:
    """``[B, C]`` ``log P(c | h)``, normalised in float32 or wider; a cluster without words (``empty_clusters``,
    ``[C]`` bool, or ``None``) gets probability 0."""
    logits = upcast(cluster_logits)
    if empty_clusters is not None:
        logits = logits.masked_fill(empty_clusters, float("-inf"))
    return F.log_softmax(logits, dim=1)


class TwoLevelLogProb(NamedTuple):
    """The parts of a batch's log-probabilities; ``cluster_part + word_part`` is ``log P(target | h)``.

    Attributes:
        cluster_log_probs: ``[B, C]`` ``log P(c | h)`` of every cluster.
        cluster_part: ``[B]`` ``log P(C(t) | h)``.
        word_part: ``[B]`` ``log P(t | h, C(t))``.
    """

    cluster_log_probs: Tensor
    cluster_part: Tensor
    word_part: Tensor


def two_level_log_prob(cluster_logits: Tensor, hidden_w: Tensor, weight: Tensor, target: Tensor, assignment: Tensor,
                       layout: ClusterLayout, backend: BackendInfo, width: int,
                       sink: GradientSink | None = None) -> TwoLevelLogProb:
    """``log P(target | h)`` in its two parts, the in-cluster one by ``backend``.

    Args:
        cluster_logits: ``[B, C]`` ``h_c . U^C + layout.empty_bias`` (a cluster without words already at ``-inf``:
            the bias of the product, one op fewer than masking it after).
        hidden_w: ``[B, d_w]`` the input of the in-cluster softmax.
        weight: ``[N, d_w]`` word vectors, rows grouped by cluster as ``layout`` says.
        target: ``[B]`` word ids.
        assignment: ``[N]`` cluster of every word (the one ``layout`` was derived from).
        layout: where each word's row sits.
        backend: the in-cluster backend.
        width: the static width of a sync-free backend's scores (at least the largest cluster).
        sink: where a backend that writes the weight's gradient puts it.
    """
    cluster_log_probs = cluster_log_softmax(cluster_logits, None)  # [B, C]
    target_cluster, target_position = layout.cluster_and_position[:, target]  # of ``assignment``, by the layout
    cluster_part = cluster_log_probs.gather(1, target_cluster[:, None]).squeeze(1)
    word_part = backend.kernel(hidden_w, weight, target_cluster, target_position, layout, width, sink)
    return TwoLevelLogProb(cluster_log_probs, cluster_part, word_part)


#: a cluster whose exponentiated scores, taken below the row's best score, sum to less than this many times the
#: dtype's smallest normal number is normalised again with its own maximum (its terms may have lost digits)
UNDERFLOW_MARGIN = 2.0 ** 40
#: each cluster's sum is taken in this many interleaved parts (row ``r`` adds into part ``r % SPREAD``), then added:
#: rows grouped by cluster would otherwise add into one place one after another, each add waiting for the last
SPREAD = 16


class ScoredRows(NamedTuple):
    """Where the rows of word vectors stacked (the weight, or each band's weight in turn) sit, for
    :func:`scored_log_prob`: derived once per layout (:func:`scored_rows`).

    Attributes:
        cluster_of_row: ``[N]`` the cluster of each row.
        spread_cluster: ``[N]`` ``cluster_of_row * SPREAD + row % SPREAD`` (:data:`SPREAD`).
        row_of_word: ``[N]`` the row of each word.
        empty_clusters: ``[C]`` bool, clusters without words.
    """

    cluster_of_row: Tensor
    spread_cluster: Tensor
    row_of_word: Tensor
    empty_clusters: Tensor


def scored_rows(layout: ClusterLayout, bands=None) -> ScoredRows:
    """The :class:`ScoredRows` of ``layout``'s weight (rows in slot order), or with ``bands``
    (:class:`~sohsm.heads.two_level.word_bands.BandRows`) of the bands' weights stacked, band 0's rows first. Kept
    on the layout, keyed by the band rows and the layout's rewrites in place (:meth:`ClusterLayout.update_from`)."""
    key = (id(bands), layout.rewrites, layout.bands_version)
    cached = layout.scored_rows
    if cached is None or cached[0] != key:
        if bands is None:
            cluster_of_row, row_of_word = layout.cluster_of_slot, layout.slot_of_word
        else:
            cluster_of_row, row_of_word = layout.cluster_of_slot[torch.cat(bands.slots)], bands.stacked_row_of_word
        spread = cluster_of_row * SPREAD + torch.arange(cluster_of_row.numel(), device=cluster_of_row.device) % SPREAD
        cached = (key, ScoredRows(cluster_of_row, spread, row_of_word, layout.empty_clusters.clone()))
        layout.scored_rows = cached
    return cached[1]


def scored_log_prob(cluster_log_probs: Tensor, hiddens: Sequence[Tensor], weights: Sequence[Tensor],
                    rows: ScoredRows) -> Tensor:
    """Exact ``[B, N]`` ``log P(w | h)`` in word-id order, each weight scored where it is stored.

    The rows of ``weights`` stacked (``weights[0]``'s first) are the ``N`` words, as ``rows`` says, row ``r`` scored
    against ``hiddens[i]`` (``[B, d_i]``, the hidden state's view for its weight ``i``). Without autograd each
    weight's product is written into its own columns of one ``[B, N]`` buffer; each cluster's log-sum-exp is one
    ``index_add`` of ``exp(score - row max)`` (a cluster far below the row's best is normalised again with its own
    maximum, :data:`UNDERFLOW_MARGIN`); the scores are then shifted in place and put in word order by one gather.
    A few passes over ``B x N`` beside the products of the weights as stored (with bands several times fewer
    than a full softmax's). With autograd (a gradient wanted through it) the same, by differentiable ops.

    Args:
        cluster_log_probs: ``[B, C]`` from :func:`cluster_log_softmax`.
        hiddens: one ``[B, d_i]`` view of the hidden state per weight.
        weights: ``[n_i, d_i]`` word vectors, ``sum n_i = N``.
        rows: where each stacked row sits (:func:`scored_rows`).
    """
    n_rows = sum(w.size(0) for w in weights)
    batch, n_clusters = cluster_log_probs.size(0), cluster_log_probs.size(1)
    differentiable = torch.is_grad_enabled() and (any(w.requires_grad for w in weights)
                                                  or any(h.requires_grad for h in hiddens))
    compute = upcast(weights[0].new_empty(0)).dtype
    if differentiable:
        logits = torch.cat([upcast(F.linear(h.to(w.dtype), w)) for h, w in zip(hiddens, weights)], dim=1)
    else:
        logits = cluster_log_probs.new_empty(batch, n_rows, dtype=compute)
        start = 0
        for h, w in zip(hiddens, weights):
            out = logits[:, start : start + w.size(0)]
            if w.dtype == compute:
                torch.mm(h.to(w.dtype), w.t(), out=out)
            else:  # a half-precision weight: its product, then widened into the buffer
                out.copy_(h.to(w.dtype) @ w.t())
            start += w.size(0)
    if differentiable or batch == 0 or n_rows == 0:
        return _normalised_per_cluster(logits, cluster_log_probs, rows.cluster_of_row)[:, rows.row_of_word]
    with torch.no_grad():
        peak = logits.amax(dim=1, keepdim=True)  # [B, 1]
        exp = torch.sub(logits, peak).exp_()
        sums = logits.new_zeros(batch, n_clusters * SPREAD).index_add_(1, rows.spread_cluster, exp)
        sums = sums.view(batch, n_clusters, SPREAD).sum(dim=2)
        if bool(((sums < torch.finfo(compute).tiny * UNDERFLOW_MARGIN) & ~rows.empty_clusters).any()):
            return _normalised_per_cluster(logits, cluster_log_probs, rows.cluster_of_row)[:, rows.row_of_word]
        normaliser = sums.log_().add_(peak).sub_(cluster_log_probs)  # [B, C]: log Z_c - log P(c | h)
        logits.sub_(torch.index_select(normaliser, 1, rows.cluster_of_row, out=exp))
        # into the buffer already written (a fresh one's pages would fault in again): two B x N buffers a call
        return torch.index_select(logits, 1, rows.row_of_word, out=exp)


def _normalised_per_cluster(logits: Tensor, cluster_log_probs: Tensor, cluster_of_row: Tensor) -> Tensor:
    """``[B, N]`` log-probabilities in row order, each cluster's log-sum-exp taken with its own maximum."""
    index = cluster_of_row.expand_as(logits)
    shape = (logits.size(0), cluster_log_probs.size(1))
    with torch.no_grad():  # a per-cluster maximum only stabilises the log-sum-exp
        peak = logits.new_full(shape, float("-inf")).scatter_reduce(1, index, logits, "amax")
        peak = peak.nan_to_num(neginf=0.0)
    sums = logits.new_zeros(shape).scatter_add(1, index, (logits - peak.gather(1, index)).exp())
    normaliser = (sums.log() + peak).gather(1, index)
    return logits - normaliser + cluster_log_probs.gather(1, index)
