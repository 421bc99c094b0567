"""Differentiated dimensions for the two-level heads: each word scored in as many dimensions as its frequency earns.

Adaptive softmax (Grave et al. 2017) and differentiated softmax (Chen et al. 2016)
give rare words fewer dimensions than frequent ones: ranks ``[0, c_1)`` keep all
``d``, ranks ``[c_1, c_2)`` get ``d // div``, the next band ``d // div**2``, and so
on. On a small corpus a rare word's ``d``-dimensional vector overfits; a short one
does not, and costs fewer parameters to train.

A two-level head's cluster may mix bands (its clusters are learned, not frequency
bins), so a row computes every band's view of the hidden state once::

    h_w = [h ; P_1 h ; P_2 h]            # [d + d/div + d/div^2], P_i: d -> d/div^i, no bias

and a word of band ``i`` keeps non-zero entries only in band ``i``'s block of its
row of ``U^V``. Then ``h_w . U^V_w = (P_i h) . u_w``: the word is scored in ``d_i``
dimensions, and every backend (per-cluster kernel, sync-free path, exact
``log_prob``, top-k) computes it unchanged, as one product with a wider hidden
state. The gradient outside a word's block is kept at zero (masked by
:class:`MaskRows` where autograd computes it; the per-cluster kernel writes each
cluster's rows band by band, :func:`band_groups`, inside their blocks only), so
those entries stay zero under any optimizer whose step maps a zero gradient on a
zero entry to zero (SGD, Adagrad, Adam, AdamW, with or without weight decay).

The stored weight is ``N x (d + d/div + ...)`` (1.31 d at ``div = 4`` with two
tail bands); the parameters that learn are ``sum_i |band_i| d_i``. The backends
that read the whole width (sync-free, Triton) pay for it; the per-cluster kernel,
the CPU's default, writes only each word's own block of the gradient, and from
d 512 multiplies only those blocks forward too, so that the rare words' short
vectors cost about what they hold, as in adaptive softmax.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from sohsm.heads.adaptive import check_cutoffs, frequency_ranks
from sohsm.heads.base import check_counts


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


def column_bands(dims: Sequence[int]) -> Tensor:
    """``[sum(dims)]`` the band each column of the widened word vectors belongs to."""
    return torch.repeat_interleave(torch.arange(len(dims)), torch.tensor(list(dims)))


def band_slices(dims: Sequence[int]) -> list[slice]:
    """Each band's block of columns of the widened word vectors: ``[0, d)``, ``[d, d + d/div)``, ..."""
    edges = [0, *itertools.accumulate(dims)]
    return [slice(start, stop) for start, stop in zip(edges, edges[1:])]


class BandGroup(NamedTuple):
    """The rows of one cluster's block that hold words of one band."""

    #: positions inside the cluster's block: a ``slice`` where they are consecutive, else a ``[n]`` index tensor
    rows: slice | Tensor
    #: the band (an index into :attr:`BandGroups.columns`)
    band: int


class BandGroups(NamedTuple):
    """Each cluster's rows grouped by band (:func:`band_groups`), and each band's block of columns."""

    #: ``groups[c]``: one :class:`BandGroup` per band present in cluster ``c``
    groups: list[list[BandGroup]]
    #: each band's block of columns of the weight (and of the widened hidden state)
    columns: list[slice]


def band_groups(band_of_slot: Tensor, cluster_of_slot: Tensor, offsets: Sequence[int],
                dims: Sequence[int]) -> BandGroups:
    """Each cluster's rows grouped by band: one :class:`BandGroup` per band present in the cluster.

    A row is non-zero only in its band's columns, so a cluster's products can be taken band by band, each
    ``d_i`` wide (:mod:`sohsm.heads.two_level.ops.per_cluster`). Derived once per layout: one read back.
    Where the vocabulary's ids follow frequency (sohsm's own), a band's words are consecutive in their
    cluster's block (a layout keeps word-id order inside a cluster) and the group is a slice.
    """
    n_clusters, n_bands = len(offsets) - 1, len(dims)
    key = cluster_of_slot * n_bands + band_of_slot  # slots sorted by key: grouped by (cluster, band), slot order kept
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=n_clusters * n_bands)
    ends = counts.cumsum(0)
    starts = ends - counts
    last = max(order.numel() - 1, 0)
    first_slot = order[starts.clamp(max=last)]
    last_slot = order[(ends - 1).clamp(min=0, max=last)]
    counts, starts, first_slot, last_slot = torch.stack([counts, starts, first_slot, last_slot]).tolist()
    groups: list[list[BandGroup]] = []
    for c in range(n_clusters):
        groups.append([])
        for b in range(n_bands):
            k = c * n_bands + b
            n = counts[k]
            if not n:
                continue
            if last_slot[k] - first_slot[k] + 1 == n:  # ascending slots spanning n: consecutive
                rows = slice(first_slot[k] - offsets[c], first_slot[k] - offsets[c] + n)
            else:
                rows = order[starts[k] : starts[k] + n] - offsets[c]
            groups[c].append(BandGroup(rows, b))
    return BandGroups(groups, band_slices(dims))


