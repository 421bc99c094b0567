"""Binary trees over the vocabulary for the tree hierarchical softmax: Huffman and random balanced.

A tree over ``N`` words has ``N - 1`` internal nodes and is stored as a
``children`` table, a ``[N - 1, 2]`` long tensor: row ``n`` holds the two
children of internal node ``n``. A child ``c < N - 1`` is internal node ``c``;
a child ``c >= N - 1`` is the leaf of word ``c - (N - 1)``. Node ``0`` is the
root, and :func:`check_tree` numbers internal nodes breadth-first, so each
depth's internal nodes are a contiguous range of ids. Going to child 0 ("left")
is code 0, to child 1 ("right") code 1, as in word2vec.

    children = [[1, 2],        root 0 -> internal 1 (code 0), leaf of word 0 (code 1)
                [3, 4]]        node 1 -> leaf of word 1 (code 0), leaf of word 2 (code 1)
                               (N = 3: leaves are ids 2, 3, 4)
"""
from __future__ import annotations

import pickle
from typing import NamedTuple

import torch
from torch import Tensor


class TreePaths(NamedTuple):
    """Every word's root-to-leaf path, padded to the tree's depth.

    Attributes:
        nodes: ``[N, D]`` internal nodes on the path of each word, root first; padding is 0.
        codes: ``[N, D]`` the branch taken at each of them (0 = child 0, 1 = child 1); padding is 0.
        lengths: ``[N]`` path length of each word (its code length), at least 1.
    """

    nodes: Tensor
    codes: Tensor
    lengths: Tensor


def check_tree(children: Tensor, n_words: int) -> Tensor:
    """Validate a ``children`` table and return it with internal nodes numbered breadth-first.

    The root (node 0) stays node 0; leaves keep their ids; internal nodes are
    renumbered in the order a breadth-first walk from the root meets them
    (child 0 before child 1), so the tree is the same with other node ids.

    Raises:
        ValueError: wrong shape, ids out of range, a node with two parents or
            none, or a node the root cannot reach.
    """
    children = torch.as_tensor(children)
    n_internal = n_words - 1
    if n_words < 2:
        raise ValueError(f"a tree needs at least 2 words, got {n_words}")
    if children.dim() != 2 or tuple(children.shape) != (n_internal, 2):
        raise ValueError(f"children must have shape [{n_internal}, 2] (N - 1 internal nodes), "
                         f"got {tuple(children.shape)}")
    if children.is_floating_point() or children.dtype == torch.bool:
        raise ValueError(f"children must hold integer node ids, got {children.dtype}")
    children = children.long().cpu()
    n_nodes = 2 * n_words - 1
    lo, hi = int(children.min()), int(children.max())
    if lo < 1 or hi >= n_nodes:
        raise ValueError(f"children values must be in [1, {n_nodes - 1}] (the root 0 is nobody's child), "
                         f"got min {lo} and max {hi}")
    parents = torch.bincount(children.reshape(-1), minlength=n_nodes)
    if bool((parents[1:] != 1).any()):
        bad = int((parents[1:] != 1).nonzero()[0]) + 1
        raise ValueError(f"every node but the root must have exactly one parent; node {bad} has {int(parents[bad])}")
    new_id = torch.full((n_internal,), -1, dtype=torch.long)
    level, count = torch.zeros(1, dtype=torch.long), 0
    while level.numel():
        new_id[level] = torch.arange(count, count + level.numel())
        count += level.numel()
        below = children[level].reshape(-1)  # child 0 and child 1 of each node, in level order
        level = below[below < n_internal]
        if count + level.numel() > n_internal:
            break  # a cycle: nodes are met twice
    if count != n_internal or bool((new_id < 0).any()):
        raise ValueError("children does not form one tree: some internal nodes are not reachable from the root 0")
    renumbered = torch.where(children < n_internal, new_id[children.clamp(max=n_internal - 1)], children)
    out = torch.empty_like(children)
    out[new_id] = renumbered
    return out


def tree_paths(children: Tensor) -> TreePaths:
    """Root-to-leaf paths of every word of a tree (see :func:`check_tree`), computed level by level."""
    n_internal = children.size(0)
    n_words = n_internal + 1
    n_nodes = 2 * n_words - 1
    device = children.device
    parent = torch.zeros(n_nodes, dtype=torch.long, device=device)
    code = torch.zeros(n_nodes, dtype=torch.long, device=device)
    internal = torch.arange(n_internal, device=device)
    parent[children[:, 0]], parent[children[:, 1]] = internal, internal
    code[children[:, 1]] = 1
    depth = torch.zeros(n_nodes, dtype=torch.long, device=device)
    level = torch.zeros(1, dtype=torch.long, device=device)
    while level.numel():  # depth of every node, top down
        below = children[level].reshape(-1)
        depth[below] = depth[level].repeat_interleave(2) + 1
        level = below[below < n_internal]
    leaves = torch.arange(n_internal, n_nodes, device=device)
    lengths = depth[leaves]
    max_depth = int(lengths.max())
    nodes = torch.zeros(n_words, max_depth, dtype=torch.long, device=device)
    codes = torch.zeros(n_words, max_depth, dtype=torch.long, device=device)
    rows = torch.arange(n_words, device=device)
    current = leaves
    for step in range(max_depth):  # walk up from every leaf at once; position = depth of the parent
        active = lengths > step
        if not bool(active.any()):
            break
        node = current[active]
        up = parent[node]
        nodes[rows[active], depth[up]] = up
        codes[rows[active], depth[up]] = code[node]
        current = current.clone()
        current[active] = up
    return TreePaths(nodes, codes, lengths)


