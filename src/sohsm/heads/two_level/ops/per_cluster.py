"""The per-cluster backend of the in-cluster softmax: rows grouped by cluster, one product per cluster.

    log P(w | h, C(w)) = log softmax_{w' in C(w)}(h_w . U^V_w')[w]

The word vectors are stored grouped by cluster (:class:`~sohsm.heads.two_level.ops.layout.ClusterLayout`),
so each cluster a batch holds costs one matrix product on a contiguous block forward and two
backward, and its gradient is one contiguous block, written into ``weight.grad`` through a
:class:`~sohsm.heads.two_level.ops.gradient_sink.GradientSink` (or returned, without one). With
differentiated dimensions (``layout.bands``) a block's gradient is written band by band, each band's
rows in its own columns, and from d :data:`BAND_PRODUCTS_FROM` on its scores are taken the same way.

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


#: the hidden size from which a banded cluster's scores and hidden-state gradient are taken band by band: below it
#: one product over the block's whole width (exact too, its entries outside a word's band being zero) took less
#: time, the products' calls costing more than the zeros they skip (the head alone on one CPU thread, 33-44k words:
#: band by band 0.9x the time at d 512, 1.05-1.3x at d 256). The weight's gradient is written band by band always.
BAND_PRODUCTS_FROM = 512


def _products_by_band(layout: ClusterLayout) -> bool:
    """Whether the scores and the hidden state's gradient are taken band by band (see :data:`BAND_PRODUCTS_FROM`)."""
    return layout.bands is not None and layout.bands.columns[0].stop >= BAND_PRODUCTS_FROM


def _rows(block: Tensor, rows: slice | Tensor) -> Tensor:
    """``block``'s rows of a band group: a view for a slice, a copy for an index tensor."""
    return block[rows] if isinstance(rows, slice) else block.index_select(0, rows)


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


def in_cluster_logits(hidden_sorted: Tensor, weight: Tensor, layout: ClusterLayout, groups: RowGroups,
                      by_band: bool = False) -> Tensor:
    """``[B, S]`` logits of each sorted row against its cluster's words, ``-inf`` past the cluster's size.

    ``by_band`` (differentiated dimensions: ``layout.bands``): a cluster's words are scored band by band, each in
    its band's columns only; the entries outside them are zero, so the sum is the same product, narrower."""
    sizes = layout.sizes
    width = max([1] + [sizes[c] for c in groups.clusters])
    logits = hidden_sorted.new_empty(hidden_sorted.size(0), width)
    row_counts = groups.row_counts
    bands = layout.bands if by_band else None
    if bands is None:
        weight_blocks = weight.split(sizes)  # one call makes every cluster's view
    else:
        weight_bands = _band_blocks(weight, bands.columns, sizes)
        hidden_bands = _band_blocks(hidden_sorted, bands.columns, row_counts)
    for i, (c, h, out) in enumerate(zip(groups.clusters, hidden_sorted.split(row_counts), logits.split(row_counts))):
        if sizes[c] == 1:  # a word alone in its cluster has in-cluster log-probability 0 whatever it scores
            out[:, 0] = 0.0
        elif bands is None:
            torch.mm(h, weight_blocks[c].t(), out=out[:, : sizes[c]])
        else:
            for rows, band in bands.groups[c]:
                vectors = _rows(weight_bands[band][c], rows)
                if isinstance(rows, slice):
                    torch.mm(hidden_bands[band][i], vectors.t(), out=out[:, rows])
                else:
                    out.index_copy_(1, rows, hidden_bands[band][i] @ vectors.t())
    row_size = layout.sizes_t[groups.row_cluster]
    logits.masked_fill_(torch.arange(width, device=logits.device) >= row_size[:, None], float("-inf"))
    return logits


