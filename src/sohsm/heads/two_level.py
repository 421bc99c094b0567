"""Two-level (class-based) softmax with a word-to-cluster assignment.

    [h_c; h_w] = ReLU([W_c h; W_w h])                         (optional projection, paper Eq. 1)
    log P(w | h) = log softmax_c(h_c . U^C)[C(w)] + log softmax_{w' in C(w)}(h_w . U^V_w')[w]

The per-cluster kernel lives here, once; the self-organized head adds cluster
statistics and re-assignment on top of it.

Storage layout. The word vectors ``U^V`` are stored *grouped by cluster*: rows
``offsets[c] : offsets[c] + sizes[c]`` of :attr:`TwoLevelSoftmax.weight` are the
words of cluster ``c`` in increasing word id. Each present cluster then costs one
matrix product on a contiguous block forward and two backward, and its gradient
is one contiguous block. When the assignment changes, :meth:`set_assignment`
moves every word's row, its gradient and its optimizer state together.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.clustering import check_assignment, default_n_clusters, frequency_binning, random_assignment
from sohsm.heads import grouped
from sohsm.heads.base import ClusteredHead, ClusterScores, HeadOutput, check_counts, upcast
from sohsm.heads.registry import register_head
from sohsm.heads.reused_gradient import ReusedGradient, WritesWeightGradient


class TopKResult(NamedTuple):
    """Exact top-k words of a two-level head.

    Attributes:
        values: ``[B, k]`` log-probabilities, best first.
        indices: ``[B, k]`` word ids.
        clusters_visited: ``[B]`` clusters whose words were scored for each row.
    """

    values: Tensor
    indices: Tensor
    clusters_visited: Tensor


class _Layout:
    """Derived, non-persistent view of an assignment: where each word's row sits."""

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


class _Groups(NamedTuple):
    """Rows of a batch grouped by the cluster whose words they score."""

    order: Tensor  # [B] row permutation that sorts rows by cluster
    row_cluster: Tensor  # [B] cluster of each sorted row
    clusters: list[int]  # present clusters, ascending
    row_counts: list[int]  # rows of each present cluster, in the sorted batch


def _group_rows(row_cluster: Tensor, n_clusters: int) -> _Groups:
    row_cluster_sorted, order = torch.sort(row_cluster, stable=True)
    counts = torch.bincount(row_cluster, minlength=n_clusters).tolist()
    clusters = [c for c, n in enumerate(counts) if n]
    return _Groups(order, row_cluster_sorted, clusters, [counts[c] for c in clusters])


def _in_cluster_logits(hidden_sorted: Tensor, weight: Tensor, layout: _Layout, groups: _Groups) -> Tensor:
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


class _InClusterLogProb(torch.autograd.Function):
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
        groups = _group_rows(row_cluster, head.n_clusters)
        hidden_sorted = hidden[groups.order]  # [B, d]
        log_probs = F.log_softmax(_in_cluster_logits(hidden_sorted, weight, layout, groups), dim=1)
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
            head._accumulate_weight_grad(grad_logits, hidden_sorted, groups)
        return grad_hidden, None, None, None, None


