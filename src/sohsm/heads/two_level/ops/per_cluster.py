"""The per-cluster backend of the in-cluster softmax: rows grouped by cluster, one product per cluster.

    log P(w | h, C(w)) = log softmax_{w' in C(w)}(h_w . U^V_w')[w]

The word vectors are stored grouped by cluster (:class:`~sohsm.heads.two_level.ops.layout.ClusterLayout`),
so each cluster a batch holds costs one matrix product on a contiguous block forward and two
backward, and its gradient is one contiguous block, written into ``weight.grad`` through a
:class:`~sohsm.heads.two_level.ops.gradient_sink.GradientSink` (or returned, without one). With
differentiated dimensions each band has its own weight (:mod:`sohsm.heads.two_level.word_bands`), and
:class:`BandedInClusterLogProb` scores a cluster band by band: its words of band ``b`` are consecutive
rows of band ``b``'s weight, scored against band ``b``'s view of the hidden state.

The op reads the cluster counts of a batch back to the host (``.tolist()``) and runs one product
per present cluster; :mod:`sohsm.heads.two_level.ops.grouped` computes the same scores with static
shapes (the sync-free backends). The best-first search (:mod:`sohsm.heads.two_level.best_first`)
scores (row, cluster) pairs with :func:`in_cluster_logits`.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.reused_gradient import gradient_route
from sohsm.heads.two_level.ops.gradient_sink import GradientSink, write_pieces
from sohsm.heads.two_level.ops.layout import ClusterLayout


class RowGroups(NamedTuple):
    """Rows of a batch grouped by the cluster whose words they score."""

    order: Tensor  # [B] row permutation that sorts rows by cluster
    row_cluster: Tensor  # [B] cluster of each sorted row
    clusters: list[int]  # present clusters, ascending
    row_counts: list[int]  # rows of each present cluster, in the sorted batch


def group_rows(row_cluster: Tensor, n_clusters: int) -> RowGroups:
    """Sort rows by ``row_cluster`` (``[B]``, stable) and count each present cluster's rows (read back)."""
    row_cluster_sorted, order = torch.sort(row_cluster, stable=True)
    counts = torch.bincount(row_cluster, minlength=n_clusters).tolist()
    clusters = [c for c, n in enumerate(counts) if n]
    return RowGroups(order, row_cluster_sorted, clusters, [counts[c] for c in clusters])


def _columns(block: Tensor, positions: slice | Tensor) -> Tensor:
    """``block``'s columns at a band group's positions (its cluster's words): a view for a slice, a copy else."""
    return block[:, positions] if isinstance(positions, slice) else block.index_select(1, positions)


def _band_blocks(tensor: Tensor, columns: list[slice], sizes: list[int]) -> list[list[Tensor]]:
    """``[band][block]``: each band's columns of ``tensor``, split in row blocks of ``sizes`` (one call a band)."""
    return [tensor[:, band_columns].split(sizes) for band_columns in columns]


def _in_weight_dtype(tensor: Tensor):
    """No autocast inside the kernel: its products run in the weight's dtype (see :func:`in_cluster_log_prob`), and a
    product autocast would lower could not be copied into the float buffers (``index_copy_``, the gradient)."""
    if tensor.device.type in ("cpu", "cuda"):
        return torch.autocast(tensor.device.type, enabled=False)
    return contextlib.nullcontext()


def _padded_logits(hidden_sorted: Tensor, layout: ClusterLayout, groups: RowGroups) -> Tensor:
    """An empty ``[B, S]`` buffer for the logits, ``S`` the largest cluster the batch holds."""
    width = max([1] + [layout.sizes[c] for c in groups.clusters])
    return hidden_sorted.new_empty(hidden_sorted.size(0), width)


def _mask_past_sizes(logits: Tensor, layout: ClusterLayout, groups: RowGroups) -> Tensor:
    """``-inf`` past each row's cluster size."""
    row_size = layout.sizes_t[groups.row_cluster]
    return logits.masked_fill_(torch.arange(logits.size(1), device=logits.device) >= row_size[:, None],
                               float("-inf"))