def huffman_tree(counts: Tensor) -> Tensor:
    """The Huffman tree of word2vec and fastText on training counts, as a ``children`` table.

    Words sorted by descending count (ties: lower word id first) are merged two
    at a time from the rarest, taking the smaller of the next leaf and the next
    merged node, the merged node on a tie (word2vec's rule); the rarer of each
    pair gets code 0. Frequent words get short codes: the expected code length
    ``sum(counts * lengths) / sum(counts)`` is the minimum over binary trees.
    Counts below 1 are raised to 1 (a word never seen is merged like a word
    seen once), so unseen words cannot form a deep chain of zero-count nodes.

    Args:
        counts: ``[N]`` non-negative training counts, ``N >= 2``.

    Returns:
        ``[N - 1, 2]`` children table (see the module docstring), breadth-first numbered.

    >>> paths = tree_paths(huffman_tree(torch.tensor([5, 1, 1, 2])))
    >>> paths.lengths.tolist()
    [1, 3, 3, 2]
    """
    counts = torch.as_tensor(counts).reshape(-1)
    n_words = counts.numel()
    if n_words < 2:
        raise ValueError(f"a tree needs at least 2 words, got {n_words}")
    if bool((counts < 0).any()):
        raise ValueError(f"counts must be non-negative, got min {counts.min().item()}")
    counts = counts.to(torch.float64).clamp(min=1.0)
    order = torch.sort(counts, descending=True, stable=True).indices  # word of each leaf position
    weight = counts[order].tolist() + [0.0] * (n_words - 1)  # leaves, then merged nodes in creation order
    pair = [(0, 0)] * (n_words - 1)
    leaf, node = n_words - 1, n_words  # next leaf (rarest unmerged), next merged node
    for made in range(n_words - 1):
        picked = []
        for _ in range(2):
            if leaf >= 0 and (node >= n_words + made or weight[leaf] < weight[node]):
                picked.append(leaf)
                leaf -= 1
            else:
                picked.append(node)
                node += 1
        weight[n_words + made] = weight[picked[0]] + weight[picked[1]]
        pair[made] = (picked[0], picked[1])
    # positions: leaves 0..N-1 (by rank), merged nodes N..2N-2 (root last) -> children table ids
    n_internal = n_words - 1
    position = torch.tensor(pair, dtype=torch.long)  # [N - 1, 2]
    leaf_id = n_internal + order  # table id of the leaf at each rank position
    internal_id = n_internal - 1 - torch.arange(n_internal)  # merged node N + m -> id N - 2 - m (root -> 0)
    ids = torch.cat([leaf_id, internal_id])
    children = torch.empty(n_internal, 2, dtype=torch.long)
    children[internal_id] = ids[position]
    return check_tree(children, n_words)


def random_tree(n_words: int, generator: torch.Generator | None = None) -> Tensor:
    """A balanced binary tree with words at random leaves: leaf depths differ by at most one.

    Internal node ``n`` has children ``2n + 1`` and ``2n + 2`` (the layout of a
    binary heap with ``2N - 1`` nodes, whose last ``N`` are leaves); the words are
    a random permutation of those leaves, drawn from ``generator``.

    >>> tree_paths(random_tree(8, torch.Generator().manual_seed(0))).lengths.tolist()
    [3, 3, 3, 3, 3, 3, 3, 3]
    """
    if int(n_words) < 2:
        raise ValueError(f"a tree needs at least 2 words, got {n_words}")
    n_internal = n_words - 1
    heap = torch.arange(n_internal)[:, None] * 2 + torch.tensor([1, 2])  # heap positions of the children
    word_at = torch.randperm(n_words, generator=generator)  # word at each leaf position
    children = torch.where(heap < n_internal, heap, n_internal + word_at[(heap - n_internal).clamp(min=0)])
    return check_tree(children, n_words)


#: ``format`` field of a tree file
TREE_FORMAT = "sohsm-tree-1"


def save_tree(path, children: Tensor, **meta) -> None:
    """Write a ``children`` table and JSON-like metadata (how it was built) to a ``.pt`` file.

    The file is a plain dict, so ``torch.load(path, weights_only=True)`` reads it. It is written
    atomically: an existing file is replaced whole or left as it was.

    Raises:
        OSError (:class:`~sohsm.atomic_writes.WriteError`): the file could not be written (a full disk,
            a read-only folder), naming it and the system's reason.
    """
    from sohsm.atomic_writes import atomic_output

    children = check_tree(children, children.size(0) + 1)
    with atomic_output(path) as handle:
        torch.save({"format": TREE_FORMAT, "n_words": children.size(0) + 1, "children": children, **meta}, handle)


def load_tree(path, n_words: int | None = None) -> tuple[Tensor, dict]:
    """``(children, metadata)`` of a tree file written by :func:`save_tree`.

    Raises:
        ValueError: not a tree file, or a tree over another number of words than ``n_words``.
    """
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: not a readable tree file ({reason})") from None
    if not isinstance(data, dict) or data.get("format") != TREE_FORMAT:
        raise ValueError(f"{path}: not a sohsm tree file (format "
                         f"{data.get('format') if isinstance(data, dict) else None!r})")
    if n_words is not None and int(data["n_words"]) != int(n_words):
        raise ValueError(f"{path}: the tree has {data['n_words']} words, the vocabulary {n_words}")
    children = check_tree(data["children"], int(data["n_words"]))
    return children, {k: v for k, v in data.items() if k not in ("format", "children")}
