"""The in-cluster word vectors ``U^V`` of a two-level head, plain or in bands, tied or not.

A two-level head keeps its word vectors with their rows grouped by cluster
(:class:`~sohsm.heads.two_level.ops.layout.ClusterLayout`): one ``[N, word_dim]`` weight, or with
differentiated dimensions (``div_value``, :mod:`sohsm.heads.two_level.word_bands`) one weight per band and
each band's ``d -> d_i`` projection. :class:`WordVectors` owns what goes with them: where each band's rows
sit (:class:`~sohsm.heads.two_level.word_bands.BandRows`, derived once per layout), the reused gradient
buffers that the backends writing their own gradient fill (the sinks), and every way the vectors are read
(one matrix in slot order, a tied embedding's lookup, word-id order) or moved (a re-clustering).

The parameters stay registered on the head (``weight``, or ``band_weights`` and ``band_projections``) so
that checkpoints and ``named_parameters`` keep their names; the head hands them to :class:`WordVectors`
and makes a new one when ``.to()`` or a load replaces them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.adaptive import check_cutoffs, frequency_ranks
from sohsm.heads.base import check_counts, init_word_vectors
from sohsm.heads.reused_gradient import ReusedGradient
from sohsm.heads.two_level.ops import ClusterLayout, GradientSink, move_rows
from sohsm.heads.two_level.word_bands import BandRows, band_dims, band_of_words, widen


def word_width(word_dim, in_features: int, projection: bool) -> int | None:
    """``word_dim`` checked: ``None`` where the words keep all ``d`` dimensions (no map)."""
    if word_dim is not None and (isinstance(word_dim, bool) or int(word_dim) != word_dim
                                 or not 1 <= int(word_dim) <= in_features):
        raise ValueError(f"word_dim must be an integer in [1, {in_features}] or None, got {word_dim!r}")
    word_dim = None if word_dim is None or int(word_dim) == in_features else int(word_dim)
    if word_dim is not None and projection:
        raise ValueError("word_dim and projection cannot be combined: Eq. 1's projection keeps d dimensions")
    return word_dim


def word_bands(div_value, cutoffs, counts, excluded: bool, n_classes: int,
               in_features: int) -> tuple[Tensor, list[int]] | None:
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
    cutoffs = check_cutoffs(cutoffs, n_classes)
    ranks = frequency_ranks(None if counts is None else check_counts(counts, n_classes), n_classes)
    return band_of_words(ranks, cutoffs), band_dims(in_features, len(cutoffs) + 1, div_value)


class WordVectors:
    """A two-level head's word vectors: their parameters, band rows and gradient buffers, and their reads and moves.

    Args:
        weights: ``[weight]`` (``[N, word_dim]``), or each band's weight ``[n_i, d_i]`` in slot order.
        projections: each band's ``d -> d_i`` map for bands 1, 2, ... (``None``: no bands).
        band_of_word: ``[N]`` the band of every word (with bands).
        dims: each band's dimensions (with bands).
        sinks: whether a backend may write the weights' gradient itself (:meth:`gradient_sink`): the head's own
            parameters; ``False`` for tensors swapped in for them (``torch.func.functional_call``), whose gradient
            autograd returns.
    """

    def __init__(self, weights: Sequence[Tensor], projections: nn.ModuleList | None = None,
                 band_of_word: Tensor | None = None, dims: Sequence[int] | None = None, sinks: bool = True) -> None:
        self.weights = list(weights)
        self.sinks = sinks
        self.projections = projections
        self.band_of_word = band_of_word
        self.dims = None if dims is None else list(dims)
        #: one reused gradient buffer per weight: where a sink writes the batch's gradient (``weight.grad``)
        self.grads = [ReusedGradient() for _ in self.weights]

    @property
    def banded(self) -> bool:
        return self.projections is not None

    def trained(self) -> bool:
        """Whether a gradient flows into the vectors now (grad mode on, the weights trainable)."""
        return torch.is_grad_enabled() and self.weights[0].requires_grad

    def invalidate(self) -> None:
        """Forget which rows the gradient buffers hold (the rows moved, or someone else wrote them)."""
        for buffer in self.grads:
            buffer.invalidate()

    def drop_gradients(self) -> None:
        """``.grad = None`` on every weight (a spent gradient, which a re-clustering would move for no one)."""
        for weight in self.weights:
            weight.grad = None

    def reset(self) -> None:
        """Every weight uniform in ``+-d_i**-0.5`` (``nn.Linear``'s scale for its width), the band maps afresh."""
        for projection in cast("Iterable[nn.Linear]", self.projections or ()):  # (a ModuleList of them)
            projection.reset_parameters()
        for weight in self.weights:
            init_word_vectors(weight)

    # -- where the rows are -------------------------------------------------------------------------
    def band_rows(self, layout: ClusterLayout) -> BandRows:
        """The :class:`BandRows` of ``layout``, derived once per layout and again after a write into
        ``band_of_word`` (a buffer broadcast), which must keep each band's number of words. Under
        ``torch.compile`` the rows are taken as last derived (checking versions would break the graph)."""
        if torch.compiler.is_compiling() and layout.bands is not None:
            return layout.bands
        assert self.band_of_word is not None and self.dims is not None  # banded vectors
        if layout.bands is None or layout.bands_version != self.band_of_word._version:
            with torch.inference_mode(False):  # derived under inference mode, they would not be saved for backward
                rows = BandRows(self.band_of_word, layout, self.dims)
            expected = [w.size(0) for w in self.weights]
            if rows.sizes != expected:
                raise RuntimeError(f"band_of_word now puts {rows.sizes} words in the bands, whose weights have "
                                   f"{expected} rows: a head's bands are fixed when it is built")
            if layout.bands is not None:  # rows may now hold other words: the buffers' record no longer holds
                self.invalidate()
            layout.bands = rows
            layout.bands_version = self.band_of_word._version
        return layout.bands

    def by_weight(self, layout: ClusterLayout) -> list[tuple[Tensor, Tensor]]:
        """Each weight with the words its rows hold, in row order."""
        if not self.banded:
            return [(self.weights[0], layout.word_of_slot)]
        bands = self.band_rows(layout)
        return [(w, layout.word_of_slot[slots]) for w, slots in zip(self.weights, bands.slots)]

    # -- reads ----------------------------------------------------------------------------------------
    def matrix(self, layout: ClusterLayout) -> Tensor:
        """The vectors as one ``[N, word_dim]`` matrix in slot order: the weight, or the bands widened
        (:func:`~sohsm.heads.two_level.word_bands.widen`, differentiable). Where a gradient may flow through it,
        autograd writes the weights' ``.grad``: the buffers' record of written rows lapses."""
        if self.trained():
            self.invalidate()
        if not self.banded:
            return self.weights[0]
        return widen(self.weights, self.band_rows(layout))

    def gradient_sink(self, layout: ClusterLayout):
        """``(weight, sink)`` for a backend that writes the vectors' gradient itself: the weight and a sink into its
        reused buffer; with bands a tuple of each band's weight and one of sinks (``layout``'s band rows derived).
        Without :attr:`sinks` the sink is ``None``: the op returns the gradient to autograd."""
        if not self.banded:
            return self.weights[0], GradientSink(self.weights[0], self.grads[0]) if self.sinks else None
        self.band_rows(layout)
        sinks = tuple(GradientSink(w, buffer) for w, buffer in zip(self.weights, self.grads)) if self.sinks else None
        return tuple(self.weights), sinks

    def in_word_order(self, layout: ClusterLayout) -> Tensor:
        """``[N, word_dim]`` a copy in word-id order (with bands, each row zero outside its band's block)."""
        with torch.no_grad():
            return self.matrix(layout).detach()[layout.slot_of_word]

    def embed(self, ids: Tensor, layout: ClusterLayout, writes_gradient: bool, sync_free: bool) -> Tensor:
        """``[*] -> [*, d]``: the vectors of ``ids``, a tied input embedding's lookup.

        Where the head's backend writes the gradient itself (``writes_gradient``) the lookup's gradient is
        row-sparse: autograd adds the batch's rows into the dense ``.grad`` in place, instead of building a second
        ``N x d`` gradient and adding the two. Elsewhere (autograd's backends, under ``torch.compile``) it is dense.
        """
        for buffer in self.grads:  # autograd adds the embedding's share into the grads: the buffers' record lapses
            buffer.shared = True
        sparse = self.trained() and not torch.compiler.is_compiling() and writes_gradient and self.sinks
        if not self.banded:
            return F.embedding(layout.slot_of_word[ids], self.weights[0], sparse=sparse)
        # adaptive input (Baevski & Auli 2019): a band-i word's d_i entries are read back up to d through the band's
        # own projection, P_i^T u_w, the very vector its score h . P_i^T u_w is taken with. Every id reads a row of
        # every band (its own row in its band, row 0 elsewhere) and the other bands' reads are multiplied by 0, so
        # each band's weight gets a gradient in its own words' rows only
        bands = self.band_rows(layout)
        projections = cast("Sequence[nn.Linear]", self.projections)  # banded: the bands' maps (a ModuleList of them)
        if not sparse and sync_free:
            # every band's vectors read up to d at once (a GPU's step is bound by the ops it issues, not by this
            # N x d product), then one gather: the same vectors as the loop below, in a handful of ops
            table = torch.cat([self.weights[0], *(w @ p.weight for w, p in zip(self.weights[1:], projections))])
            return F.embedding(bands.stacked_row_of_word[ids], table)
        slots = layout.slot_of_word[ids]
        band, row = bands.band_of_slot[slots], bands.row_of_slot[slots]
        out = None
        for b, weight in enumerate(self.weights):
            member = band == b
            rows = F.embedding(torch.where(member, row, 0), weight, sparse=sparse) * member[..., None].to(weight.dtype)
            if b:
                rows = rows @ projections[b - 1].weight
            out = rows if out is None else out + rows
        assert out is not None  # one band at least
        return out

    # -- writes ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def set_in_word_order(self, weight: Tensor, layout: ClusterLayout) -> None:
        """Word ``w``'s vector becomes ``weight[w]``, in the row of its slot (plain vectors only)."""
        self.weights[0][layout.slot_of_word] = weight.to(self.weights[0].dtype)

    def move(self, old: ClusterLayout, new: ClusterLayout, permutation: Tensor,
             state: Callable[[Tensor], list[Tensor]]) -> None:
        """Re-lay the rows out for ``new``: new slot ``s`` takes old slot ``permutation[s]``'s row, in each weight,
        its ``.grad`` and the row-shaped optimizer state ``state(weight)``."""
        if not self.banded:
            weight = self.weights[0]
            move_rows([weight, weight.grad, *state(weight)], permutation)
        else:  # band b's new row r holds the word of new slot new.slots[b][r], which sat at old row ...
            old_bands, new_bands = self.band_rows(old), self.band_rows(new)
            for weight, slots in zip(self.weights, new_bands.slots):
                move_rows([weight, weight.grad, *state(weight)], old_bands.row_of_slot[permutation[slots]])
        self.invalidate()


def split_widened_weight(state_dict: dict, prefix: str, n_clusters: int, dims: Sequence[int]) -> None:
    """A banded head saved before each band had its own weight kept one ``[N, d + d/div + ...]`` ``weight``, its rows
    in the layout of the saved ``assignment``: each band's rows and block become that band's weight (in place)."""
    key = prefix + "weight"
    assignment, band_of_word = state_dict.get(prefix + "assignment"), state_dict.get(prefix + "band_of_word")
    if key not in state_dict or assignment is None or band_of_word is None:
        return  # load_state_dict reports the missing keys
    wide = state_dict.pop(key)
    layout = ClusterLayout(assignment.to(wide.device), n_clusters)
    bands = BandRows(band_of_word.to(wide.device), layout, dims)
    for b, (slots, columns) in enumerate(zip(bands.slots, bands.columns)):
        state_dict[f"{prefix}band_weights.{b}"] = wide[slots, columns]