class InClusterLogProb(torch.autograd.Function):
    """``log P(w_i | h_i, C(w_i))`` for each row, with a hand-written backward.

    Forward: one matrix product per present cluster into a padded ``[B, S]``
    buffer; the log-softmax and the target gather are done once for the batch.
    Backward: the softmax gradient once for the batch, then two products per
    present cluster. With a ``sink`` the weight gradient goes block by block into
    ``weight.grad`` (autograd never sees an ``N x d`` tensor); without one it is
    returned as a dense tensor.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                layout: ClusterLayout, sink: GradientSink | None) -> Tensor:
        groups = group_rows(row_cluster, len(layout.sizes))
        hidden_sorted = hidden[groups.order]  # [B, d]
        with _in_weight_dtype(hidden):
            logits = in_cluster_logits(hidden_sorted, weight, layout, groups, by_band=_products_by_band(layout))
        log_probs = F.log_softmax(logits, dim=1)
        position_sorted = row_position[groups.order]
        out = torch.empty_like(log_probs[:, 0])
        out[groups.order] = log_probs.gather(1, position_sorted[:, None]).squeeze(1)
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
        g = grad_out[groups.order]
        grad_logits = log_probs.exp().mul_(-g[:, None])  # -g * softmax
        grad_logits.scatter_add_(1, position_sorted[:, None], g[:, None])  # + g at the target
        sizes, offsets, row_counts = layout.sizes, layout.offsets, groups.row_counts
        grad_hidden = grad_weight = None
        bands = layout.bands
        if bands is not None:
            hidden_bands = _band_blocks(hidden_sorted, bands.columns, row_counts)
        by_band = _products_by_band(layout)
        if ctx.needs_input_grad[0]:
            grad_sorted = torch.empty_like(hidden_sorted)
            if by_band:
                weight_bands = _band_blocks(weight, bands.columns, sizes)
                grad_bands = _band_blocks(grad_sorted, bands.columns, row_counts)
            else:
                weight_blocks = weight.split(sizes)
            for i, (c, g_c, out) in enumerate(zip(groups.clusters, grad_logits.split(row_counts),
                                                  grad_sorted.split(row_counts))):
                if sizes[c] == 1:  # the softmax over one word has gradient 0
                    out.zero_()
                elif not by_band:
                    torch.mm(g_c[:, : sizes[c]], weight_blocks[c], out=out)
                else:  # each band's columns from its own words; a band the cluster lacks gets 0
                    if len(bands.groups[c]) < len(bands.columns):
                        out.zero_()
                    for rows, band in bands.groups[c]:
                        torch.mm(_columns(g_c, rows), _rows(weight_bands[band][c], rows), out=grad_bands[band][i])
            grad_hidden = torch.empty_like(grad_sorted)
            grad_hidden[groups.order] = grad_sorted
        if ctx.needs_input_grad[1]:
            # a word alone in its cluster gets no gradient (its in-cluster softmax is constant): skip its block
            blocks = []
            for i, (c, g_c, h_c) in enumerate(zip(groups.clusters, grad_logits.split(row_counts),
                                                  hidden_sorted.split(row_counts))):
                if sizes[c] == 1:
                    continue
                if bands is None:
                    pieces = [(slice(None), slice(None), g_c[:, : sizes[c]], h_c)]
                else:  # a band's rows get a gradient in its own columns only
                    pieces = [(rows, bands.columns[band], _columns(g_c, rows), hidden_bands[band][i])
                              for rows, band in bands.groups[c]]
                blocks.append((offsets[c], offsets[c + 1], pieces))
            if sink is not None:
                sink.add_blocks(blocks)
            else:
                grad_weight = torch.zeros_like(weight)
                for start, stop, pieces in blocks:
                    write_pieces(grad_weight[start:stop], pieces, overwrite=False)
        return grad_hidden, grad_weight, None, None, None, None


def in_cluster_log_prob(hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                        layout: ClusterLayout, width: int | None = None, sink: GradientSink | None = None) -> Tensor:
    """``[B]`` ``log P(w_i | h_i, C(w_i))`` by the per-cluster op, scored in the weight's dtype.

    The op is bound by reading the weight, not by arithmetic, so half-precision products would
    not pay for a converted copy of it. ``width`` is unused (the op sizes its buffer by the batch's
    clusters); see :mod:`sohsm.heads.two_level.ops.backends` for the arguments.
    """
    return InClusterLogProb.apply(hidden.to(weight.dtype), weight, row_cluster, row_position, layout, sink)
