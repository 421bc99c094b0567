"""The per-cluster kernel of the two-level heads: rows grouped by cluster, one product per cluster.

    log P(w | h, C(w)) = log softmax_{w' in C(w)}(h_w . U^V_w')[w]

Storage layout. The word vectors ``U^V`` are stored *grouped by cluster*: rows
``offsets[c] : offsets[c] + sizes[c]`` of :attr:`TwoLevelSoftmax.weight` are the
words of cluster ``c`` in increasing word id (:class:`ClusterLayout`). Each present
cluster then costs one matrix product on a contiguous block forward and two
backward, and its gradient is one contiguous block, written straight into
``weight.grad``.

The kernel reads the cluster counts of a batch back to the host (``.tolist()``)
and runs one product per present cluster; :mod:`sohsm.heads.two_level.in_cluster.grouped` computes the
same scores with static shapes (the sync-free path). The best-first search
(:mod:`sohsm.heads.two_level.best_first`) scores (row, cluster) pairs with the same kernel.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class ClusterLayout:
    """Where each word's row of the weight sits: a derived, non-persistent view of an assignment.

    Args:
        assignment: ``[N]`` cluster id of every word.
        n_clusters: the number of clusters ``C`` (some may be empty).

    Attributes:
        word_of_slot / slot_of_word: ``[N]`` the word at each row of the weight, and back.
        sizes / offsets: words of each cluster and where its block starts (host lists;
            ``sizes_t`` / ``offsets_t`` the same on the device, ``offsets`` has ``C + 1`` entries).
        cluster_of_slot: ``[N]`` cluster of each row.
        position_of_word: ``[N]`` position of each word inside its cluster's block.
        empty_clusters: ``[C]`` bool, clusters without words, or ``None`` if there are none.
    """

    def __init__(self, assignment: Tensor, n_clusters: int) -> None:
        #: version of the ``assignment`` tensor this layout was derived from (see ``TwoLevelSoftmax._layout``)
        self.version = assignment._version
        n_words = assignment.numel()
        device = assignment.device
        # words sorted by (cluster, word id): a stable sort keeps word-id order inside a cluster
        self.word_of_slot = torch.sort(assignment, stable=True).indices
        self.slot_of_word = torch.empty_like(self.word_of_slot)
        self.slot_of_word[self.word_of_slot] = torch.arange(n_words, device=device)
        sizes = torch.bincount(assignment, minlength=n_clusters)
        offsets = torch.zeros(n_clusters + 1, dtype=torch.long, device=device)
        offsets[1:] = sizes.cumsum(0)
        self.sizes_t = sizes
        self.offsets_t = offsets
        self.sizes = sizes.tolist()
        self.offsets = offsets.tolist()
        self.max_size = max(self.sizes)
        self.cluster_of_slot = assignment[self.word_of_slot]
        #: [C] True for clusters without words (their P(c | h) must be 0), None if there are none
        empty = sizes == 0
        self.empty_clusters = empty if bool(empty.any()) else None
        #: position of each word inside its cluster's block
        self.position_of_word = self.slot_of_word - offsets[assignment]


@torch.no_grad()
def move_rows(tensors: list[Tensor | None], permutation: Tensor) -> None:
    """``t.copy_(t[permutation])`` for each tensor (``None`` skipped), through one scratch buffer per dtype:
    on the CPU a fresh ``N x d`` tensor per move costs more than the move itself (its pages fault in)."""
    scratch: dict = {}
    for t in tensors:
        if t is None:
            continue
        key = (t.dtype, t.device, t.shape)
        if key not in scratch:
            scratch[key] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        torch.index_select(t, 0, permutation, out=scratch[key])
        t.copy_(scratch[key])


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


def in_cluster_logits(hidden_sorted: Tensor, weight: Tensor, layout: ClusterLayout, groups: RowGroups) -> Tensor:
    """``[B, S]`` logits of each sorted row against its cluster's words, ``-inf`` past the cluster's size."""
    sizes = layout.sizes
    width = max([1] + [sizes[c] for c in groups.clusters])
    logits = hidden_sorted.new_empty(hidden_sorted.size(0), width)
    row_counts = groups.row_counts
    weight_blocks = weight.split(sizes)  # one call makes every cluster's view
    for c, h, out in zip(groups.clusters, hidden_sorted.split(row_counts), logits.split(row_counts)):
        if sizes[c] == 1:  # a word alone in its cluster has in-cluster log-probability 0 whatever it scores
            out[:, 0] = 0.0
        else:
            torch.mm(h, weight_blocks[c].t(), out=out[:, : sizes[c]])
    row_size = layout.sizes_t[groups.row_cluster]
    logits.masked_fill_(torch.arange(width, device=logits.device) >= row_size[:, None], float("-inf"))
    return logits


class InClusterLogProb(torch.autograd.Function):
    """``log P(w_i | h_i, C(w_i))`` for each row, with a hand-written backward.

    Forward: one matrix product per present cluster into a padded ``[B, S]``
    buffer; the log-softmax and the target gather are done once for the batch.
    Backward: the softmax gradient once for the batch, then two products per
    present cluster; the weight gradient goes straight into ``weight.grad``
    (see :class:`~sohsm.heads.reused_gradient.ReusedGradient`), so autograd never sees an ``N x d`` tensor.
    """

    @staticmethod
    def forward(ctx, hidden, weight, row_cluster, row_position, head):
        layout = head._layout
        groups = group_rows(row_cluster, head.n_clusters)
        hidden_sorted = hidden[groups.order]  # [B, d]
        log_probs = F.log_softmax(in_cluster_logits(hidden_sorted, weight, layout, groups), dim=1)
        position_sorted = row_position[groups.order]
        out = torch.empty_like(log_probs[:, 0])
        out[groups.order] = log_probs.gather(1, position_sorted[:, None]).squeeze(1)
        ctx.save_for_backward(hidden_sorted, weight, log_probs, position_sorted)
        ctx.groups, ctx.layout, ctx.head = groups, layout, head
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden_sorted, weight, log_probs, position_sorted = ctx.saved_tensors
        groups, layout, head = ctx.groups, ctx.layout, ctx.head
        if layout is not head._layout:
            raise RuntimeError("the head's clusters changed between forward and backward")
        g = grad_out[groups.order]
        grad_logits = log_probs.exp().mul_(-g[:, None])  # -g * softmax
        grad_logits.scatter_add_(1, position_sorted[:, None], g[:, None])  # + g at the target
        sizes, row_counts = layout.sizes, groups.row_counts
        grad_hidden = None
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
        if ctx.needs_input_grad[1]:
            _accumulate_weight_grad(head, grad_logits, hidden_sorted, groups)
        return grad_hidden, None, None, None, None


def _accumulate_weight_grad(head, grad_logits: Tensor, hidden_sorted: Tensor, groups: RowGroups) -> None:
    """Write (or add) the blocks of ``dL/dU^V`` of the present clusters into ``weight.grad``."""
    layout, weight = head._layout, head.weight
    grad = weight.grad
    fresh = grad is None
    # a word alone in its cluster gets no gradient (its in-cluster softmax is constant): skip its block
    clusters = [c for c in groups.clusters if layout.sizes[c] > 1]
    if fresh:
        grad = head._grad.fresh(weight, keep=frozenset(_regions(layout, clusters)))
    elif grad.is_sparse or grad.shape != weight.shape:
        raise RuntimeError("TwoLevelSoftmax.weight.grad must be a dense tensor shaped like the weight")
    beta = 0.0 if fresh else 1.0  # a fresh buffer's present blocks are overwritten, not added to
    sizes, row_counts = layout.sizes, groups.row_counts
    known = grad is head._grad.tensor and head._grad.known()
    grad_blocks = grad.split(sizes)
    banded = head.band_projections is not None  # differentiated dimensions: keep each row inside its band
    for c, g_c, h_c in zip(groups.clusters, grad_logits.split(row_counts), hidden_sorted.split(row_counts)):
        if sizes[c] > 1:
            grad_blocks[c].addmm_(g_c[:, : sizes[c]].t(), h_c, beta=beta)
            if banded:
                grad_blocks[c].mul_(head._band_mask(layout.offsets[c], layout.offsets[c + 1]))
    if fresh:
        weight.grad = grad
    if grad is head._grad.tensor:
        head._grad.written(_regions(layout, clusters), known)


def _regions(layout: ClusterLayout, clusters: list[int]) -> list[tuple[int, int]]:
    """The ``(start, stop)`` row ranges of ``clusters``' blocks in :attr:`weight`."""
    offsets = layout.offsets
    return [(offsets[c], offsets[c + 1]) for c in clusters]
