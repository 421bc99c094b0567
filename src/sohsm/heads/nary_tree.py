"""Hierarchical softmax over a tree of any arity and depth: one softmax per internal node.

    log P(w | h) = sum over the edges e = (n -> c) on w's path of log softmax_{c' in children(n)}(u_c' . h + b_c')[c]

Every non-root node ``c`` owns one output vector ``u_c`` (and bias ``b_c``), the
vectors of a node's children are contiguous rows of :attr:`TreeSoftmax.weight`
(the edge layout of :mod:`sohsm.clustering.hierarchy`). The binary-tree heads
(``u = [v_n, 0]`` for each node's two children) and the two-level heads (root:
the cluster vectors, below it the word vectors) are special cases.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.clustering.hierarchy import (
    HierarchyTables,
    balanced_hierarchy,
    branching_for_depth,
    check_hierarchy,
    hierarchy_tables,
    tables_to_hierarchy,
)
from sohsm.heads.base import HeadOutput, HierarchicalHead, init_word_vectors, upcast
from sohsm.heads.binary_tree import TreeTopK, best_first_topk
from sohsm.heads.registry import register_head
from sohsm.heads.reused_gradient import ReusedGradient, WritesWeightGradient, gradient_route

#: a depth whose edges number at most this many times its widest node's children is scored whole, with
#: one matrix product, instead of gathering each row's children (a gathered row costs far more than a product)
_DENSE_FACTOR = 128


#: the result of :meth:`TreeSoftmax.search_topk` (the same fields as the binary heads' search)
NodeTopK = TreeTopK


class _Layout:
    """Derived, non-persistent tables of a hierarchy (on the tables' device)."""

    def __init__(self, offsets: Tensor, child: Tensor) -> None:
        device = child.device
        n_internal, n_edges = offsets.numel() - 1, child.numel()
        self.n_internal = n_internal
        self.offsets, self.child = offsets, child
        self.arity = offsets[1:] - offsets[:-1]  # [I]
        #: [E] internal node each edge leaves
        self.edge_parent = torch.repeat_interleave(torch.arange(n_internal, device=device), self.arity)
        is_internal = child < n_internal
        #: [I] edge into each internal node (the root's entry is unused), [N] edge into each word's leaf
        self.edge_of_node = torch.zeros(n_internal, dtype=torch.long, device=device)
        self.edge_of_node[child[is_internal]] = torch.arange(n_edges, device=device)[is_internal]
        self.edge_of_word = torch.empty(n_edges - n_internal + 1, dtype=torch.long, device=device)
        self.edge_of_word[child[~is_internal] - n_internal] = torch.arange(n_edges, device=device)[~is_internal]
        # depth of every internal node; breadth-first ids: parents come first, each depth is a contiguous range
        parent_of_node = self.edge_parent[self.edge_of_node]
        node_depth_list = [0] * n_internal
        for i, p in enumerate(parent_of_node.tolist()[1:], 1):  # host walk over the internal nodes, once
            node_depth_list[i] = node_depth_list[p] + 1
        node_depth = torch.tensor(node_depth_list, dtype=torch.long, device=device)
        self.parent_of_node = parent_of_node
        counts = torch.bincount(node_depth).tolist()
        self.level_starts = [0]
        for c in counts:
            self.level_starts.append(self.level_starts[-1] + c)
        #: edges leaving the nodes of depth t: level_edges[t] .. level_edges[t + 1] - 1
        self.level_edges = offsets[torch.tensor(self.level_starts)].tolist()
        # every word's path as edges, root first, padded with the path's last edge
        word_depth = node_depth[self.edge_parent[self.edge_of_word]] + 1  # [N] edges on the path
        self.lengths = word_depth
        self.max_length = int(word_depth.max())
        paths = self.edge_of_word[:, None].repeat(1, self.max_length)  # padding: the leaf's edge
        edge = self.edge_of_word.clone()
        for step in reversed(range(self.max_length)):  # walk up from every leaf at once
            here = word_depth > step
            paths[:, step] = torch.where(here, edge, paths[:, step])
            edge = torch.where(here, self.edge_of_node[self.edge_parent[edge]], edge)
        self.path_edges = paths  # [N, D]


class _GatherRows(torch.autograd.Function):
    """``weight[index]`` for several index tensors at once; the backward writes the weight's gradient itself.

    The gradient of every piece is added into ``weight.grad``, which is the head's
    :class:`~sohsm.heads.reused_gradient.ReusedGradient` when it starts empty: at
    N = 300k a fresh weight-sized gradient each step (allocated, zeroed, then
    mostly untouched) costs more than the arithmetic, while zeroing the rows the
    previous step wrote costs a small share of it.
    """

    @staticmethod
    def forward(ctx, weight: Tensor, head: TreeSoftmax, *indices: Tensor) -> tuple[Tensor, ...]:
        ctx.save_for_backward(*indices)
        ctx.head, ctx.weight = head, weight
        return tuple(weight.index_select(0, index) for index in indices)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        indices = ctx.saved_tensors
        route = gradient_route(ctx, 0)  # backward(): into .grad; autograd.grad: returned, no .grad written
        grad_weight = None
        if route == "sink":
            ctx.head._accumulate_weight_grad(ctx.weight, indices, grads)
        elif route == "return":
            grad_weight = torch.zeros_like(ctx.weight)
            for index, g in zip(indices, grads):
                if g is not None:
                    grad_weight.index_add_(0, index, g.to(grad_weight.dtype))
        return (grad_weight, None, *([None] * len(indices)))


class TreeSoftmax(WritesWeightGradient, HierarchicalHead):
    """Hierarchical softmax over a tree given as nested lists of word ids (any arity, any depth).

    Each internal node has its own softmax over its children; a word's
    probability is the product of the branch probabilities along its path, and
    the probabilities of all leaves sum to one. A training step scores, for each
    target, only the children of the nodes on its path: with a balanced tree of
    branching ``b`` that is ``b * log_b(N)`` scores instead of ``N`` (depth 3 and
    ``b = N^(1/3)``: 3 * 67 scores for N = 300k). The tree may come from a
    taxonomy, Brown clusters, a class file or a trained run
    (:mod:`sohsm.clustering.hierarchy_files`).

    Papers: Morin and Bengio (2005), "Hierarchical probabilistic neural network
    language model"; Goodman (2001), "Classes for fast maximum entropy training".

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        tree: nested lists of word ids covering every word once, e.g.
            ``[[0, 1, 2], [3, [4, 5]], 6]``; or ``"balanced"``: a random balanced
            tree (words at random leaves, drawn with ``seed``) of at most
            ``depth`` levels, or of branching ``branching`` if given.
            Default: ``"balanced"``.
        depth: levels of the balanced tree; its branching is ``ceil(N^(1/depth))``. Default: 2.
        branching: children per node of the balanced tree (overrides ``depth``).
        bias: a learned bias per child in every softmax. Default: ``False``.
        seed: seed of the balanced tree's word order.
        sparse: give :attr:`weight` a row-sparse gradient (``SGD``, ``Adagrad``, ``SparseAdam``);
            the bias's stays dense.

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput` with ``output`` ``[B]`` and scalar ``loss``

    Example::

        >>> head = TreeSoftmax(16, 7, tree=[[0, 1, 2], [3, [4, 5]], 6])
        >>> head.path_lengths().tolist()
        [2, 2, 2, 2, 3, 3, 1]
        >>> output, loss = head(torch.randn(4, 16), torch.tensor([0, 4, 5, 6]))
        >>> torch.allclose(head.log_prob(torch.randn(2, 16)).exp().sum(1), torch.ones(2))
        True
        >>> head.topk(torch.randn(2, 16), k=3)[1].shape  # exact, by best-first search
        torch.Size([2, 3])

    .. note::
        The forward pass works one depth at a time. A depth with few edges in all
        is scored with one matrix product; at the others each row gathers its
        node's children, padded to the widest node the batch reaches there, so one
        very wide node (a cluster of 10k words) makes every row of a batch that
        reaches it pay for 10k scores. Split wide nodes
        (:func:`sohsm.clustering.hierarchy.group_balanced`).

        Without ``sparse``, the gradient of :attr:`weight` is added directly into
        ``weight.grad`` (a buffer reused across steps, of which only the rows written
        by the previous step are zeroed), as in :class:`~sohsm.heads.TwoLevelSoftmax`:
        a tensor hook on ``weight`` is called with ``None``; ``torch.autograd.grad`` returns
        it and writes no ``.grad``; post-accumulate-grad hooks, optimizers, ``zero_grad``,
        clipping, gradient accumulation and DistributedDataParallel work as usual.
    """

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        *,
        tree: list | str = "balanced",
        depth: int = 2,
        branching: int | None = None,
        bias: bool = False,
        seed: int = 0,
        sparse: bool = False,
    ) -> None:
        super().__init__(in_features, n_classes)
        if isinstance(tree, str):
            if tree != "balanced":
                raise ValueError(f"tree must be nested lists of word ids or 'balanced', got {tree!r}")
            if branching is None:
                if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                    raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
                branching = branching_for_depth(n_classes, depth)
            tree = balanced_hierarchy(n_classes, branching, torch.Generator().manual_seed(seed))
        tables = hierarchy_tables(check_hierarchy(tree, n_classes), n_classes)
        self.sparse = bool(sparse)
        n_edges = tables.child.numel()
        #: one output vector per non-root node; rows offsets[i] .. offsets[i + 1] - 1 are node i's children
        self.weight = nn.Parameter(torch.empty(n_edges, in_features))
        self.bias = nn.Parameter(torch.zeros(n_edges)) if bias else None
        self.register_buffer("offsets", tables.offsets)
        self.register_buffer("child", tables.child)
        self._layout = _Layout(self.offsets, self.child)
        self._grad = ReusedGradient()
        self.reset_parameters()

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        return "it has no word vectors an input embedding can share (its vectors are the tree's inner nodes')"

    def reset_parameters(self) -> None:
        init_word_vectors(self.weight, self.bias)

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(): keep the tables on the same device
        result = super()._apply(fn, recurse)
        self._layout = _Layout(self.offsets, self.child)
        self._grad = ReusedGradient()
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint brings its own tree: take its tables (and the weight's shape) before loading."""
        offsets, child = state_dict.get(prefix + "offsets"), state_dict.get(prefix + "child")
        if isinstance(offsets, Tensor) and isinstance(child, Tensor) and (
                offsets.shape != self.offsets.shape or child.shape != self.child.shape
                or not torch.equal(offsets.cpu(), self.offsets.cpu())
                or not torch.equal(child.cpu(), self.child.cpu())):
            device = self.weight.device
            tree = tables_to_hierarchy(HierarchyTables(offsets.cpu().long(), child.cpu().long()))
            tables = hierarchy_tables(check_hierarchy(tree, self.n_classes), self.n_classes)
            self.offsets, self.child = tables.offsets.to(device), tables.child.to(device)
            n_edges = tables.child.numel()
            self.weight = nn.Parameter(self.weight.new_empty(n_edges, self.in_features))
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.new_zeros(n_edges))
            self._layout = _Layout(self.offsets, self.child)
            self._grad = ReusedGradient()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- structure ------------------------------------------------------------------
    def hierarchy(self) -> list:
        """The tree as nested lists of word ids (breadth-first order of the internal nodes kept)."""
        return tables_to_hierarchy(HierarchyTables(self.offsets.cpu(), self.child.cpu()))

    @property
    def n_internal(self) -> int:
        """Number of internal nodes (softmaxes), the root included."""
        return self._layout.n_internal

    def path_lengths(self) -> Tensor:
        """``[N]`` number of softmaxes on each word's path (its depth)."""
        return self._layout.lengths.clone()

    # -- training ---------------------------------------------------------------------
    def _scores(self, slots: Tensor, hidden: Tensor) -> Tensor:
        """``[R, S]`` scores ``u_slot . h + b_slot`` of ``slots [R, S]`` for rows ``hidden [R, d]``."""
        vectors = F.embedding(slots, self.weight, sparse=self.sparse)  # [R, S, d]
        scores = torch.bmm(vectors, hidden.unsqueeze(2)).squeeze(2)  # [R, S]
        if self.bias is not None:
            scores = scores + self.bias[slots]  # the bias's gradient stays dense
        return upcast(scores)

    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        layout = self._layout
        output = hidden.new_zeros(hidden.size(0), dtype=upcast(hidden[:0]).dtype)
        if target.numel() == 0:
            return HeadOutput(output, -output.mean())
        lengths = layout.lengths[target]  # [B]
        edges = layout.path_edges[target]  # [B, D]
        # plan every depth, then read all the weight rows the batch needs in one gather, so the
        # weight gets one gradient (a weight-sized buffer per depth would cost more than the arithmetic)
        plans, pieces = [], []
        for step in range(int(lengths.max())):  # one depth at a time: the work grows with the depth
            rows = (lengths > step).nonzero().squeeze(1) if step else None
            edge = edges[:, step] if rows is None else edges[rows, step]  # [R]
            node = layout.edge_parent[edge]
            start, arity = layout.offsets[node], layout.arity[node]
            width = int(arity.max())
            span = torch.arange(width, device=hidden.device)
            valid = span < arity[:, None]  # [R, A]
            slots = torch.where(valid, start[:, None] + span, start[:, None])  # [R, A]
            lo, hi = layout.level_edges[step], layout.level_edges[step + 1]
            dense = hi - lo <= _DENSE_FACTOR * width  # few edges at this depth: score them all with one product
            pieces.append(torch.arange(lo, hi, device=hidden.device) if dense else slots.reshape(-1))
            plans.append((rows, edge - start, valid, slots, lo if dense else None))
        if self.sparse:
            vectors = F.embedding(torch.cat(pieces), self.weight, sparse=True).split([p.numel() for p in pieces])
        elif not isinstance(self.weight, nn.Parameter):  # a tensor swapped in (functional_call): autograd's gradient
            vectors = self.weight.index_select(0, torch.cat(pieces)).split([p.numel() for p in pieces])
        else:
            if torch.is_grad_enabled() and self.weight.requires_grad:
                self._check_weight_is_whole()
            vectors = _GatherRows.apply(self.weight, self, *pieces)
        for (rows, position, valid, slots, lo), rows_vectors in zip(plans, vectors):
            h = hidden if rows is None else hidden[rows]
            if lo is not None:  # [R, E_t] scores of the whole depth, then each row's node's children
                scores = (h @ rows_vectors.t()).gather(1, slots - lo)
            else:
                scores = torch.bmm(rows_vectors.view(*slots.shape, -1), h.unsqueeze(2)).squeeze(2)  # [R, A]
            if self.bias is not None:
                scores = scores + self.bias[slots]  # the bias's gradient stays dense
            scores = upcast(scores).masked_fill(~valid, float("-inf"))
            picked = F.log_softmax(scores, dim=1).gather(1, position[:, None]).squeeze(1)
            output = output + picked if rows is None else output.index_add(0, rows, picked)
        return HeadOutput(output, -output.mean())

    def _accumulate_weight_grad(self, weight: Tensor, indices: tuple[Tensor, ...],
                                grads: tuple[Tensor | None, ...]) -> None:
        """Add the gradient ``grads[i]`` of the rows ``weight[indices[i]]`` into ``weight.grad``."""
        buffer = self._grad
        grad = weight.grad
        if grad is None:
            grad = buffer.fresh(weight)
        elif grad.is_sparse or grad.shape != weight.shape:
            raise RuntimeError("TreeSoftmax.weight.grad must be a dense tensor shaped like the weight")
        known = grad is buffer.tensor and buffer.known()
        written = []
        for index, g in zip(indices, grads):
            if g is not None:
                grad.index_add_(0, index, g.to(grad.dtype))
                written.append(index)
        if weight.grad is None:
            weight.grad = grad
        if grad is buffer.tensor:
            buffer.written(written, known)

    # -- evaluation -------------------------------------------------------------------
    def _edge_log_probs(self, hidden: Tensor) -> Tensor:
        """``[B, E]`` log-probability of every edge given its parent (a log-softmax per internal node)."""
        layout = self._layout
        scores = upcast(F.linear(hidden, self.weight, self.bias))  # [B, E]
        index = layout.edge_parent.expand_as(scores)
        shape = (scores.size(0), layout.n_internal)
        with torch.no_grad():  # a per-node maximum only stabilises the log-sum-exp
            peak = scores.new_full(shape, float("-inf")).scatter_reduce(1, index, scores, "amax")
        peak_edge = peak.gather(1, index)
        sums = scores.new_zeros(shape).scatter_add(1, index, (scores - peak_edge).exp())
        return scores - peak_edge - sums.log().gather(1, index)

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities: every edge is scored once, the tree is walked depth by depth."""
        hidden = self._flatten_hidden(hidden)
        layout = self._layout
        edge_lp = self._edge_log_probs(hidden)
        starts = layout.level_starts
        levels = [edge_lp.new_zeros(hidden.size(0), 1)]  # the root
        for lo, hi in zip(starts[1:-1], starts[2:]):  # each depth from its parents in the depth above
            parent = layout.parent_of_node[lo:hi]
            above = starts[len(levels) - 1]
            levels.append(levels[-1][:, parent - above] + edge_lp[:, layout.edge_of_node[lo:hi]])
        node_lp = torch.cat(levels, dim=1)  # [B, I]
        return node_lp[:, layout.edge_parent[layout.edge_of_word]] + edge_lp[:, layout.edge_of_word]

    @torch.no_grad()
    def search_topk(self, hidden: Tensor, k: int, max_pops: int = 1024) -> NodeTopK:
        """Exact top-k by best-first search over the tree's internal nodes.

        A node's path log-probability bounds every leaf below it, so nodes are
        expanded best first and a row stops when no node left can beat its k-th
        best word. All rows advance together: each round a row expands its best
        frontier node (after ``2 * depth`` rounds its best ``2, 4, ...`` up to
        ``max_pops``), scoring the children of the expanded nodes only.
        """
        k = self._check_k(k)
        hidden = self._flatten_hidden(hidden)
        layout = self._layout
        neg_inf = float("-inf")

        def expand(rows: Tensor, node: Tensor, node_lp: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
            start, arity = layout.offsets[node], layout.arity[node]  # [R, take]
            width = int(arity.max())
            span = torch.arange(width, device=hidden.device)
            valid = (span < arity[..., None]) & live[..., None]  # [R, take, A]
            slots = torch.where(valid, start[..., None] + span, start[..., None])
            scores = self._scores(slots.flatten(1), hidden[rows]).view(valid.shape)
            child_lp = F.log_softmax(scores.masked_fill(~valid, neg_inf), dim=2) + node_lp[..., None]
            child_lp = child_lp.masked_fill(~valid, neg_inf).flatten(1)  # [R, take * A]
            return child_lp, layout.child[slots].flatten(1)

        return best_first_topk(expand, hidden.size(0), k, layout.n_internal, layout.max_length,
                               upcast(hidden[:0]).dtype, hidden.device, max_pops)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``, by best-first search over the tree (:meth:`search_topk`)."""
        result = self.search_topk(hidden, k)
        return result.values, result.indices

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, n_classes={self.n_classes}, internal_nodes={self.n_internal}, "
                f"max_depth={self._layout.max_length}, bias={self.bias is not None}, sparse={self.sparse}")


@register_head("tree", builds=TreeSoftmax, presets={"word2vec": {"sparse": True}})
def _tree(in_features: int, n_classes: int, counts=None, **options) -> TreeSoftmax:
    """Any tree given as nested lists of word ids (``tree=``), or a random balanced one of ``depth`` levels."""
    return TreeSoftmax(in_features, n_classes, **options)
