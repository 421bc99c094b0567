"""Two-level (class-based) softmax with a word-to-cluster assignment.

    [h_c; h_w] = ReLU([W_c h; W_w h])                         (optional projection, paper Eq. 1)
    log P(w | h) = log softmax_c(h_c . U^C)[C(w)] + log softmax_{w' in C(w)}(h_w . U^V_w')[w]

This file holds the module: its parameters and the layout of its word vectors. Its parts live beside it, one idea
a file:

* :mod:`sohsm.heads.two_level.moves`: :meth:`~sohsm.heads.two_level.moves.ClusterMoves.set_assignment`, which moves
  every word's row, its gradient and its optimizer state together when the clusters change (mixed in);

* :mod:`sohsm.heads.two_level.scoring`: the forward pass, exact evaluation and top-k (mixed in, its reads of the
  head declared as a ``typing.Protocol``, as the next two declare theirs);
* :mod:`sohsm.heads.two_level.backend_choice`: the ``backend`` setting and which backend runs on a device (mixed in);
* :mod:`sohsm.heads.two_level.tied_words`: the word vectors as a tied input embedding, and set from outside by word
  id (mixed in);

* :mod:`sohsm.heads.two_level.ops`: the computation over explicit tensors (the cluster log-softmax,
  the in-cluster backends and their registry); the head passes its parameters, layout and gradient
  buffer in;
* :mod:`sohsm.heads.two_level.word_vectors`: the word vectors (plain or in bands), their gradient buffers, their
  reads (a tied embedding's among them) and their moves;
* :mod:`sohsm.heads.two_level.best_first`: exact top-k by best-first search over the clusters;
  :mod:`sohsm.heads.two_level.ops.topk`: the same with static shapes and a certificate.

The self-organized head (:mod:`sohsm.heads.two_level.self_organizing.self_organized`) adds cluster
statistics and re-assignment on top of it.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sohsm.clustering import default_n_clusters, initial_assignment
from sohsm.heads.adaptive import check_cutoffs
from sohsm.heads.base import ClusteredHead, HeadMemory, check_counts
from sohsm.heads.registry import register_head
from sohsm.heads.reused_gradient import WritesWeightGradient
from sohsm.heads.two_level import run_defaults, word_bands
from sohsm.heads.two_level.backend_choice import BackendChoice
from sohsm.heads.two_level.moves import ClusterMoves
from sohsm.heads.two_level.ops import ClusterLayout
from sohsm.heads.two_level.scoring import TwoLevelScoring
from sohsm.heads.two_level.tied_words import TiedWords
from sohsm.heads.two_level.word_vectors import (
    WordVectors,
    split_widened_weight,
    word_bands as resolve_bands,
    word_width,
)


class TwoLevelSoftmax(TwoLevelScoring, ClusterMoves, BackendChoice, TiedWords, WritesWeightGradient, ClusteredHead):
    """Two-level softmax over fixed word clusters (class-based softmax).

    ``P(w | h) = P(C(w) | h) * P(w | h, C(w))``: a softmax over the clusters and a
    softmax over the words of the target's cluster, so a training step
    normalises over ``|C| + |C(w)|`` scores instead of ``N``. With ``sqrt(N)``
    clusters of about ``sqrt(N)`` words that is ``O(sqrt(N))``.

    Paper: Shen, Tan, Pal and Courville (2017), "Self-organized Hierarchical Softmax",
    https://arxiv.org/abs/1707.08588 (Eq. 1-4). Frequency binning: Mikolov et al.
    (2011), "Extensions of recurrent neural network language model".

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        assignment: ``[N]`` cluster id of every word, or ``"random"`` (balanced,
            seeded by ``seed``) or ``"frequency"`` (binning by ``counts``).
            Default: ``"random"``.
        n_clusters: number of clusters. Default: ``ceil(sqrt(N))`` (for an
            explicit assignment: ``max(assignment) + 1``).
        counts: ``[N]`` training counts; needed for ``"frequency"``.
        projection: apply the ReLU projections of Eq. 1 (two ``d x d`` maps, one
            for the cluster and one for the word softmax). Default: ``False``, by
            measurement (docs/results/lm.md, "What the paper prescribes, what we measured, what the
            default is").
        seed: seed of the random assignment.
        word_dim: score the words inside a cluster in ``word_dim`` dimensions: the
            hidden state is first mapped to them by a ``d x word_dim`` linear map, and
            the word vectors ``U^V`` have ``word_dim`` entries (adaptive softmax gives
            its tail clusters ``d / 4`` and ``d / 16``). Fewer parameters to train per
            word and fewer bytes a step; the cluster softmax keeps all ``d``.
            Default: ``None`` (``d``, no map). Not with ``projection``.
        div_value: differentiated dimensions (:mod:`sohsm.heads.two_level.word_bands`): words of
            frequency band ``i`` (ranks between ``cutoffs``) are scored in
            ``d // div_value**i`` dimensions, as adaptive softmax scores its tail
            clusters, while clusters stay free to mix bands. Each band's vectors are their own
            parameter, ``band_weights[i]`` (``[n_i, d_i]``, rows in slot order), in place of
            :attr:`weight`. Default: ``None`` (every word in ``d`` dimensions, the paper). Not with
            ``projection`` or ``word_dim``.
        cutoffs: frequency ranks where the bands of ``div_value`` start. Default:
            adaptive softmax's (:func:`~sohsm.heads.adaptive.default_cutoffs`, 2k and 10k
            of 44k words scaled to ``N``). Words are ranked by ``counts`` (else by id).
        backend: how the in-cluster softmax is computed in training, :meth:`topk` and :meth:`predict`
            (:mod:`sohsm.heads.two_level.ops` says which path runs when): ``"per_cluster"``
            (one product per cluster a batch holds; reads the row counts back), ``"triton"`` (the
            sync-free kernels: static shapes, nothing read back), ``"grouped_torch"`` (the same
            path in plain torch, for small sizes and tests), ``"auto"`` (default): ``"triton"`` on
            CUDA where its kernels run, else ``"per_cluster"``, the faster on the CPU (a warning says
            once why Triton did not run on CUDA: not installed, float64, a kernel that does not
            compile).
        cluster_bias: give each cluster a bias beside its vector, ``P(c | h) = softmax_c(U^C h + b)``. Off by
            default (the paper's Eq. 1 has none, and a trained model can put one in its hidden state); on where
            the hidden states are a pretrained model's, fixed: a cluster's probability there is the log-sum-exp of
            its words' trained scores, which a vector alone fits only up to a constant per cluster
            (``sohsm.hf.use_head`` turns it on, docs/results/pretrained.md measures it).

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput`: ``output`` ``[B]`` = log P(target | hidden), scalar ``loss``

    .. note::
        In ``backward()`` the gradient of :attr:`weight` is written directly into ``weight.grad``
        by a hand-written backward (a buffer reused across steps), so a tensor hook
        registered on ``weight`` (``register_hook``) is called with ``None``; a post-accumulate-grad hook
        (``register_post_accumulate_grad_hook``) runs once ``weight.grad`` holds the
        batch's gradient. ``torch.autograd.grad`` returns it (dense) when asked for it and writes no ``.grad``;
        under ``torch.func.functional_call`` the tensors given are used and their gradient returned by
        autograd. Optimizers, ``zero_grad`` (both modes), gradient clipping,
        gradient accumulation, activation checkpointing and DistributedDataParallel
        (any bucket settings) work as usual; ``nn.DataParallel`` on several devices
        and sharded or flattened weights (FSDP, ZeRO-3) are refused.

        Under ``torch.autocast`` the cluster softmax is normalised in float32 and the
        in-cluster kernel scores in the weight's dtype. The per-cluster kernel's
        data-dependent part (which clusters a batch holds) runs eagerly under
        ``torch.compile``; the sync-free path (``backend="triton"``, or
        ``"grouped_torch"``; ``"auto"`` takes Triton on CUDA)
        reads nothing back, traces whole with the target check on (it runs on the
        device), and scores in the autocast dtype. :attr:`weight` has its rows grouped by cluster: an input embedding
        tied to it reads them through :meth:`embed`.
    """

    #: buffers (``band_of_word``: with bands only) and the bound word vectors, declared for the type checker
    assignment: Tensor
    band_of_word: Tensor
    _bound_words: WordVectors

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        *,
        assignment: Tensor | str = "random",
        n_clusters: int | None = None,
        counts: Tensor | None = None,
        projection: bool = False,
        seed: int = 0,
        word_dim: int | None = None,
        div_value: float | None = None,
        cutoffs: Sequence[int] | None = None,
        backend: str = "auto",
        cluster_bias: bool = False,
    ) -> None:
        super().__init__(in_features, n_classes)
        self.backend = backend
        word_dim = word_width(word_dim, in_features, projection)
        bands = resolve_bands(div_value, cutoffs, counts, projection or word_dim is not None, n_classes, in_features)
        counts = None if counts is None else check_counts(counts, n_classes)
        assignment, self.n_clusters = initial_assignment(assignment, n_classes, n_clusters, counts, seed)

        self.projection = nn.Linear(in_features, 2 * in_features, bias=False) if projection else None
        #: ``d -> word_dim`` map of the hidden state before the in-cluster softmax (``None``: all ``d`` dimensions)
        self.word_projection = nn.Linear(in_features, word_dim, bias=False) if word_dim is not None else None
        self.word_dim = in_features if word_dim is None else word_dim
        #: ``d -> d // div_value**i`` maps of the hidden state for bands 1, 2, ... (``None``: no bands)
        self.band_projections: nn.ModuleList | None = None
        self.band_dims: list[int] | None = None
        if bands is not None:
            band_of_word, band_dims = bands
            self.band_dims = band_dims
            self.band_projections = nn.ModuleList(nn.Linear(in_features, dim, bias=False) for dim in band_dims[1:])
            self.register_buffer("band_of_word", band_of_word)
            self.word_dim = sum(band_dims)
        self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, in_features))
        if not isinstance(cluster_bias, bool):
            raise ValueError(f"cluster_bias must be True or False, got {cluster_bias!r}")
        #: ``[C]`` each cluster's bias in the cluster softmax (``None``: none, the default)
        self.register_parameter("cluster_bias", nn.Parameter(torch.zeros(self.n_clusters)) if cluster_bias else None)
        if bands is None:
            #: word vectors U^V, rows grouped by cluster (see the module docstring)
            self.weight = nn.Parameter(torch.empty(n_classes, self.word_dim))
        else:
            #: with bands, band ``i``'s word vectors ``[n_i, d_i]`` in slot order (:mod:`.word_bands`); no ``weight``
            self.band_weights = nn.ParameterList(
                nn.Parameter(torch.empty(int(n), dim))
                for n, dim in zip(torch.bincount(band_of_word, minlength=len(band_dims)).tolist(), band_dims))
        self.register_buffer("assignment", assignment.clone())
        #: the word vectors' gradient buffers, band rows, reads and moves (:mod:`.word_vectors`)
        self.words = self._bind_words()
        self._layout_cache: ClusterLayout | None = None
        self._static = False  # see set_static
        self._layout = ClusterLayout(self.assignment, self.n_clusters)
        #: optimizers given to :meth:`attach`, held weakly, each with its hook handle (or ``None``)
        self._optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.register_load_state_dict_pre_hook(_split_a_widened_weight)
        self.register_load_state_dict_post_hook(_rebuild_layout_after_load)
        self.reset_parameters()

    def _bind_words(self, sinks: bool = True) -> WordVectors:
        """A :class:`WordVectors` over the head's word-vector parameters as they are now."""
        if self.band_projections is None:
            return WordVectors([self.weight], sinks=sinks)
        return WordVectors(list(self.band_weights), self.band_projections, self.band_of_word, self.band_dims, sinks)

    @property
    def words(self) -> WordVectors:
        """The word vectors (:mod:`.word_vectors`): the head's own, bound with their gradient buffers, and bound anew
        when a parameter is assigned in their place; while ``torch.func.functional_call`` has swapped plain tensors
        in for them, those tensors, whose gradient autograd returns (no sink)."""
        words = self._bound_words
        if self.band_projections is None:
            if self._parameters["weight"] is words.weights[0]:
                return words
        elif self._buffers["band_of_word"] is words.band_of_word and all(
                a is b for a, b in zip(self.band_weights, words.weights)):
            return words
        words = self._bind_words(sinks=False)
        if all(isinstance(w, nn.Parameter) for w in words.weights):
            words = self._bound_words = self._bind_words()
        return words

    @words.setter
    def words(self, words: WordVectors) -> None:
        self._bound_words = words

    # -- parameters and layout ----------------------------------------------------
    def reset_parameters(self) -> None:
        bound = self.in_features ** -0.5
        if self.projection is not None:
            self.projection.reset_parameters()
        if self.word_projection is not None:
            self.word_projection.reset_parameters()
        nn.init.uniform_(self.cluster_weight, -bound, bound)
        if self.cluster_bias is not None:
            nn.init.zeros_(self.cluster_bias)
        self.words.reset()

    @property
    def _layout(self) -> ClusterLayout:
        """Where each word's row sits, derived again if someone wrote into :attr:`assignment`. DDP's buffer broadcast
        (at construction, and every forward with ``broadcast_buffers=True``) copies rank 0's assignment in place,
        together with rank 0's weights at construction: the rows are then laid out for it."""
        layout = self._layout_cache
        assert layout is not None  # derived in the constructor
        assignment = self.assignment
        if assignment._version != layout.version:
            if torch.equal(layout.cluster_of_slot[layout.slot_of_word], assignment):
                layout.version = assignment._version
            else:
                layout = self._layout = ClusterLayout(assignment, self.n_clusters)
                self.words.invalidate()
        return layout

    @_layout.setter
    def _layout(self, layout: ClusterLayout) -> None:
        old = self._layout_cache
        if old is not None and old is not layout:
            old.retired = True  # a backward that saved it refuses to write rows that have moved
        self._layout_cache = layout
        if self.words.banded:  # derived with the layout, so that a compiled step finds them
            self.words.band_rows(layout)

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(): keep the layout on the same device
        result = super()._apply(fn, recurse)
        self.words = self._bind_words()
        self._layout = ClusterLayout(self.assignment, self.n_clusters)
        return result

    def _gradient_weights(self) -> list[Tensor]:
        return self.words.weights

    def set_static(self, static: bool) -> None:
        """A static step's re-clustering rewrites the layout's tensors in place (:meth:`_move_words`): a captured
        step reads the new clusters from the storage it was captured on, one capture for a whole run."""
        super().set_static(static)
        self._static = bool(static)

    def static_fingerprint(self) -> tuple:
        """The layout's serial (a new layout: a load, ``.to()``, an eager re-clustering) and the sync-free width."""
        return (self._layout.serial, self._sync_free_width())

    def static_rewrites(self) -> int:  # noqa: D102 - Head's
        layout = self._layout_cache  # as last derived: reading it must not derive a new one (a captured step's)
        assert layout is not None  # derived in the constructor
        return layout.rewrites

    def clusters(self) -> list[Tensor]:
        """Word ids of each cluster (ascending), one tensor per cluster; empty clusters give empty tensors."""
        layout = self._layout
        return [layout.word_of_slot[layout.offsets[c] : layout.offsets[c + 1]] for c in range(self.n_clusters)]

    def cluster_sizes(self) -> Tensor:
        """``[n_clusters]`` number of words in each cluster."""
        return self._layout.sizes_t.clone()

    @classmethod
    def memory_estimate(cls, in_features: int, n_classes: int, options: dict, rows: int) -> HeadMemory:
        """Its word vectors, the clusters' vectors (``ceil(sqrt(N))`` unless ``n_clusters`` says) and Eq. 1's
        projection where it has one."""
        clusters = options.get("n_clusters") or default_n_clusters(n_classes)
        projection = 2 * in_features * in_features if options.get("projection") else 0
        words = n_classes * in_features
        if options.get("div_value") is not None:  # each band's words in its width, and its projection
            cutoffs = check_cutoffs(options.get("cutoffs"), n_classes)
            dims = word_bands.band_dims(in_features, len(cutoffs) + 1, options["div_value"])
            edges = [0, *cutoffs, n_classes]
            words = sum((stop - start) * dim for start, stop, dim in zip(edges, edges[1:], dims))
            projection = in_features * sum(dims[1:])
        return HeadMemory(words + clusters * in_features + projection, words)

    def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Hook for subclasses on the sync-free path: like :meth:`_observe`, but reads nothing back."""

    def _observe(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Hook for subclasses: sees the cluster log-probabilities of every training batch."""

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, n_classes={self.n_classes}, n_clusters={self.n_clusters}, "
            f"max_cluster_size={self._layout.max_size}, projection={self.projection is not None}"
            + (f", backend={self.backend!r}" if self.backend != "auto" else "")
            + (f", word_dim={self.word_dim}" if self.word_projection is not None else "")
            + (f", band_dims={self.band_dims}" if self.band_projections is not None else "")
        )


def _rebuild_layout_after_load(module: TwoLevelSoftmax, incompatible_keys) -> None:
    """A loaded ``assignment`` brings its own row layout of ``weight``: derive the layout again (the gradient
    buffers' record of written rows lapses; a load with ``assign=True`` replaced the tensors: bound anew)."""
    words = module._bind_words()
    bound = module._bound_words
    if [id(w) for w in words.weights] == [id(w) for w in bound.weights] and words.band_of_word is bound.band_of_word:
        bound.invalidate()
    else:
        module.words = words
    module._layout = ClusterLayout(module.assignment, module.n_clusters)


def _split_a_widened_weight(module: TwoLevelSoftmax, state_dict: dict, prefix: str, *args) -> None:
    """A banded head's checkpoint from before each band had its own weight: its one widened weight split by band."""
    if module.band_dims is not None:
        split_widened_weight(state_dict, prefix, module.n_clusters, module.band_dims)


@register_head("two_level_random", builds=TwoLevelSoftmax, fixed=("assignment",),
               resume_refusal=run_defaults.widened_weight_refusal)
def _two_level_random(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="random", **options)


@register_head("two_level_frequency", builds=TwoLevelSoftmax, fixed=("assignment",),
               resume_refusal=run_defaults.widened_weight_refusal)
def _two_level_frequency(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="frequency", counts=counts, **options)
