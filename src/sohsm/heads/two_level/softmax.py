"""Two-level (class-based) softmax with a word-to-cluster assignment.

    [h_c; h_w] = ReLU([W_c h; W_w h])                         (optional projection, paper Eq. 1)
    log P(w | h) = log softmax_c(h_c . U^C)[C(w)] + log softmax_{w' in C(w)}(h_w . U^V_w')[w]

This file holds the module: its parameters, the layout of its word vectors, the
forward pass and exact evaluation, and :meth:`TwoLevelSoftmax.set_assignment`,
which moves every word's row, its gradient and its optimizer state together when
the clusters change. Its parts live beside it, one idea a file:

* :mod:`sohsm.heads.two_level.ops`: the computation over explicit tensors (the cluster log-softmax,
  the in-cluster backends and their registry); the head passes its parameters, layout and gradient
  buffer in;
* :mod:`sohsm.heads.two_level.best_first`: exact top-k by best-first search over the clusters.

The self-organized head (:mod:`sohsm.heads.two_level.self_organizing.self_organized`) adds cluster
statistics and re-assignment on top of it.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.clustering import check_assignment, default_n_clusters, frequency_binning, random_assignment
from sohsm.heads.two_level import word_bands
from sohsm.heads.two_level.word_bands import BandedWords
from sohsm.heads.base import ClusteredHead, ClusterScores, HeadMemory, HeadOutput, check_counts, init_word_vectors
from sohsm.heads.two_level.device_topk import exact_topk
from sohsm.heads.two_level.best_first import TopKResult, best_first_topk
from sohsm.heads.two_level.ops import (BackendInfo, ClusterLayout, GradientSink, TwoLevelLogProb, check_backend,
                                      cluster_log_softmax, exact_log_prob, move_rows, select_backend,
                                      two_level_log_prob)
from sohsm.heads.two_level.ops.grouped import compute_dtype
from sohsm.heads.adaptive import check_cutoffs
from sohsm.heads.registry import register_head
from sohsm.heads.reused_gradient import ReusedGradient, WritesWeightGradient
from sohsm.heads.tying import HeadEmbedding
from sohsm.lazy import outside_compile


class TwoLevelSoftmax(BandedWords, WritesWeightGradient, ClusteredHead):
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

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput`: ``output`` ``[B]`` = log P(target | hidden), scalar ``loss``

    .. note::
        The gradient of :attr:`weight` is written directly into ``weight.grad``
        by a hand-written backward (a buffer reused across steps), so a tensor hook
        registered on ``weight`` (``register_hook``) is called with ``None``, and
        ``torch.autograd.grad`` cannot return it; a post-accumulate-grad hook
        (``register_post_accumulate_grad_hook``) runs once ``weight.grad`` holds the
        batch's gradient. Optimizers, ``zero_grad`` (both modes), gradient clipping,
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

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        assignment: Tensor | str = "random",
        n_clusters: int | None = None,
        counts: Tensor | None = None,
        projection: bool = False,
        seed: int = 0,
        word_dim: int | None = None,
        div_value: float | None = None,
        cutoffs: Sequence[int] | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(in_features, n_classes)
        self.backend = backend
        if word_dim is not None and (isinstance(word_dim, bool) or int(word_dim) != word_dim
                                     or not 1 <= int(word_dim) <= in_features):
            raise ValueError(f"word_dim must be an integer in [1, {in_features}] or None, got {word_dim!r}")
        word_dim = None if word_dim is None or int(word_dim) == in_features else int(word_dim)
        if word_dim is not None and projection:
            raise ValueError("word_dim and projection cannot be combined: Eq. 1's projection keeps d dimensions")
        bands = self._word_bands(div_value, cutoffs, counts, projection or word_dim is not None)
        if isinstance(assignment, str):
            n_clusters = default_n_clusters(n_classes) if n_clusters is None else int(n_clusters)
            if not 1 <= n_clusters <= n_classes:
                raise ValueError(f"n_clusters must be in [1, {n_classes}], got {n_clusters}")
            if assignment == "random":
                assignment = random_assignment(n_classes, n_clusters, torch.Generator().manual_seed(seed))
            elif assignment == "frequency":
                if counts is None:
                    raise ValueError("assignment='frequency' needs the word counts (counts=...)")
                assignment = frequency_binning(check_counts(counts, self.n_classes), n_clusters)
            else:
                raise ValueError(f"assignment must be a tensor, 'random' or 'frequency', got {assignment!r}")
        else:
            assignment = torch.as_tensor(assignment)
            if n_clusters is None:
                n_clusters = int(assignment.max()) + 1 if assignment.numel() else 1
        self.n_clusters = int(n_clusters)
        assignment = check_assignment(assignment, n_classes, self.n_clusters)

        self.projection = nn.Linear(in_features, 2 * in_features, bias=False) if projection else None
        #: ``d -> word_dim`` map of the hidden state before the in-cluster softmax (``None``: all ``d`` dimensions)
        self.word_projection = nn.Linear(in_features, word_dim, bias=False) if word_dim is not None else None
        self.word_dim = in_features if word_dim is None else word_dim
        #: ``d -> d // div_value**i`` maps of the hidden state for bands 1, 2, ... (``None``: no bands)
        self.band_projections = None
        if bands is not None:
            band_of_word, self.band_dims = bands
            self.band_projections = nn.ModuleList(nn.Linear(in_features, dim, bias=False)
                                                  for dim in self.band_dims[1:])
            self.register_buffer("band_of_word", band_of_word)
            self.word_dim = sum(self.band_dims)
        self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, in_features))
        if bands is None:
            #: word vectors U^V, rows grouped by cluster (see the module docstring)
            self.weight = nn.Parameter(torch.empty(n_classes, self.word_dim))
        else:
            #: with bands, band ``i``'s word vectors ``[n_i, d_i]`` in slot order (:mod:`.word_bands`); no ``weight``
            self.band_weights = nn.ParameterList(
                nn.Parameter(torch.empty(int(n), dim))
                for n, dim in zip(torch.bincount(band_of_word, minlength=len(self.band_dims)).tolist(), self.band_dims))
        self.register_buffer("assignment", assignment.clone())
        #: one reused gradient buffer per word-vector parameter (:meth:`_word_params`)
        self._grads = [ReusedGradient() for _ in self._word_params()]
        self._layout = ClusterLayout(self.assignment, self.n_clusters)
        #: optimizers given to :meth:`attach`, held weakly, each with its hook handle (or ``None``)
        self._optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.register_load_state_dict_pre_hook(_split_a_widened_weight)
        self.register_load_state_dict_post_hook(_rebuild_layout_after_load)
        self.reset_parameters()

    # -- parameters and layout ----------------------------------------------------
    def reset_parameters(self) -> None:
        bound = self.in_features ** -0.5
        if self.projection is not None:
            self.projection.reset_parameters()
        if self.word_projection is not None:
            self.word_projection.reset_parameters()
        nn.init.uniform_(self.cluster_weight, -bound, bound)
        if self.band_projections is None:
            init_word_vectors(self.weight)
            return
        self._reset_banded_weight()

    @property
    def _layout(self) -> ClusterLayout:
        """Where each word's row sits, derived again if someone wrote into :attr:`assignment`.

        DDP's buffer broadcast (at construction, and every forward with
        ``broadcast_buffers=True``) copies rank 0's assignment in place, together
        with rank 0's weights at construction: the rows are then laid out for it.
        """
        layout = self._layout_cache
        assignment = self.assignment
        if assignment._version != layout.version:
            if torch.equal(layout.cluster_of_slot[layout.slot_of_word], assignment):
                layout.version = assignment._version
            else:
                self._layout = ClusterLayout(assignment, self.n_clusters)
                self._invalidate_gradients()
        return self._layout_cache

    @_layout.setter
    def _layout(self, layout: ClusterLayout) -> None:
        old = self.__dict__.get("_layout_cache")
        if old is not None and old is not layout:
            old.retired = True  # a backward that saved it refuses to write rows that have moved
        self._layout_cache = layout
        if self.band_projections is not None:  # derived with the layout, so that a compiled step finds them
            self._band_rows(layout)

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(): keep the layout on the same device
        result = super()._apply(fn, recurse)
        self._layout = ClusterLayout(self.assignment, self.n_clusters)
        self._grads = [ReusedGradient() for _ in self._word_params()]
        return result

    def _invalidate_gradients(self) -> None:
        """Forget which rows the reused gradient buffers hold (the rows moved, or someone else wrote them)."""
        for buffer in self._grads:
            buffer.invalidate()

    def graph_refusal(self, device: torch.device) -> str | None:
        """``None`` with a sync-free backend on ``device`` (Triton's kernels on CUDA); the per-cluster one reads its
        batch's clusters back."""
        backend = self.backend_for(device)
        if backend.sync_free:
            return None
        return (f"the {type(self).__name__} head's {backend.name!r} backend reads its batch back to the host "
                "(backend='triton' or 'grouped_torch' does not)")

    def static_fingerprint(self) -> tuple:
        """The layout object (a re-clustering or a load makes a new one) and the assignment's version."""
        return (id(self._layout_cache), self.assignment._version)

    def clusters(self) -> list[Tensor]:
        """Word ids of each cluster (ascending), one tensor per cluster; empty clusters give empty tensors."""
        layout = self._layout
        return [layout.word_of_slot[layout.offsets[c] : layout.offsets[c + 1]] for c in range(self.n_clusters)]

    def cluster_sizes(self) -> Tensor:
        """``[n_clusters]`` number of words in each cluster."""
        return self._layout.sizes_t.clone()

    def word_vectors(self) -> Tensor:
        """``[N, d]`` output vectors ``U^V`` in word-id order (a copy; with bands ``[N, d + d/div + ...]``, each row
        zero outside its band's block)."""
        with torch.no_grad():
            return self._word_weight().detach()[self._layout.slot_of_word]

    def embed(self, ids: Tensor) -> Tensor:
        """``[*] -> [*, d]``: the vectors of ``ids``, a tied input embedding that follows the clusters.

        Where the head writes the weight's gradient itself (the per-cluster backend) the lookup's gradient is
        row-sparse: autograd adds the batch's rows into the head's dense ``weight.grad`` in place, instead of
        building a second ``N x d`` gradient and adding the two. Elsewhere (autograd's backends, under
        ``torch.compile``) it is dense.
        """
        for buffer in self._grads:  # autograd adds the embedding's share into the grads: the head's record lapses
            buffer.shared = True
        params = self._word_params()
        sparse = (torch.is_grad_enabled() and params[0].requires_grad and not torch.compiler.is_compiling()
                  and self.backend_for(ids.device).writes_gradient)
        if self.band_projections is None:
            return F.embedding(self._layout.slot_of_word[ids], self.weight, sparse=sparse)
        # adaptive input (Baevski & Auli 2019): a band-i word's d_i entries are read back up to d through the band's
        # own projection, P_i^T u_w, the very vector its score h . P_i^T u_w is taken with. Every id reads a row of
        # every band (its own row in its band, row 0 elsewhere) and the other bands' reads are multiplied by 0, so
        # each band's weight gets a gradient in its own words' rows only
        bands = self._band_rows()
        if not sparse and self.backend_for(ids.device).sync_free:
            # every band's vectors read up to d at once (a GPU's step is bound by the ops it issues, not by this
            # N x d product), then one gather: the same vectors as the loop below, in a handful of ops
            table = torch.cat([params[0], *(w @ p.weight for w, p in zip(params[1:], self.band_projections))])
            return F.embedding(bands.stacked_row_of_word[ids], table)
        slots = self._layout.slot_of_word[ids]
        band, row = bands.band_of_slot[slots], bands.row_of_slot[slots]
        out = None
        for b, weight in enumerate(params):
            member = band == b
            rows = F.embedding(torch.where(member, row, 0), weight, sparse=sparse) * member[..., None].to(weight.dtype)
            if b:
                rows = rows @ self.band_projections[b - 1].weight
            out = rows if out is None else out + rows
        return out

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

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        """Tied unless ``word_dim < d`` gives every word vector fewer entries than the embedding's. With ``div_value``
        a rarer word's short vector is read back up to ``d`` through its band's projection, as adaptive input does
        (:meth:`embed`); Eq. 1's ``projection`` keeps ``d``."""
        word_dim = options.get("word_dim")
        if word_dim is not None and word_dim != in_features:
            return f"word_dim={word_dim} gives its word vectors {word_dim} entries, not the embedding's {in_features}"
        return None

    def tied_embedding(self) -> HeadEmbedding:
        """A :class:`~sohsm.heads.tying.HeadEmbedding` reading :meth:`embed`: it follows every re-clustering."""
        if self.word_projection is not None:
            raise ValueError(f"{type(self).__name__} cannot be tied: its word vectors have {self.word_dim} entries "
                             f"where the embedding needs {self.in_features} (word_dim)")
        return HeadEmbedding(self)

    def tied_vectors(self) -> list[Tensor]:
        """The weight, or each band's weight (i.i.d. rows: the layout's order does not matter to a fresh draw)."""
        return self._word_params()

    def set_word_vectors(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """Word ``w``'s in-cluster vector becomes ``weight[w]``, in the row of its slot in the cluster layout (the
        clusters' own vectors are kept; a two-level head has no word bias, so ``bias`` is ignored)."""
        if self.word_dim != self.in_features or self.band_projections is not None:
            raise ValueError(f"{type(self).__name__}'s word vectors have {self.word_dim} entries "
                             f"{'in bands ' if self.band_projections is not None else ''}where [N, {self.in_features}] "
                             "vectors were given (word_dim, div_value and cutoffs change their width)")
        self._check_word_vectors(weight)
        with torch.no_grad():
            self.weight[self._layout.slot_of_word] = weight.to(self.weight.dtype)

    def set_assignment(self, assignment: Tensor, optimizer: torch.optim.Optimizer | None = None) -> Tensor:
        """Move words to new clusters, keeping every word's vector, gradient and optimizer state.

        The rows of :attr:`weight` are re-laid out for the new clusters; the same
        permutation is applied to ``weight.grad`` and to every weight-shaped
        tensor in the state of ``optimizer`` and of the optimizers given to
        :meth:`attach` (Adagrad sums, Adam moments, momentum buffers, ...).
        An unchanged assignment changes nothing at all.

        Returns:
            ``[N]`` bool tensor: which words changed cluster.
        """
        new = check_assignment(assignment, self.n_classes, self.n_clusters).to(self.assignment.device)
        moved = new != self.assignment
        if not bool(moved.any()):
            return moved
        return self._move_words(new, moved, optimizer)

    def _move_words(self, new: Tensor, moved: Tensor, optimizer: torch.optim.Optimizer | None) -> Tensor:
        """:meth:`set_assignment` of a checked ``new`` assignment on the head's device, reading nothing back but what
        a new layout reads (its largest cluster; with bands, where each band's rows are): a re-clustering's own
        assignment is valid by construction, and moving none is a plain copy."""
        old_layout = self._layout
        new_layout = ClusterLayout(new, self.n_clusters)
        # new slot s holds word new.word_of_slot[s], which sat at old.slot_of_word[...]
        permutation = old_layout.slot_of_word[new_layout.word_of_slot]
        if self.band_projections is None:
            move_rows([self.weight, self.weight.grad, *self._optimizer_state(self.weight, optimizer, rows=True)],
                      permutation)
        else:  # band b's new row r holds the word of new slot new.slots[b][r], which sat at old row ...
            old_bands, new_bands = self._band_rows(old_layout), self._band_rows(new_layout)
            for weight, slots in zip(self.band_weights, new_bands.slots):
                move_rows([weight, weight.grad, *self._optimizer_state(weight, optimizer, rows=True)],
                          old_bands.row_of_slot[permutation[slots]])
        self.assignment.copy_(new)
        new_layout.version = self.assignment._version
        self._layout = new_layout
        self._invalidate_gradients()
        return moved

    def _optimizer_state(self, param: Tensor, optimizer: torch.optim.Optimizer | None = None,
                         rows: bool = False) -> list[Tensor]:
        """The tensors in the state of ``param`` of every attached optimizer and of ``optimizer``: with
        ``rows``, those shaped like ``param`` (one row per word: Adagrad sums, Adam moments, momentum)."""
        optimizers = list(self._optimizers)
        if optimizer is not None and all(optimizer is not o for o in optimizers):
            optimizers.append(optimizer)
        return [value for opt in optimizers for value in opt.state.get(param, {}).values()
                if isinstance(value, Tensor) and (not rows or value.shape == param.shape)]

    # -- the forward pass ---------------------------------------------------------
    def _cluster_log_probs(self, hidden_c: Tensor) -> Tensor:
        """``[B, C]`` log P(c | h); a cluster without words gets probability 0."""
        return cluster_log_softmax(F.linear(hidden_c, self.cluster_weight), self._layout.empty_clusters)

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
        backend = self.backend_for(hidden_w.device, compute_dtype(hidden_w, self._word_params()[0]))
        layout = self._layout_cache if torch.compiler.is_compiling() else self._layout
        cluster_logits = F.linear(hidden_c, self.cluster_weight, layout.empty_bias.to(self.cluster_weight.dtype))
        score = self._score if backend.sync_free else self._score_eagerly
        return score(cluster_logits, hidden_w, target, backend)

    # -- how the in-cluster softmax is computed (the backend) -------------------------------------
    @property
    def backend(self) -> str:
        """How the in-cluster softmax is computed (see the constructor); settable."""
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_backend(value)

    def check_device(self, device: torch.device) -> None:
        """Refuse a ``backend`` that cannot run on ``device`` (``"triton"`` on the CPU, or without Triton)."""
        self.backend_for(device)

    def backend_for(self, device: torch.device, compute: torch.dtype | None = None) -> BackendInfo:
        """The in-cluster backend that runs on ``device`` with products in ``compute`` (default: the weight's dtype):
        :attr:`backend`, or what ``"auto"`` picks there from the registry (:mod:`sohsm.heads.two_level.ops.backends`),
        fallbacks included. Compact statistics (``q_clusters``) are folded in by the per-cluster backend only."""
        compute = self._word_params()[0].dtype if compute is None else compute
        sync_free = getattr(self, "q_clusters", None) is None
        return select_backend(self.backend, torch.device(device), compute, sync_free=sync_free)

    def _sync_free_width(self) -> int:
        """Static width of the sync-free path's logits: the largest cluster (fixed clusters)."""
        return self._layout_cache.max_size

    def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Hook for subclasses on the sync-free path: like :meth:`_observe`, but reads nothing back."""

    def _score(self, cluster_logits: Tensor, hidden_w: Tensor, target: Tensor,
               backend: BackendInfo) -> TwoLevelLogProb:
        """The rest of :meth:`_parts`: the head's tensors handed to the ops, then the statistics hook.

        A sync-free backend reads nothing back; under ``torch.compile`` the layout is then taken
        as it was last derived (a direct write into :attr:`assignment` is noticed by the next
        eager call, not inside a compiled step). The others run eagerly (:meth:`_score_eagerly`).
        """
        layout = self._layout_cache if torch.compiler.is_compiling() else self._layout
        if backend.writes_gradient:
            if torch.is_grad_enabled() and self._word_params()[0].requires_grad:
                self._check_weight_is_whole()
            weight, sink = self._gradient_sink(layout)
        else:
            self._invalidate_gradients()  # autograd, not the head, writes the grads here: forget what it wrote
            weight, sink = self._word_weight(), None
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

    def _gradient_sink(self, layout: ClusterLayout):
        """``(weight, sink)`` for a backend that writes the word vectors' gradient itself: :attr:`weight` and its
        ``.grad`` (a reused buffer); with bands (``div_value``) a tuple of each band's weight and one of sinks, the
        layout's :class:`~sohsm.heads.two_level.word_bands.BandRows` saying where each band's rows are."""
        if self.band_projections is None:
            return self.weight, GradientSink(self.weight, self._grads[0])
        self._band_rows(layout)
        weights = tuple(self.band_weights)
        return weights, tuple(GradientSink(w, buffer) for w, buffer in zip(weights, self._grads))

    def _observe(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Hook for subclasses: sees the cluster log-probabilities of every training batch."""

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
        """Exact ``[B, N]`` log-probabilities (word-id order): every word of every cluster is scored."""
        hidden = self._flatten_hidden(hidden)
        hidden_c, hidden_w = self._split_hidden(hidden)
        return exact_log_prob(self._cluster_log_probs(hidden_c), hidden_w, self._word_weight(), self._layout)

    @torch.no_grad()
    def search_topk(self, hidden: Tensor, k: int, chunk_pairs: int = 8192) -> TopKResult:
        """Exact top-k by best-first search over clusters (:func:`~sohsm.heads.best_first.best_first_topk`).

        ``P(c | h)`` bounds the probability of every word of ``c``. Every row first
        scores the words of its most probable cluster; a cluster can then only
        hold a better word if its ``log P(c | h)`` exceeds the row's k-th best score so far, so each
        unfinished row scores exactly those clusters, in one grouped pass (``chunk_pairs`` pairs at a time).
        A well-trained head visits a few clusters per row; an untrained one may visit all of them.

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
        weight = self._word_weight()
        hidden_w = hidden_w.to(weight.dtype)  # the kernel scores in the weight's dtype
        cluster_log_probs = self._cluster_log_probs(hidden_c)  # [B, C]
        return best_first_topk(cluster_log_probs, hidden_w, weight, self._layout, k, chunk_pairs)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``: by best-first search over clusters (:meth:`search_topk`) with the
        per-cluster backend, or, with a sync-free one, by :func:`~sohsm.heads.device_topk.exact_topk` (static
        shapes, one read-back of its certificate; the search for the rows it cannot certify)."""
        if self.backend_for(hidden.device).sync_free:
            return exact_topk(self, hidden, k)
        result = self.search_topk(hidden, k)
        return result.values, result.indices

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, n_classes={self.n_classes}, n_clusters={self.n_clusters}, "
            f"max_cluster_size={self._layout.max_size}, projection={self.projection is not None}"
            + (f", backend={self.backend!r}" if self.backend != "auto" else "")
            + (f", word_dim={self.word_dim}" if self.word_projection is not None else "")
            + (f", band_dims={self.band_dims}" if self.band_projections is not None else "")
        )


def _rebuild_layout_after_load(module: TwoLevelSoftmax, incompatible_keys) -> None:
    """A loaded ``assignment`` brings its own row layout of ``weight``: derive the layout again."""
    module._layout = ClusterLayout(module.assignment, module.n_clusters)
    module._invalidate_gradients()


def _split_a_widened_weight(module: TwoLevelSoftmax, state_dict: dict, prefix: str, *args) -> None:
    """A banded head saved before each band had its own weight kept one ``[N, d + d/div + ...]`` ``weight``, its rows
    in the layout of the saved ``assignment``: each band's rows and block become that band's weight."""
    key = prefix + "weight"
    if module.band_projections is None or key not in state_dict:
        return
    assignment, band_of_word = state_dict.get(prefix + "assignment"), state_dict.get(prefix + "band_of_word")
    if assignment is None or band_of_word is None:
        return  # load_state_dict reports the missing keys
    wide = state_dict.pop(key)
    layout = ClusterLayout(assignment.to(wide.device), module.n_clusters)
    bands = word_bands.BandRows(band_of_word.to(wide.device), layout, module.band_dims)
    for b, (slots, columns) in enumerate(zip(bands.slots, bands.columns)):
        state_dict[f"{prefix}band_weights.{b}"] = wide[slots, columns]


@register_head("two_level_random", builds=TwoLevelSoftmax, fixed=("assignment",))
def _two_level_random(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="random", **options)


@register_head("two_level_frequency", builds=TwoLevelSoftmax, fixed=("assignment",))
def _two_level_frequency(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="frequency", counts=counts, **options)