class MaskRows(torch.autograd.Function):
    """Identity forward; the backward keeps a row's gradient only inside its band's block.

    ``band`` is ``[*]``, the band of each row of ``weight`` (``[*, word_dim]``), and ``columns`` ``[word_dim]`` the
    band of each column: the mask ``band[..., None] == columns`` is built in the backward, so between the passes only
    the rows' band ids are kept, not a ``[*, word_dim]`` mask.
    """

    @staticmethod
    def forward(ctx, weight: Tensor, band: Tensor, columns: Tensor) -> Tensor:
        ctx.save_for_backward(band, columns)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        band, columns = ctx.saved_tensors
        return grad * (band[..., None] == columns), None, None


class BandedWords(nn.Module):
    """Mixin of :class:`~sohsm.heads.TwoLevelSoftmax`: its bands' state, mask and initialisation.

    The head sets ``band_projections`` (``None`` without bands), ``band_dims``, the buffers
    ``band_of_word`` and ``_band_columns``, and its ``_layout``; these methods read them.
    """

    def _word_bands(self, div_value, cutoffs, counts, excluded: bool) -> tuple[Tensor, list[int]] | None:
        """``(band of every word, dimensions of each band)`` for ``div_value``, or ``None`` without bands."""
        if cutoffs is not None and div_value is None:
            raise ValueError("cutoffs set the bands of div_value: give div_value too (e.g. div_value=4)")
        if div_value is None:
            return None
        if isinstance(div_value, bool) or not isinstance(div_value, (int, float)) or not div_value >= 1:
            raise ValueError(f"div_value must be a number >= 1 or None, got {div_value!r}")
        if excluded:
            raise ValueError("div_value cannot be combined with projection or word_dim: it sets every word's "
                             "dimensions itself")
        cutoffs = check_cutoffs(cutoffs, self.n_classes)
        ranks = frequency_ranks(None if counts is None else check_counts(counts, self.n_classes), self.n_classes)
        dims = band_dims(self.in_features, len(cutoffs) + 1, div_value)
        return band_of_words(ranks, cutoffs), dims

    def _band_mask(self, start: int = 0, stop: int | None = None) -> Tensor:
        """``[stop - start, word_dim]`` bool: which entries of the rows (slots) ``start .. stop - 1`` may be non-zero."""
        return self._band_of_slot(start, stop)[:, None] == self._band_columns

    def _band_of_slot(self, start: int = 0, stop: int | None = None) -> Tensor:
        """``[stop - start]`` the band of the word in each row (slot) ``start .. stop - 1``."""
        return self.band_of_word[self._layout.word_of_slot[start:stop]]

    def _word_weight(self) -> Tensor:
        """:attr:`weight` as the products use it: with bands, its gradient is kept inside each word's block."""
        if self.band_projections is None or not (torch.is_grad_enabled() and self.weight.requires_grad):
            return self.weight
        return MaskRows.apply(self.weight, self._band_of_slot(), self._band_columns)

    def _reset_banded_weight(self) -> None:
        """Each block a word vector of its band's width, uniform in ``+-d_i**-0.5``; zero outside the word's band."""
        for projection in self.band_projections:
            projection.reset_parameters()
        with torch.no_grad():
            bounds = torch.tensor(self.band_dims, dtype=self.weight.dtype, device=self.weight.device) ** -0.5
            self.weight.uniform_(-1.0, 1.0).mul_(bounds[self._band_columns]).mul_(self._band_mask())