class TwoLevelSoftmax(WritesWeightGradient, ClusteredHead):
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
            measurement (see :class:`~sohsm.heads.SelfOrganizedSoftmax` and docs/results/lm.md).
        seed: seed of the random assignment.
        word_dim: score the words inside a cluster in ``word_dim`` dimensions: the
            hidden state is first mapped to them by a ``d x word_dim`` linear map, and
            the word vectors ``U^V`` have ``word_dim`` entries (adaptive softmax gives
            its tail clusters ``d / 4`` and ``d / 16``). Fewer parameters to train per
            word and fewer bytes a step; the cluster softmax keeps all ``d``.
            Default: ``None`` (``d``, no map). Not with ``projection``.

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
        in-cluster kernel scores in the weight's dtype. Under ``torch.compile`` the
        data-dependent part (which clusters a batch holds) runs eagerly; set
        ``head.check_targets = False`` to drop the host-side target check as well.
        The sync-free path (``head.sync_free = True``; not yet the default, as its
        Triton kernels have not been measured on a GPU) reads nothing back, traces
        whole, and scores in the autocast dtype. :attr:`weight`
        cannot be tied to an embedding: its rows are grouped by cluster (use :meth:`word_vectors`).
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
    ) -> None:
        super().__init__(in_features, n_classes)
        if word_dim is not None and (isinstance(word_dim, bool) or int(word_dim) != word_dim
                                     or not 1 <= int(word_dim) <= in_features):
            raise ValueError(f"word_dim must be an integer in [1, {in_features}] or None, got {word_dim!r}")
        word_dim = None if word_dim is None or int(word_dim) == in_features else int(word_dim)
        if word_dim is not None and projection:
            raise ValueError("word_dim and projection cannot be combined: Eq. 1's projection keeps d dimensions")
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
        self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, in_features))
        #: word vectors U^V, rows grouped by cluster (see the module docstring)
        self.weight = nn.Parameter(torch.empty(n_classes, self.word_dim))
        self.register_buffer("assignment", assignment.clone())
        self._layout_cache = _Layout(self.assignment, self.n_clusters)
        self._grad = ReusedGradient()
        #: optimizers given to :meth:`attach`, held weakly, each with its hook handle (or ``None``)
        self._optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
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
        nn.init.uniform_(self.weight, -(self.word_dim ** -0.5), self.word_dim ** -0.5)

    @property
    def _layout(self) -> _Layout:
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
                self._layout = _Layout(assignment, self.n_clusters)
                self._grad.invalidate()
        return self._layout_cache

    @_layout.setter
    def _layout(self, layout: _Layout) -> None:
        self._layout_cache = layout

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(): keep the layout on the same device
        result = super()._apply(fn, recurse)
        self._layout = _Layout(self.assignment, self.n_clusters)
        self._grad = ReusedGradient()
        return result

    def clusters(self) -> list[Tensor]:
        """Word ids of each cluster (ascending), one tensor per cluster; empty clusters give empty tensors."""
        layout = self._layout
        return [layout.word_of_slot[layout.offsets[c] : layout.offsets[c + 1]] for c in range(self.n_clusters)]

    def cluster_sizes(self) -> Tensor:
        """``[n_clusters]`` number of words in each cluster."""
        return self._layout.sizes_t.clone()

    def word_vectors(self) -> Tensor:
        """``[N, d]`` output vectors ``U^V`` in word-id order (a copy)."""
        return self.weight.detach()[self._layout.slot_of_word]

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
        old_layout = self._layout
        new_layout = _Layout(new, self.n_clusters)
        # new slot s holds word new.word_of_slot[s], which sat at old.slot_of_word[...]
        permutation = old_layout.slot_of_word[new_layout.word_of_slot]
        with torch.no_grad():
            self.weight.copy_(self.weight[permutation])
            if self.weight.grad is not None:
                self.weight.grad.copy_(self.weight.grad[permutation])
            for value in self._optimizer_state(self.weight, optimizer, rows=True):
                value.copy_(value[permutation])
        self.assignment.copy_(new)
        new_layout.version = self.assignment._version
        self._layout = new_layout
        self._grad.invalidate()
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
        return self._normalise_clusters(F.linear(hidden_c, self.cluster_weight))

    def _normalise_clusters(self, logits: Tensor) -> Tensor:
        logits = upcast(logits)
        empty = self._layout.empty_clusters
        if empty is not None:
            logits = logits.masked_fill(empty, float("-inf"))
        return F.log_softmax(logits, dim=1)

    def _split_hidden(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """``(h_c, h_w)``: the inputs of the cluster softmax and of the word softmax."""
        if self.word_projection is not None:
            return hidden, self.word_projection(hidden)  # [B, d], [B, word_dim]
        if self.projection is None:
            return hidden, hidden
        projected = F.relu(self.projection(hidden))  # [B, 2d]
        return projected[:, : self.in_features], projected[:, self.in_features :]

    def _parts(self, hidden: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(cluster log-probs [B, C], log P(C(t)|h) [B], log P(t|h, C(t)) [B])`` of checked inputs."""
        hidden_c, hidden_w = self._split_hidden(hidden)
        # -- sync-free path (sohsm.heads.grouped): chosen by `sync_free` -----------------------------
        backend = grouped.choose_backend(self, hidden_w)
        if backend is not None:
            return grouped.score(self, F.linear(hidden_c, self.cluster_weight), hidden_w, target, backend)
        # -- end of the sync-free path ----------------------------------------------------------------
        return self._score(F.linear(hidden_c, self.cluster_weight), hidden_w, target)

    # -- sync-free path (sohsm.heads.grouped) ------------------------------------------------------
    #: The in-cluster kernel: ``None`` (default) the per-cluster kernel (the sync-free path's Triton
    #: kernels are not the default until they are measured on a GPU); ``True`` the sync-free path on any
    #: device (Triton on CUDA when installed, else torch);
    #: ``"torch"`` / ``"triton"`` that backend of it; ``False`` always the per-cluster kernel.
    #: See :mod:`sohsm.heads.grouped`.
    sync_free: bool | str | None = None

    def _sync_free_width(self) -> int:
        """Static width of the sync-free path's logits: the largest cluster (fixed clusters)."""
        return self._layout_cache.max_size

    def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Hook for subclasses on the sync-free path: like :meth:`_observe`, but reads nothing back."""
    # -- end of the sync-free path ----------------------------------------------------------------

    @torch.compiler.disable
    def _score(self, cluster_logits: Tensor, hidden_w: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The data-dependent rest of :meth:`_parts`, which ``torch.compile`` runs eagerly.

        Its per-cluster loop, and the layout it reads, depend on which clusters a
        batch holds: traced, they would break the graph several times and
        recompile for every new set of clusters.
        """
        if torch.is_grad_enabled() and self.weight.requires_grad:
            self._check_weight_is_whole()
        cluster_log_probs = self._normalise_clusters(cluster_logits)  # [B, C]
        target_cluster = self.assignment[target]
        cluster_part = cluster_log_probs.gather(1, target_cluster[:, None]).squeeze(1)
        # the in-cluster kernel scores in the weight's dtype (it is bound by reading the weight, not
        # by arithmetic, so half-precision products would not pay for a converted copy of it)
        word_part = _InClusterLogProb.apply(
            hidden_w.to(self.weight.dtype), self.weight, target_cluster, self._layout.position_of_word[target], self
        )
        if self.training:
            self._observe(target, cluster_log_probs.detach())
        return cluster_log_probs, cluster_part, word_part

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

    def _accumulate_weight_grad(self, grad_logits: Tensor, hidden_sorted: Tensor, groups: _Groups) -> None:
        """Write (or add) the blocks of ``dL/dU^V`` of the present clusters into ``weight.grad``."""
        layout, weight = self._layout, self.weight
        grad = weight.grad
        fresh = grad is None
        # a word alone in its cluster gets no gradient (its in-cluster softmax is constant): skip its block
        clusters = [c for c in groups.clusters if layout.sizes[c] > 1]
        if fresh:
            grad = self._grad.fresh(weight, keep=frozenset(self._regions(clusters)))
        elif grad.is_sparse or grad.shape != weight.shape:
            raise RuntimeError("TwoLevelSoftmax.weight.grad must be a dense tensor shaped like the weight")
        beta = 0.0 if fresh else 1.0  # a fresh buffer's present blocks are overwritten, not added to
        sizes, row_counts = layout.sizes, groups.row_counts
        known = grad is self._grad.tensor and self._grad.known()
        grad_blocks = grad.split(sizes)
        for c, g_c, h_c in zip(groups.clusters, grad_logits.split(row_counts), hidden_sorted.split(row_counts)):
            if sizes[c] > 1:
                grad_blocks[c].addmm_(g_c[:, : sizes[c]].t(), h_c, beta=beta)
        if fresh:
            weight.grad = grad
        if grad is self._grad.tensor:
            self._grad.written(self._regions(clusters), known)

    def _regions(self, clusters: list[int]) -> list[tuple[int, int]]:
        """The ``(start, stop)`` row ranges of ``clusters``' blocks in :attr:`weight`."""
        offsets = self._layout.offsets
        return [(offsets[c], offsets[c + 1]) for c in clusters]

    # -- evaluation ---------------------------------------------------------------
    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities (word-id order): every word of every cluster is scored."""
        hidden = self._flatten_hidden(hidden)
        hidden_c, hidden_w = self._split_hidden(hidden)
        cluster_log_probs = self._cluster_log_probs(hidden_c)  # [B, C]
        logits = upcast(F.linear(hidden_w, self.weight))  # [B, N], slot order
        layout = self._layout
        index = layout.cluster_of_slot.expand_as(logits)
        shape = (logits.size(0), self.n_clusters)
        with torch.no_grad():  # a per-cluster maximum only stabilises the log-sum-exp
            peak = logits.new_full(shape, float("-inf")).scatter_reduce(1, index, logits, "amax")
            peak = peak.nan_to_num(neginf=0.0)
        peak_slot = peak.gather(1, index)
        sums = logits.new_zeros(shape).scatter_add(1, index, (logits - peak_slot).exp())
        normaliser = (sums.log() + peak).gather(1, index)
        log_probs_slot = logits - normaliser + cluster_log_probs.gather(1, index)
        return log_probs_slot[:, layout.slot_of_word]

    @torch.no_grad()
    def search_topk(self, hidden: Tensor, k: int, chunk_pairs: int = 8192) -> TopKResult:
        """Exact top-k by best-first search over clusters.

        ``P(c | h)`` bounds the probability of every word of ``c``. Every row first
        scores the words of its most probable cluster; a cluster can then only
        hold a better word if its ``log P(c | h)`` exceeds the row's k-th best
        score so far, so each unfinished row scores exactly those clusters, all
        in one grouped pass (``chunk_pairs`` (row, cluster) pairs at a time).
        A well-trained head visits a few clusters per row; an untrained one,
        whose cluster distribution is flat, may visit all of them.
        """
        k = self._check_k(k)
        hidden = self._flatten_hidden(hidden)
        batch, device = hidden.size(0), hidden.device
        if batch == 0:  # as log_prob(hidden).topk(k) does: empty results
            return TopKResult(hidden.new_empty(0, k), torch.empty(0, k, dtype=torch.long, device=device),
                              torch.empty(0, dtype=torch.long, device=device))
        hidden_c, hidden_w = self._split_hidden(hidden)
        hidden_w = hidden_w.to(self.weight.dtype)  # the kernel scores in the weight's dtype
        cluster_log_probs = self._cluster_log_probs(hidden_c)  # [B, C]
        best_values = cluster_log_probs.new_full((batch, k), float("-inf"))
        best_words = torch.zeros(batch, k, dtype=torch.long, device=device)
        rows = torch.arange(batch, device=device)
        first = cluster_log_probs.argmax(dim=1)  # [B]
        self._merge_cluster_scores(hidden_w, cluster_log_probs, rows, first, best_values, best_words)
        # clusters that may still hold a word better than the row's k-th best (the first one is done)
        open_clusters = cluster_log_probs > best_values[:, -1:]
        open_clusters[rows, first] = False
        visited = 1 + open_clusters.sum(dim=1)
        pair_rows, pair_clusters = open_clusters.nonzero(as_tuple=True)  # row-major: grouped by row
        for lo in range(0, pair_rows.numel(), chunk_pairs):
            self._merge_cluster_scores(
                hidden_w, cluster_log_probs, pair_rows[lo : lo + chunk_pairs],
                pair_clusters[lo : lo + chunk_pairs], best_values, best_words,
            )
        return TopKResult(best_values, best_words, visited)

    def _merge_cluster_scores(
        self, hidden_w: Tensor, cluster_log_probs: Tensor, rows: Tensor, clusters: Tensor,
        best_values: Tensor, best_words: Tensor,
    ) -> None:
        """Score the words of ``clusters[j]`` for row ``rows[j]`` (pairs sorted by row) and fold
        each row's best into ``best_values`` / ``best_words`` (in place)."""
        k, layout = best_values.size(1), self._layout
        groups = _group_rows(clusters, self.n_clusters)
        pair_order = groups.order  # pairs sorted by cluster
        sorted_rows = rows[pair_order]
        log_probs = F.log_softmax(_in_cluster_logits(hidden_w[sorted_rows], self.weight, layout, groups), dim=1)
        log_probs += cluster_log_probs[sorted_rows, groups.row_cluster][:, None]
        top = min(k, log_probs.size(1))
        values, positions = log_probs.topk(top, dim=1)  # [P, top]
        slots = (layout.offsets_t[groups.row_cluster][:, None] + positions).clamp_(max=self.n_classes - 1)
        words = layout.word_of_slot[slots]
        # lay each row's candidates side by side: [rows, pairs per row * top], then keep the best k
        unique_rows, per_row = torch.unique_consecutive(rows, return_counts=True)
        width = int(per_row.max()) * top
        rank_in_row = torch.arange(rows.numel(), device=rows.device) - (per_row.cumsum(0) - per_row).repeat_interleave(per_row)
        rank_sorted = rank_in_row[pair_order]
        local_row = torch.searchsorted(unique_rows, sorted_rows)
        column = rank_sorted[:, None] * top + torch.arange(top, device=rows.device)
        cand_values = values.new_full((unique_rows.numel(), width), float("-inf"))
        cand_words = torch.zeros(unique_rows.numel(), width, dtype=torch.long, device=rows.device)
        cand_values[local_row[:, None], column] = values
        cand_words[local_row[:, None], column] = words
        merged_values = torch.cat([best_values[unique_rows], cand_values], dim=1)
        merged_words = torch.cat([best_words[unique_rows], cand_words], dim=1)
        # best k by score, equal scores by word id: the answer does not depend on cluster numbering
        by_word = merged_words.argsort(dim=1, stable=True)
        merged_values, merged_words = merged_values.gather(1, by_word), merged_words.gather(1, by_word)
        pick = merged_values.argsort(dim=1, descending=True, stable=True)[:, :k]
        best_values[unique_rows] = merged_values.gather(1, pick)
        best_words[unique_rows] = merged_words.gather(1, pick)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``, by best-first search over clusters (:meth:`search_topk`)."""
        result = self.search_topk(hidden, k)
        return result.values, result.indices

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, n_classes={self.n_classes}, n_clusters={self.n_clusters}, "
            f"max_cluster_size={self._layout.max_size}, projection={self.projection is not None}"
            + (f", word_dim={self.word_dim}" if self.word_projection is not None else "")
        )


def _rebuild_layout_after_load(module: TwoLevelSoftmax, incompatible_keys) -> None:
    """A loaded ``assignment`` brings its own row layout of ``weight``: derive the layout again."""
    module._layout = _Layout(module.assignment, module.n_clusters)
    module._grad.invalidate()


@register_head("two_level_random", builds=TwoLevelSoftmax, fixed=("assignment",))
def _two_level_random(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="random", **options)


@register_head("two_level_frequency", builds=TwoLevelSoftmax, fixed=("assignment",))
def _two_level_frequency(in_features: int, n_classes: int, counts=None, **options) -> TwoLevelSoftmax:
    return TwoLevelSoftmax(in_features, n_classes, assignment="frequency", counts=counts, **options)