def in_cluster_logits(hidden_sorted: Tensor, weight: Tensor, layout: ClusterLayout, groups: RowGroups) -> Tensor:
    """``[B, S]`` logits of each sorted row against its cluster's words, ``-inf`` past the cluster's size."""
    sizes = layout.sizes
    logits = _padded_logits(hidden_sorted, layout, groups)
    weight_blocks = weight.split(sizes)  # one call makes every cluster's view
    for c, h, out in zip(groups.clusters, hidden_sorted.split(groups.row_counts), logits.split(groups.row_counts)):
        if sizes[c] == 1:  # a word alone in its cluster has in-cluster log-probability 0 whatever it scores
            out[:, 0] = 0.0
        else:
            torch.mm(h, weight_blocks[c].t(), out=out[:, : sizes[c]])
    return _mask_past_sizes(logits, layout, groups)


def banded_in_cluster_logits(hidden_sorted: Tensor, weights: tuple[Tensor, ...], bands, layout: ClusterLayout,
                             groups: RowGroups) -> Tensor:
    """:func:`in_cluster_logits` with a weight per band (``bands``: the layout's
    :class:`~sohsm.heads.two_level.word_bands.BandRows`): each band's words scored in its own columns of the widened
    hidden state, one product per (cluster, band) the batch holds."""
    sizes = layout.sizes
    logits = _padded_logits(hidden_sorted, layout, groups)
    hidden_bands = _band_blocks(hidden_sorted, bands.columns, groups.row_counts)
    for i, (c, out) in enumerate(zip(groups.clusters, logits.split(groups.row_counts))):
        if sizes[c] == 1:
            out[:, 0] = 0.0
            continue
        for positions, band, start, stop in bands.groups[c]:
            vectors = weights[band][start:stop]
            if isinstance(positions, slice):
                torch.mm(hidden_bands[band][i], vectors.t(), out=out[:, positions])
            else:
                out.index_copy_(1, positions, hidden_bands[band][i] @ vectors.t())
    return _mask_past_sizes(logits, layout, groups)


def _softmax_gradient(grad_out: Tensor, groups: RowGroups, log_probs: Tensor, position_sorted: Tensor) -> Tensor:
    """``[B, S]`` the gradient of the sorted rows' logits: ``g * (onehot(target) - softmax)``."""
    g = grad_out[groups.order]
    grad_logits = log_probs.exp().mul_(-g[:, None])  # -g * softmax
    return grad_logits.scatter_add_(1, position_sorted[:, None], g[:, None])  # + g at the target


def _score_sorted(hidden: Tensor, row_cluster: Tensor, row_position: Tensor, layout: ClusterLayout, logits_of):
    """A forward's shared part: rows sorted by cluster, ``logits_of(hidden_sorted, groups)`` in the weight's dtype,
    the log-softmax and the targets' entries. Returns ``(groups, hidden_sorted [B, d], log_probs [B, S] sorted,
    position_sorted [B], out [B] in batch order)``."""
    groups = group_rows(row_cluster, len(layout.sizes))
    hidden_sorted = hidden[groups.order]
    with _in_weight_dtype(hidden):
        logits = logits_of(hidden_sorted, groups)
    log_probs = F.log_softmax(logits, dim=1)
    position_sorted = row_position[groups.order]
    out = torch.empty_like(log_probs[:, 0])
    out[groups.order] = log_probs.gather(1, position_sorted[:, None]).squeeze(1)
    return groups, hidden_sorted, log_probs, position_sorted, out


def _weight_route(ctx, index: int, sink: GradientSink | None, edge: int | None = None) -> str:
    """``"sink"``, ``"return"`` or ``"none"`` for the weight at input ``index``
    (:func:`~sohsm.heads.reused_gradient.gradient_route`): a sink only where the head gave one and a ``backward()``
    accumulates into ``.grad``; ``autograd.grad`` gets the gradient back and no ``.grad`` is written."""
    route = gradient_route(ctx, index, edge)
    return "return" if route == "sink" and sink is None else route


