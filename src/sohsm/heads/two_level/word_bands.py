"""Differentiated dimensions for the two-level heads: each word scored in as many dimensions as its frequency earns.

Adaptive softmax (Grave et al. 2017) and differentiated softmax (Chen et al. 2016)
give rare words fewer dimensions than frequent ones: ranks ``[0, c_1)`` keep all
``d``, ranks ``[c_1, c_2)`` get ``d // div``, the next band ``d // div**2``, and so
on. On a small corpus a rare word's ``d``-dimensional vector overfits; a short one
does not, and costs fewer parameters to train.

A two-level head's cluster may mix bands (its clusters are learned, not frequency
bins). Each band ``i`` has its own weight ``band_weights[i]``, ``[n_i, d_i]``: the
vectors of its words, in the order of their slots in the cluster layout, so that a
cluster's words of one band are consecutive rows of their band's weight
(:class:`BandRows`). A word of band ``i`` is scored as ``(P_i h) . u_w`` (``P_0`` the
identity, ``P_i: d -> d_i`` without bias, ``band_projections``). The parameters are
then exactly ``sum_i n_i d_i``: an optimizer's step, its state and the gradient
buffers cost what the words hold, as adaptive softmax's tails do, where one
``N x (d + d/div + ...)`` weight with zeros outside each word's block made the
step cost more than the dense head's (docs/benchmarks/heads-band-weights.md).

The per-cluster kernel, exact ``log_prob``, top-k and sampling read each band's weight
directly (:mod:`sohsm.heads.two_level.ops.per_cluster`,
:func:`~sohsm.heads.two_level.ops.log_prob.scored_log_prob`). The other backends (sync-free,
Triton) and the device top-k take the bands widened to one
``[N, d + d/div + ...]`` matrix in slot order (:func:`widen`, differentiable), with
every band's view of the hidden state side by side::

    h_w = [h ; P_1 h ; P_2 h]            # [d + d/div + d/div^2]

so that ``h_w . row_w = (P_i h) . u_w`` and those backends compute it unchanged.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


def band_dims(in_features: int, n_bands: int, div_value: float) -> list[int]:
    """``[d, d // div, d // div**2, ...]``: the dimensions of each band, as torch's adaptive softmax sizes its tails."""
    dims = [int(in_features // (float(div_value) ** i)) for i in range(n_bands)]
    if dims[-1] < 1:
        raise ValueError(f"div_value={div_value} leaves band {n_bands - 1} no dimension "
                         f"(in_features // div_value**{n_bands - 1} = {dims[-1]}); use a smaller div_value "
                         "or fewer cutoffs")
    return dims


def band_of_words(word_of_rank: Tensor, cutoffs: Sequence[int]) -> Tensor:
    """``[N]`` band of every word: band ``i`` holds the frequency ranks ``[cutoffs[i-1], cutoffs[i])``."""
    n_words = word_of_rank.numel()
    band_of_rank = torch.bucketize(torch.arange(n_words), torch.tensor(list(cutoffs)), right=True)
    bands = torch.empty(n_words, dtype=torch.long)
    bands[word_of_rank] = band_of_rank
    return bands


def band_slices(dims: Sequence[int]) -> list[slice]:
    """Each band's block of columns of the widened hidden state: ``[0, d)``, ``[d, d + d/div)``, ..."""
    edges = [0, *itertools.accumulate(dims)]
    return [slice(start, stop) for start, stop in zip(edges, edges[1:])]


class BandGroup(NamedTuple):
    """The words of one band in one cluster: where they sit in the cluster's block, and their rows in the band's
    weight (consecutive: a band's rows follow the slots)."""

    #: positions inside the cluster's block: a ``slice`` where they are consecutive, else a ``[n]`` index tensor
    positions: slice | Tensor
    #: the band (an index into :attr:`BandRows.slots`)
    band: int
    #: rows ``start .. stop - 1`` of the band's weight
    start: int
    stop: int


class BandRows:
    """Where each word's vector sits when each band has its own weight: a derived view of a layout and the bands.

    Band ``b``'s weight holds its words in slot order (cluster by cluster, word-id order inside a cluster, as
    :class:`~sohsm.heads.two_level.ops.layout.ClusterLayout` orders them). Derived once per layout: one read back.

    Attributes:
        slots: ``slots[b]``, ``[n_b]`` the slot of each row of band ``b``'s weight (ascending).
        row_of_slot: ``[N]`` the row of each slot's word in its band's weight.
        band_of_slot: ``[N]`` the band of each slot's word.
        groups: ``groups[c]``, one :class:`BandGroup` per band present in cluster ``c``.
        columns: each band's block of columns of the widened hidden state (:func:`band_slices`).
        sizes: ``[n_b]`` for each band, the rows its weight must have.
        stacked_row_of_slot / stacked_row_of_word: the row of each slot's (word's) vector when the bands' weights
            are stacked, band 0's rows first (what :func:`widen` and a tied embedding read in one gather).
    """

    def __init__(self, band_of_word: Tensor, layout, dims: Sequence[int]) -> None:
        n_bands = len(dims)
        offsets = layout.offsets
        n_clusters = len(offsets) - 1
        band_of_slot = band_of_word[layout.word_of_slot]
        self.band_of_slot = band_of_slot
        self.slots = [torch.nonzero(band_of_slot == b).squeeze(1) for b in range(n_bands)]
        self.sizes = [s.numel() for s in self.slots]
        self.row_of_slot = torch.empty_like(band_of_slot)
        for slots in self.slots:
            self.row_of_slot[slots] = torch.arange(slots.numel(), device=slots.device)
        self.columns = band_slices(dims)
        # the bands' rows stacked (band 0's, then band 1's, ...): where each slot's and each word's row is there
        first = torch.tensor([0, *itertools.accumulate(self.sizes)][:-1], device=band_of_slot.device)
        self.stacked_row_of_slot = self.row_of_slot + first[band_of_slot]
        self.stacked_row_of_word = self.stacked_row_of_slot[layout.slot_of_word]
        # slots sorted by (cluster, band), slot order kept: a group's slots are consecutive in this order
        key = layout.cluster_of_slot * n_bands + band_of_slot
        order = torch.sort(key, stable=True).indices
        counts = torch.bincount(key, minlength=n_clusters * n_bands)
        ends = counts.cumsum(0)
        starts = ends - counts
        last = max(order.numel() - 1, 0)
        first_slot = order[starts.clamp(max=last)]
        last_slot = order[(ends - 1).clamp(min=0, max=last)]
        first_row = self.row_of_slot[first_slot]
        counts, starts, first_slot, last_slot, first_row = torch.stack(
            [counts, starts, first_slot, last_slot, first_row]).tolist()
        self.groups: list[list[BandGroup]] = []
        for c in range(n_clusters):
            self.groups.append([])
            for b in range(n_bands):
                k = c * n_bands + b
                n = counts[k]
                if not n:
                    continue
                if last_slot[k] - first_slot[k] + 1 == n:  # ascending slots spanning n: consecutive
                    positions = slice(first_slot[k] - offsets[c], first_slot[k] - offsets[c] + n)
                else:
                    positions = order[starts[k] : starts[k] + n] - offsets[c]
                self.groups[c].append(BandGroup(positions, b, first_row[k], first_row[k] + n))


    @torch.no_grad()
    def update_from(self, other: BandRows) -> None:
        """Become ``other`` in place (its values in this one's tensors, whose storage a captured step reads): the
        bands' row counts are fixed, so every tensor keeps its shape (:meth:`ClusterLayout.update_from
        <sohsm.heads.two_level.ops.layout.ClusterLayout.update_from>`)."""
        for mine, theirs in zip([self.band_of_slot, self.row_of_slot, self.stacked_row_of_slot,
                                 self.stacked_row_of_word, *self.slots],
                                [other.band_of_slot, other.row_of_slot, other.stacked_row_of_slot,
                                 other.stacked_row_of_word, *other.slots]):
            mine.copy_(theirs)
        self.groups, self.columns, self.sizes = other.groups, other.columns, other.sizes


def widen(weights: Sequence[Tensor], rows: BandRows) -> Tensor:
    """``[N, d + d/div + ...]``: the band weights as one matrix in slot order, each row zero outside its band's block
    (differentiable: the gradient reaches each band's weight from its own block only). One block-diagonal matrix of
    the bands' rows stacked, then its rows in slot order: two ops, whatever the number of bands."""
    return torch.block_diag(*weights)[rows.stacked_row_of_slot]
