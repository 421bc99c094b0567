"""Binary-tree hierarchical softmax: a word's probability is a product of binary decisions.

    log P(w | h) = sum over the internal nodes n on w's path of log sigma(s_n * v_n . h)

with ``s_n = +1`` where the path goes to child 0 and ``-1`` where it goes to child 1.
Trees come from :mod:`sohsm.clustering` (Huffman, random balanced, bootstrapped from a
trained model's context vectors) or are given; ``tree_file`` reads one from a tree file.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.clustering.hierarchy import children_to_hierarchy
from sohsm.clustering.trees import check_tree, huffman_tree, load_tree, random_tree, tree_paths
from sohsm.heads.base import HeadOutput, HierarchicalHead, init_word_vectors, upcast
from sohsm.heads.registry import register_head


class TreeTopK(NamedTuple):
    """Exact top-k words of a tree head.

    Attributes:
        values: ``[B, k]`` log-probabilities, best first.
        indices: ``[B, k]`` word ids.
        nodes_visited: ``[B]`` internal nodes whose children were scored for each row.
    """

    values: Tensor
    indices: Tensor
    nodes_visited: Tensor


class _TreeLayout:
    """Derived, non-persistent tables of a ``children`` table (on its device)."""

    def __init__(self, children: Tensor) -> None:
        n_internal = children.size(0)
        paths = tree_paths(children)
        depth = paths.nodes.size(1)
        positions = torch.arange(depth, device=children.device)
        on_path = positions < paths.lengths[:, None]
        #: [N, D] internal nodes of each word's path, and +1 / -1 per branch (0 past the path's end)
        self.path_nodes = paths.nodes
        self.path_signs = torch.where(on_path, 1 - 2 * paths.codes, 0).to(torch.int8)
        self.lengths = paths.lengths
        self.max_length = depth
        # parent and branch of every node (ids as in the children table)
        ids = children.reshape(-1)
        self.parent = torch.zeros(2 * n_internal + 1, dtype=torch.long, device=children.device)
        self.parent[ids] = torch.arange(n_internal, device=children.device).repeat_interleave(2)
        self.code = torch.zeros_like(self.parent)
        self.code[children[:, 1]] = 1
        # breadth-first numbering: each depth's internal nodes are a contiguous range
        starts, level = [0, 1], torch.zeros(1, dtype=torch.long, device=children.device)  # the root alone
        while level.numel():
            below = children[level].reshape(-1)
            level = below[below < n_internal]
            starts.append(starts[-1] + level.numel())
        self.level_starts = starts  # level l holds internal nodes starts[l] .. starts[l + 1] - 1
        self.children = children


class BinaryTreeSoftmax(HierarchicalHead):
    """Hierarchical softmax over a binary tree whose leaves are the words.

    Every internal node ``n`` holds a vector ``v_n``; the walk from the root
    to a word goes to child 0 with probability ``sigma(v_n . h)`` and to child 1
    with ``sigma(-v_n . h)``, so ``P(w | h)`` is the product along the word's
    path and the probabilities of all leaves sum to one. A training step scores
    only the ``O(log N)`` nodes on each target's path.

    Papers: Morin and Bengio (2005), "Hierarchical probabilistic neural network
    language model"; Mnih and Hinton (2009), "A scalable hierarchical distributed
    language model"; the Huffman tree of Mikolov et al. (2013),
    https://arxiv.org/abs/1310.4546.

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        tree: ``"huffman"`` (word2vec's Huffman tree on ``counts``: frequent
            words get short paths), ``"random"`` (balanced, words at random
            leaves drawn with ``seed``), or a ``[N - 1, 2]`` children table (see
            :mod:`sohsm.clustering.trees`). Default: ``"huffman"``.
        counts: ``[N]`` training counts; needed for ``"huffman"``.
        seed: seed of the random tree.
        sparse: give :attr:`weight` a row-sparse gradient (only the nodes on the
            batch's paths), as :class:`torch.nn.Embedding` does; it needs an
            optimizer that takes sparse gradients (``SGD``, ``Adagrad``,
            ``SparseAdam``). Default: ``False``.

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput` with ``output`` ``[B]`` and scalar ``loss``

    Example::

        >>> counts = torch.tensor([50, 20, 10, 10, 5, 3, 1, 1])
        >>> head = BinaryTreeSoftmax(16, 8, tree="huffman", counts=counts)
        >>> head.path_lengths().tolist()  # frequent words sit near the root
        [1, 2, 3, 4, 5, 6, 7, 7]
        >>> output, loss = head(torch.randn(4, 16), torch.tensor([0, 1, 6, 7]))
        >>> values, words, visited = head.search_topk(torch.randn(2, 16), k=3)
        >>> words.shape, visited.shape
        (torch.Size([2, 3]), torch.Size([2]))
    """

    tree: Tensor  # a buffer (register_buffer), declared for the checker

    @property
    def binary_pairs(self) -> str:
        """``"paths"``: one logistic decision per node on the target's path."""
        return "paths"

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        *,
        tree: Tensor | str = "huffman",
        counts: Tensor | None = None,
        seed: int = 0,
        sparse: bool = False,
    ) -> None:
        super().__init__(in_features, n_classes)
        if isinstance(tree, str):
            if tree == "huffman":
                if counts is None:
                    raise ValueError("tree='huffman' needs the word counts (counts=...)")
                counts = torch.as_tensor(counts).reshape(-1)
                if counts.numel() != n_classes:
                    raise ValueError(f"counts must have shape [{n_classes}] (one per word), got {tuple(counts.shape)}")
                children = huffman_tree(counts)
            elif tree == "random":
                children = random_tree(n_classes, torch.Generator().manual_seed(seed))
            else:
                raise ValueError(f"tree must be 'huffman', 'random' or a [N - 1, 2] children table, got {tree!r}")
        else:
            children = check_tree(tree, n_classes)
        self.sparse = bool(sparse)
        #: node vectors v_n, one row per internal node
        self.weight = nn.Parameter(torch.empty(n_classes - 1, in_features))
        #: the tree as a ``[N - 1, 2]`` children table (:mod:`sohsm.clustering.trees`)
        self.register_buffer("tree", children)
        self._layout = _TreeLayout(self.tree)
        self.register_load_state_dict_post_hook(_rebuild_layout_after_load)
        self.reset_parameters()

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        return "it has no word vectors an input embedding can share (its vectors are the tree's inner nodes')"

    def reset_parameters(self) -> None:
        init_word_vectors(self.weight)

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(): keep the tables on the same device
        result = super()._apply(fn, recurse)
        self._layout = _TreeLayout(self.tree)
        return result

    def hierarchy(self) -> list:
        """The tree as nested lists of word ids, child 0 first."""
        return children_to_hierarchy(self.tree.cpu())

    def path_lengths(self) -> Tensor:
        """``[N]`` number of internal nodes on each word's path (its code length)."""
        return self._layout.lengths.clone()

    def paths(self) -> tuple[Tensor, Tensor]:
        """``(nodes, signs)``, each ``[N, D]``: each word's internal nodes, root first, and the
        branch taken at each (``+1`` child 0, ``-1`` child 1, ``0`` past the path's end)."""
        layout = self._layout
        return layout.path_nodes.clone(), layout.path_signs.long()

    # -- training -----------------------------------------------------------------
    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        layout = self._layout
        depth = int(layout.lengths[target].max()) if target.numel() else 1  # the batch's longest path
        nodes = layout.path_nodes[target, :depth]  # [B, D]
        vectors = F.embedding(nodes, self.weight, sparse=self.sparse)  # [B, D, d]
        scores = upcast(torch.bmm(vectors, hidden.unsqueeze(2)).squeeze(2))  # [B, D]
        signs = layout.path_signs[target, :depth].to(scores.dtype)  # [B, D], 0 past a path's end
        output = (F.logsigmoid(scores * signs) * signs.abs()).sum(dim=1)  # [B]
        return HeadOutput(output, -output.mean())

    # -- evaluation ---------------------------------------------------------------
    def _node_log_probs(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """``(path [B, N - 1], branch [B, 2 (N - 1)])``: each internal node's path log-probability
        and the log-probability of each of its branches (``branch[:, 2 n + code]``)."""
        layout = self._layout
        scores = upcast(F.linear(hidden, self.weight))  # [B, N - 1]
        branch = torch.stack([F.logsigmoid(scores), F.logsigmoid(-scores)], dim=2).flatten(1)
        starts = layout.level_starts
        levels = [scores.new_zeros(hidden.size(0), 1)]  # the root
        for lo, hi in zip(starts[1:-1], starts[2:]):  # one level at a time, from its parents in the level above
            parent = layout.parent[lo:hi]
            above = starts[len(levels) - 1]
            levels.append(levels[-1][:, parent - above] + branch[:, 2 * parent + layout.code[lo:hi]])
        return torch.cat(levels, dim=1), branch

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities: every node is scored once, the tree is walked level by level."""
        hidden = self._flatten_hidden(hidden)
        layout = self._layout
        path, branch = self._node_log_probs(hidden)
        leaves = torch.arange(self.n_classes - 1, 2 * self.n_classes - 1, device=hidden.device)
        parent = layout.parent[leaves]
        return path[:, parent] + branch[:, 2 * parent + layout.code[leaves]]

    @torch.no_grad()
    def search_topk(self, hidden: Tensor, k: int, max_pops: int = 1024) -> TreeTopK:
        """Exact top-k by best-first search over the tree.

        A node's path log-probability bounds every leaf below it, so nodes are
        expanded in descending path log-probability and a row stops when no node
        left can beat its k-th best word. All rows advance together, one round
        at a time: each round a row expands its best frontier node, or, after
        ``2 * depth`` rounds (a flat distribution, as in an untrained head),
        its best ``2, 4, ...`` up to ``max_pops`` nodes that can still win.
        """
        k = self._check_k(k)
        hidden = self._flatten_hidden(hidden)
        layout = self._layout
        neg_inf = float("-inf")

        def expand(rows: Tensor, node: Tensor, node_lp: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
            scores = torch.bmm(self.weight[node], hidden[rows].unsqueeze(2)).squeeze(2)  # [R, take]
            child_lp = torch.stack([node_lp + F.logsigmoid(scores), node_lp + F.logsigmoid(-scores)], dim=2)
            child_lp = child_lp.masked_fill(~live[:, :, None], neg_inf).flatten(1)  # [R, 2 take]
            return child_lp, layout.children[node].flatten(1)

        return best_first_topk(expand, hidden.size(0), k, self.n_classes - 1, layout.max_length, hidden.dtype,
                               hidden.device, max_pops)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``, by best-first search over the tree (:meth:`search_topk`)."""
        result = self.search_topk(hidden, k)
        return result.values, result.indices

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, n_classes={self.n_classes}, "
                f"max_path_length={self._layout.max_length}, sparse={self.sparse}")


def best_first_topk(expand, batch: int, k: int, n_internal: int, max_depth: int, dtype: torch.dtype,
                    device: torch.device, max_pops: int = 1024) -> TreeTopK:
    """Exact top-k leaves of a tree by best-first search, for every row at once (binary and n-ary heads).

    A node's path log-probability bounds every leaf below it, so nodes are expanded in
    descending path log-probability and a row stops when no node left can beat its k-th
    best word. Each round a row expands its best frontier node, or, after ``2 * max_depth``
    rounds (a flat distribution, as in an untrained head), its best ``2, 4, ...`` up to
    ``max_pops`` nodes that can still win. Node ids below ``n_internal`` are internal nodes
    (the root is 0); a leaf is ``n_internal + word``.

    Args:
        expand: ``expand(rows, node, node_lp, live) -> (child_lp, child)``: for the selected
            ``node [R, take]`` of ``rows [R]`` with path log-probabilities ``node_lp``, the
            path log-probabilities ``[R, take * A]`` of their children (``-inf`` where
            ``live`` is false or a child does not exist) and the children's node ids.
    """
    neg_inf = float("-inf")
    best_values = torch.full((batch, k), neg_inf, dtype=dtype, device=device)
    best_words = torch.zeros(batch, k, dtype=torch.long, device=device)
    front_lp = torch.zeros(batch, 1, dtype=dtype, device=device)  # frontier: internal nodes (-inf = empty)
    front_node = torch.zeros(batch, 1, dtype=torch.long, device=device)
    visited = torch.zeros(batch, dtype=torch.long, device=device)
    pops, rounds = 1, 0
    while batch:
        threshold = best_values[:, -1]
        rows = (front_lp.max(dim=1).values > threshold).nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        rounds += 1
        if rounds > 2 * max_depth:
            pops = min(2 * pops, max_pops)
        f_lp, f_node, bound = front_lp[rows], front_node[rows], threshold[rows, None]
        take = min(pops, f_lp.size(1))
        sel_lp, sel_pos = f_lp.topk(take, dim=1)  # [R, take]
        sel_node = f_node.gather(1, sel_pos)
        f_lp = f_lp.scatter(1, sel_pos, neg_inf)  # popped; those that cannot win are dropped
        live = sel_lp > bound  # [R, take]
        visited[rows] += live.sum(dim=1)
        child_lp, child = expand(rows, sel_node, sel_lp, live)
        is_leaf = child >= n_internal
        values, words = _merge_topk(best_values[rows], best_words[rows],
                                    child_lp.masked_fill(~is_leaf, neg_inf), (child - n_internal).clamp(min=0))
        best_values[rows], best_words[rows] = values, words
        f_lp = torch.cat([f_lp, child_lp.masked_fill(is_leaf, neg_inf)], dim=1)
        f_node = torch.cat([f_node, child.masked_fill(is_leaf, 0)], dim=1)
        f_lp.masked_fill_(f_lp <= values[:, -1:], neg_inf)  # cannot beat the new k-th best
        front_lp, front_node = _write_rows(front_lp, front_node, rows, f_lp, f_node)
    return TreeTopK(best_values, best_words, visited)


def _merge_topk(values: Tensor, words: Tensor, new_values: Tensor, new_words: Tensor) -> tuple[Tensor, Tensor]:
    """The best ``k`` of both candidate sets per row; equal scores go to the lower word id."""
    k = values.size(1)
    all_values, all_words = torch.cat([values, new_values], dim=1), torch.cat([words, new_words], dim=1)
    by_word = all_words.argsort(dim=1, stable=True)
    all_values, all_words = all_values.gather(1, by_word), all_words.gather(1, by_word)
    pick = all_values.argsort(dim=1, descending=True, stable=True)[:, :k]
    return all_values.gather(1, pick), all_words.gather(1, pick)


def _write_rows(front_lp: Tensor, front_node: Tensor, rows: Tensor, lp: Tensor, node: Tensor) -> tuple[Tensor, Tensor]:
    """Put the updated frontier of ``rows`` back, then drop columns no row needs (entries sorted best first)."""
    width = max(front_lp.size(1), lp.size(1))
    if front_lp.size(1) < width:
        front_lp = F.pad(front_lp, (0, width - front_lp.size(1)), value=float("-inf"))
        front_node = F.pad(front_node, (0, width - front_node.size(1)))
    front_lp[rows, : lp.size(1)] = lp
    front_lp[rows, lp.size(1):] = float("-inf")
    front_node[rows, : node.size(1)] = node
    needed = int((front_lp > float("-inf")).sum(dim=1).max())
    if needed < width // 2 or needed == 0:
        order = front_lp.argsort(dim=1, descending=True)[:, : max(needed, 1)]
        front_lp, front_node = front_lp.gather(1, order), front_node.gather(1, order)
    return front_lp, front_node


def _rebuild_layout_after_load(module: BinaryTreeSoftmax, incompatible_keys) -> None:
    """A loaded ``tree`` brings its own paths: derive them again."""
    module._layout = _TreeLayout(module.tree)


#: word2vec's updates touch the rows a step scores: the ``"word2vec"`` preset of the tree heads
WORD2VEC_PRESET = {"word2vec": {"sparse": True}}


@register_head("tree_huffman", presets=WORD2VEC_PRESET)
def _tree_huffman(in_features: int, n_classes: int, counts=None, seed: int = 0,
                  sparse: bool = False) -> BinaryTreeSoftmax:
    return BinaryTreeSoftmax(in_features, n_classes, tree="huffman", counts=counts, seed=seed, sparse=sparse)


@register_head("tree_random", presets=WORD2VEC_PRESET)
def _tree_random(in_features: int, n_classes: int, counts=None, seed: int = 0,
                 sparse: bool = False) -> BinaryTreeSoftmax:
    return BinaryTreeSoftmax(in_features, n_classes, tree="random", seed=seed, sparse=sparse)


@register_head("tree_file", presets=WORD2VEC_PRESET)
def _tree_file(in_features: int, n_classes: int, counts=None, path: str | None = None,
               sparse: bool = False) -> BinaryTreeSoftmax:
    """A tree read from a file written by :func:`sohsm.clustering.save_tree` (e.g. a bootstrapped tree)."""
    if path is None:
        raise ValueError("head 'tree_file' needs the path of a tree file (path=...)")
    children, _ = load_tree(path, n_classes)
    return BinaryTreeSoftmax(in_features, n_classes, tree=children, sparse=sparse)
