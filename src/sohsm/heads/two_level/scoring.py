"""How a two-level head scores: the hidden state split for the two softmaxes, the head's tensors handed to the ops.

:class:`TwoLevelScoring` is mixed into :class:`~sohsm.heads.TwoLevelSoftmax`, which owns the state (parameters,
word vectors, layout, backend); this file holds what is computed from it: a training step's two parts
(``forward``, ``score_parts``), exact ``log_prob``, and top-k by best-first search
(:func:`~sohsm.heads.two_level.best_first.best_first_topk`) or with static shapes
(:func:`~sohsm.heads.two_level.ops.topk.topk_in_clusters`). What it reads of its host beyond a
:class:`~sohsm.heads.base.ClusteredHead` is declared in the class body, under ``TYPE_CHECKING``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.base import ClusterScores, HeadOutput, upcast
from sohsm.heads.two_level import best_first
from sohsm.heads.two_level.best_first import TopKResult, best_first_topk
from sohsm.heads.two_level.ops import (
    BackendInfo,
    ClusterLayout,
    TwoLevelLogProb,
    cluster_log_softmax,
    two_level_log_prob,
)
from sohsm.heads.two_level.ops.grouped import compute_dtype
from sohsm.heads.two_level.ops.log_prob import scored_log_prob, scored_rows
from sohsm.heads.two_level.ops.per_cluster import banded_in_cluster_logits, group_rows, in_cluster_logits
from sohsm.heads.two_level.ops.topk import DEFAULT_CLUSTERS, DeviceTopK, topk_in_clusters
from sohsm.heads.two_level.word_vectors import WordVectors
from sohsm.lazy import outside_compile

if TYPE_CHECKING:  # for the checker the mixin is the kind of head it is mixed into; at run time a plain class
    from sohsm.heads.base import ClusteredHead as _Head
else:
    _Head = object


class TwoLevelScoring(_Head):
    """Mixin of :class:`~sohsm.heads.TwoLevelSoftmax`: its forward pass, exact evaluation and top-k (see the module).

    Its methods read of the head only what a ClusteredHead has and its ``TYPE_CHECKING`` block declares, besides
    each other (``tests/heads/two_level/test_host_protocols.py`` checks it).
    """

    #: whether :meth:`search_topk` finishes a row with a flat cluster distribution densely (``False``: always search)
    dense_topk: bool = True

    if TYPE_CHECKING:  # what it reads of the head beyond a ClusteredHead's (the host test reads this block)
        cluster_weight: nn.Parameter
        cluster_bias: nn.Parameter | None
        projection: nn.Linear | None
        word_projection: nn.Linear | None
        band_projections: nn.ModuleList | None
        words: WordVectors
        _layout: ClusterLayout
        _layout_cache: ClusterLayout | None  # (``None`` only inside the head's constructor)

        def _check_weight_is_whole(self) -> None: ...
        def backend_for(self, device: torch.device, compute: torch.dtype | None = None) -> BackendInfo: ...
        def _sync_free_width(self) -> int: ...
        def _observe(self, target: Tensor, cluster_log_probs: Tensor) -> None: ...
        def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None: ...

    # -- the forward pass ---------------------------------------------------------
    def _cluster_log_probs(self, hidden_c: Tensor, layout: ClusterLayout | None = None) -> Tensor:
        """``[B, C]`` log P(c | h); a cluster without words gets probability 0."""
        layout = self._layout if layout is None else layout
        return cluster_log_softmax(F.linear(hidden_c, self.cluster_weight, self.cluster_bias), layout.empty_clusters)

    def _split_hidden(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """``(h_c, h_w)``: the inputs of the cluster softmax and of the word softmax."""
        if self.word_projection is not None:
            return hidden, self.word_projection(hidden)  # [B, d], [B, word_dim]
        if self.band_projections is not None:  # [B, d + d/div + ...]: every band's view of h
            return hidden, torch.cat([hidden, *(p(hidden) for p in self.band_projections)], dim=1)
        if self.projection is None:
            return hidden, hidden
        projected = F.relu(self.projection(hidden))  # [B, 2d]
        return projected[:, : self.in_features], projected[:, self.in_features :]

    def _parts(self, hidden: Tensor, target: Tensor) -> TwoLevelLogProb:
        """``(cluster log-probs [B, C], log P(C(t)|h) [B], log P(t|h, C(t)) [B])`` of checked inputs."""
        hidden_c, hidden_w = self._split_hidden(hidden)
        backend = self.backend_for(hidden_w.device, compute_dtype(hidden_w, self.words.weights[0]))
        layout = self._layout_cache if torch.compiler.is_compiling() else self._layout
        assert layout is not None  # derived in the head's constructor
        bias = layout.empty_bias.to(self.cluster_weight.dtype)
        cluster_logits = F.linear(hidden_c, self.cluster_weight, bias if self.cluster_bias is None else
                                  bias + self.cluster_bias)
        score = self._score if backend.sync_free else self._score_eagerly
        return score(cluster_logits, hidden_w, target, backend)

    def _score(self, cluster_logits: Tensor, hidden_w: Tensor, target: Tensor,
               backend: BackendInfo) -> TwoLevelLogProb:
        """The rest of :meth:`_parts`: the head's tensors handed to the ops, then the statistics hook.

        A sync-free backend reads nothing back; under ``torch.compile`` the layout is then taken
        as it was last derived (a direct write into :attr:`assignment` is noticed by the next
        eager call, not inside a compiled step). The others run eagerly (:meth:`_score_eagerly`).
        """
        layout = self._layout_cache if torch.compiler.is_compiling() else self._layout
        assert layout is not None  # derived in the head's constructor
        if backend.writes_gradient:
            if self.words.trained() and self.words.sinks:
                self._check_weight_is_whole()
            weight, sink = self.words.gradient_sink(layout)
        else:
            self.words.invalidate()  # autograd, not the head, writes the grads here: forget what it wrote
            weight, sink = self.words.matrix(layout), None
        parts = two_level_log_prob(cluster_logits, hidden_w, weight, target, self.assignment, layout, backend,
                                   self._sync_free_width(), sink)
        if self.training:
            observe = self._observe_sync_free if backend.sync_free else self._observe
            observe(target, parts.cluster_log_probs.detach())
        return parts

    @outside_compile
    def _score_eagerly(self, cluster_logits: Tensor, hidden_w: Tensor, target: Tensor,
                       backend: BackendInfo) -> TwoLevelLogProb:
        """:meth:`_score` outside ``torch.compile``'s graph, for a backend that reads its batch back: its
        per-cluster loop, and the layout it reads, depend on which clusters a batch holds, so traced it
        would break the graph several times and recompile for every new set of clusters."""
        return self._score(cluster_logits, hidden_w, target, backend)

    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        _, cluster_part, word_part = self._parts(hidden, target)
        output = cluster_part + word_part
        return HeadOutput(output, -output.mean())

    def score_parts(self, hidden: Tensor, target: Tensor) -> ClusterScores:
        """``log P(C(t) | h)`` and ``log P(t | h, C(t))`` per row; they sum to ``forward``'s output."""
        hidden, target = self._check_inputs(hidden, target)
        _, cluster_part, word_part = self._parts(hidden, target)
        return ClusterScores(cluster_part, word_part)

    # -- evaluation ---------------------------------------------------------------
    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities (word-id order): every word of every cluster is scored, each weight
        where it is stored (with bands, each band's words in its own dimensions: never widened to one matrix;
        :func:`~sohsm.heads.two_level.ops.log_prob.scored_log_prob`)."""
        hidden = self._flatten_hidden(hidden)
        hidden_c, hidden_w = self._split_hidden(hidden)
        layout = self._layout
        return self._scored_log_prob(self._cluster_log_probs(hidden_c), hidden_w, layout)

    def _scored_log_prob(self, cluster_log_probs: Tensor, hidden_w: Tensor, layout: ClusterLayout) -> Tensor:
        """:meth:`log_prob` from the cluster log-probabilities and the word softmax's input."""
        if self.words.trained():  # autograd, not the head, writes the grads through it: the buffers' record lapses
            self.words.invalidate()
        bands = self.words.band_rows(layout) if self.words.banded else None
        hiddens = [hidden_w] if bands is None else [hidden_w[:, columns] for columns in bands.columns]
        return scored_log_prob(cluster_log_probs, hiddens, self.words.weights, scored_rows(layout, bands))

    @torch.no_grad()
    def sample(self, hidden: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """One word per row, ``[B]``, drawn from ``P(w | h)^(1/T)`` normalised. At temperature 1 by the hierarchy:
        a cluster from ``P(c | h)``, then a word of it from ``P(w | h, c)``, whose product is exactly ``P(w | h)``,
        scoring one cluster's words a row. At another temperature the powered distribution does not factor over
        the clusters (each cluster's normaliser needs all its words): every word is scored (``Head.sample``)."""
        if temperature != 1.0:
            return super().sample(hidden, temperature, generator)
        hidden = self._flatten_hidden(hidden)
        if hidden.size(0) == 0:
            return torch.empty(0, dtype=torch.long, device=hidden.device)
        hidden_c, hidden_w = self._split_hidden(hidden)
        layout = self._layout
        clusters = torch.multinomial(self._cluster_log_probs(hidden_c).exp(), 1, generator=generator)[:, 0]
        groups = group_rows(clusters, self.n_clusters)
        hidden_sorted = hidden_w.to(self.words.weights[0].dtype)[groups.order]
        if self.words.banded:
            logits = banded_in_cluster_logits(hidden_sorted, tuple(self.words.weights), self.words.band_rows(layout),
                                              layout, groups)
        else:
            logits = in_cluster_logits(hidden_sorted, self.words.weights[0], layout, groups)
        positions = torch.multinomial(upcast(logits).softmax(dim=1), 1, generator=generator)[:, 0]
        words = torch.empty_like(positions)
        words[groups.order] = layout.word_of_slot[layout.offsets_t[groups.row_cluster] + positions]
        return words

    @torch.no_grad()
    def search_topk(self, hidden: Tensor, k: int, chunk_pairs: int = 8192) -> TopKResult:
        """Exact top-k by best-first search over clusters (:func:`~sohsm.heads.best_first.best_first_topk`).

        ``P(c | h)`` bounds the probability of every word of ``c``. Every row first
        scores the words of its most probable cluster; a cluster can then only
        hold a better word if its ``log P(c | h)`` exceeds the row's k-th best score so far, so each
        unfinished row scores exactly those clusters, in one grouped pass (``chunk_pairs`` pairs at a time).
        A well-trained head visits a few clusters per row; a row whose open clusters hold more than a quarter of the
        words is scored densely instead (every word at once: never slower than that), unless :attr:`dense_topk` is
        ``False``.

        Args:
            hidden: ``[B, d]`` hidden states (``[*, d]`` is flattened).
            k: words per row, ``1 <= k <= N``.
            chunk_pairs: (row, cluster) pairs scored at a time.

        Returns:
            :class:`~sohsm.heads.best_first.TopKResult`: ``values`` and ``indices`` as
            ``log_prob(hidden).topk(k)`` gives them, and ``clusters_visited`` per row.
        """
        k = self._check_k(k)
        hidden = self._flatten_hidden(hidden)
        batch, device = hidden.size(0), hidden.device
        if batch == 0:  # as log_prob(hidden).topk(k) does: empty results
            return TopKResult(hidden.new_empty(0, k), torch.empty(0, k, dtype=torch.long, device=device),
                              torch.empty(0, dtype=torch.long, device=device))
        hidden_c, hidden_w = self._split_hidden(hidden)
        layout = self._layout
        cluster_log_probs = self._cluster_log_probs(hidden_c)  # [B, C]
        bands = self.words.band_rows(layout) if self.words.banded else None
        weight = tuple(self.words.weights) if bands is not None else self.words.weights[0]
        hidden_w = hidden_w.to(self.words.weights[0].dtype)  # the kernel scores in the weight's dtype

        def dense(rows: Tensor) -> Tensor:
            return self._scored_log_prob(cluster_log_probs[rows], hidden_w[rows], layout)

        return best_first_topk(cluster_log_probs, hidden_w, weight, layout, k, chunk_pairs, bands=bands,
                               dense=dense if self.dense_topk else None, dense_fraction=best_first.DENSE_FRACTION)

    def device_topk(self, hidden: Tensor, k: int, clusters: int = DEFAULT_CLUSTERS,
                    block_m: int = 16) -> DeviceTopK:
        """The top ``k`` words among each row's ``clusters`` most probable clusters, reading nothing back
        (:func:`~sohsm.heads.two_level.ops.topk.topk_in_clusters`): ``certified`` says where that is the exact top-k.

        Args:
            hidden: ``[*, in_features]`` hidden states.
            k: words per row, in ``[1, N]``.
            clusters: clusters scored per row (``M``), in ``[1, C]``; ``C`` is always exact.
            block_m: (row, cluster) pairs per tile.

        Raises:
            ValueError: ``k`` or ``clusters`` out of range, or ``hidden`` of the wrong shape.
        """
        k = self._check_k(k)
        if isinstance(clusters, bool) or not isinstance(clusters, int) or not 1 <= clusters <= self.n_clusters:
            raise ValueError(f"clusters must be an integer in [1, {self.n_clusters}], got {clusters!r}")
        hidden = self._flatten_hidden(hidden)
        # compiled, the layout is taken as last derived (deriving it checks the assignment's version: a host read)
        layout = self._layout_cache if torch.compiler.is_compiling() else self._layout
        assert layout is not None  # derived in the head's constructor
        hidden_c, hidden_w = self._split_hidden(hidden)
        cluster_log_probs = self._cluster_log_probs(hidden_c, layout)
        weight = self.words.matrix(layout)  # with bands, widened to one matrix
        return topk_in_clusters(cluster_log_probs, hidden_w.to(weight.dtype), weight, layout, self._sync_free_width(),
                                k, clusters, block_m)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``: by best-first search over clusters (:meth:`search_topk`) with the
        per-cluster backend, by :meth:`exact_topk` with a sync-free one, but with bands (whose device top-k would widen
        them into one ``N x (d + d/div + ...)`` matrix at every call) by the search, on every device."""
        if self.backend_for(hidden.device).sync_free and not self.words.banded:
            return self.exact_topk(hidden, k)
        result = self.search_topk(hidden, k)
        return result.values, result.indices

    def exact_topk(self, hidden: Tensor, k: int, clusters: int = DEFAULT_CLUSTERS) -> tuple[Tensor, Tensor]:
        """``log_prob(hidden).topk(k)``: :meth:`device_topk` (static shapes) over ``clusters`` clusters a row, one
        read-back of its certificate, and :meth:`search_topk` for the rows it could not certify (none searched
        when all rows are certified)."""
        hidden = self._flatten_hidden(hidden)
        result = self.device_topk(hidden, k, min(clusters, self.n_clusters))
        uncertified = (~result.certified).nonzero().squeeze(1)  # the one synchronisation
        if uncertified.numel() == 0:
            return result.values, result.indices
        rest = self.search_topk(hidden[uncertified], k)
        values, indices = result.values.clone(), result.indices.clone()
        values[uncertified], indices[uncertified] = rest.values, rest.indices
        return values, indices