class InClusterLogProb(torch.autograd.Function):
    """``log P(w_i | h_i, C(w_i))`` for each row, with a hand-written backward.

    Forward: one matrix product per present cluster into a padded ``[B, S]``
    buffer; the log-softmax and the target gather are done once for the batch.
    Backward: the softmax gradient once for the batch, then two products per
    present cluster. With a ``sink``, in a ``backward()``, the weight gradient goes block by
    block into ``weight.grad`` (autograd never sees an ``N x d`` tensor); without one, or
    when ``autograd.grad`` asks for the weight, it is returned as a dense tensor; when the
    backward does not reach the weight (``autograd.grad(loss, [hidden])``) it is not computed.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                layout: ClusterLayout, sink: GradientSink | None) -> Tensor:
        groups, hidden_sorted, log_probs, position_sorted, out = _score_sorted(
            hidden, row_cluster, row_position, layout, lambda h, g: in_cluster_logits(h, weight, layout, g))
        ctx.save_for_backward(hidden_sorted, weight, log_probs, position_sorted)
        ctx.groups, ctx.layout, ctx.sink = groups, layout, sink
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with _in_weight_dtype(grad_out):
            return InClusterLogProb._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        hidden_sorted, weight, log_probs, position_sorted = ctx.saved_tensors
        groups, layout, sink = ctx.groups, ctx.layout, ctx.sink
        if layout.retired:
            raise RuntimeError("the clusters changed between forward and backward: the weight's rows have moved")
        grad_logits = _softmax_gradient(grad_out, groups, log_probs, position_sorted)
        sizes, offsets, row_counts = layout.sizes, layout.offsets, groups.row_counts
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_sorted = torch.empty_like(hidden_sorted)
            weight_blocks = weight.split(sizes)
            for c, g_c, out in zip(groups.clusters, grad_logits.split(row_counts), grad_sorted.split(row_counts)):
                if sizes[c] == 1:  # the softmax over one word has gradient 0
                    out.zero_()
                else:
                    torch.mm(g_c[:, : sizes[c]], weight_blocks[c], out=out)
            grad_hidden = torch.empty_like(grad_sorted)
            grad_hidden[groups.order] = grad_sorted
        route = _weight_route(ctx, 1, sink)
        if route != "none":
            # a word alone in its cluster gets no gradient (its in-cluster softmax is constant): skip its block
            blocks = [(offsets[c], offsets[c + 1], [(slice(None), slice(None), g_c[:, : sizes[c]], h_c)])
                      for c, g_c, h_c in zip(groups.clusters, grad_logits.split(row_counts),
                                             hidden_sorted.split(row_counts)) if sizes[c] > 1]
            if route == "sink":
                sink.add_blocks(blocks)
            else:
                grad_weight = torch.zeros_like(weight)
                for start, stop, pieces in blocks:
                    write_pieces(grad_weight[start:stop], pieces, overwrite=False)
        return grad_hidden, grad_weight, None, None, None, None


class BandedInClusterLogProb(torch.autograd.Function):
    """:class:`InClusterLogProb` with a weight per band (differentiated dimensions): one product per (cluster, band)
    the batch holds forward and two backward, each ``d_b`` wide; band ``b``'s gradient goes into its weight's
    ``.grad`` through ``sinks[b]`` (or is returned, without sinks). ``bands``: the layout's
    :class:`~sohsm.heads.two_level.word_bands.BandRows`; ``hidden`` is the widened ``[B, d + d/div + ...]``."""

    @staticmethod
    def forward(ctx, hidden: Tensor, row_cluster: Tensor, row_position: Tensor, layout: ClusterLayout, bands,
                sinks: tuple[GradientSink, ...] | None, *weights: Tensor) -> Tensor:
        groups, hidden_sorted, log_probs, position_sorted, out = _score_sorted(
            hidden, row_cluster, row_position, layout,
            lambda h, g: banded_in_cluster_logits(h, weights, bands, layout, g))
        ctx.save_for_backward(hidden_sorted, log_probs, position_sorted, *weights)
        ctx.groups, ctx.layout, ctx.bands, ctx.sinks = groups, layout, bands, sinks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with _in_weight_dtype(grad_out):
            return BandedInClusterLogProb._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        hidden_sorted, log_probs, position_sorted, *weights = ctx.saved_tensors
        groups, layout, bands, sinks = ctx.groups, ctx.layout, ctx.bands, ctx.sinks
        if layout.retired:
            raise RuntimeError("the clusters changed between forward and backward: the weight's rows have moved")
        grad_logits = _softmax_gradient(grad_out, groups, log_probs, position_sorted)
        sizes, row_counts = layout.sizes, groups.row_counts
        hidden_bands = _band_blocks(hidden_sorted, bands.columns, row_counts)
        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_sorted = torch.empty_like(hidden_sorted)
            grad_bands = _band_blocks(grad_sorted, bands.columns, row_counts)
            for i, (c, g_c, out) in enumerate(zip(groups.clusters, grad_logits.split(row_counts),
                                                  grad_sorted.split(row_counts))):
                if sizes[c] == 1 or len(bands.groups[c]) < len(weights):  # a band the cluster lacks gets 0
                    out.zero_()
                if sizes[c] == 1:  # the softmax over one word has gradient 0
                    continue
                for positions, band, start, stop in bands.groups[c]:
                    torch.mm(_columns(g_c, positions), weights[band][start:stop], out=grad_bands[band][i])
            grad_hidden = torch.empty_like(grad_sorted)
            grad_hidden[groups.order] = grad_sorted
        grad_weights = [None] * len(weights)
        routes = [_weight_route(ctx, 6 + b, None if sinks is None else sinks[b], edge=3 + b)  # after 3 tensors
                  for b in range(len(weights))]
        if any(route != "none" for route in routes):
            blocks: list[list] = [[] for _ in weights]  # per band: (start, stop, pieces) in its weight
            for i, (c, g_c) in enumerate(zip(groups.clusters, grad_logits.split(row_counts))):
                if sizes[c] == 1:  # a word alone in its cluster gets no gradient
                    continue
                for positions, band, start, stop in bands.groups[c]:
                    piece = (slice(None), slice(None), _columns(g_c, positions), hidden_bands[band][i])
                    blocks[band].append((start, stop, [piece]))
            for b, (weight, route) in enumerate(zip(weights, routes)):
                if route == "none":
                    continue
                if route == "sink":  # every band gets a .grad, as one weight would: zero where the batch has none
                    sinks[b].add_blocks(blocks[b])
                else:
                    grad_weights[b] = torch.zeros_like(weight)
                    for start, stop, pieces in blocks[b]:
                        write_pieces(grad_weights[b][start:stop], pieces, overwrite=False)
        return grad_hidden, None, None, None, None, None, *grad_weights


def in_cluster_log_prob(hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                        layout: ClusterLayout, width: int | None = None, sink: GradientSink | None = None) -> Tensor:
    """``[B]`` ``log P(w_i | h_i, C(w_i))`` by the per-cluster op, scored in the weight's dtype.

    The op is bound by reading the weight, not by arithmetic, so half-precision products would
    not pay for a converted copy of it. ``width`` is unused (the op sizes its buffer by the batch's
    clusters); see :mod:`sohsm.heads.two_level.ops.backends` for the arguments.
    """
    if isinstance(weight, (tuple, list)):  # a weight per band, the layout's bands saying where its rows are
        return BandedInClusterLogProb.apply(hidden.to(weight[0].dtype), row_cluster, row_position, layout,
                                            layout.bands, sink, *weight)
    return InClusterLogProb.apply(hidden.to(weight.dtype), weight, row_cluster, row_position, layout, sink)
