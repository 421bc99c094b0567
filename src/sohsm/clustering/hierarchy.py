"""Word hierarchies of any arity and depth, given as nested lists of word ids, and their flat tables.

A hierarchy over ``N`` words is a list whose items are word ids (leaves) or
non-empty lists of the same kind (internal nodes); every word appears exactly
once, at any depth::

    [[0, 1, 2], [3, [4, 5]], 6]        root -> node [0, 1, 2], node [3, [4, 5]], word 6

:func:`hierarchy_tables` numbers the internal nodes breadth-first (the root is
node 0, each depth's nodes a contiguous range) and lays out one *edge* per
non-root node, the edges of a node contiguous and in list order:

    offsets [I + 1]   edges of internal node i are offsets[i] .. offsets[i + 1] - 1
    child   [E]       what each edge leads to: internal node c < I, or the leaf of word c - I

The two-level clusterings (``[N]`` assignments) and the binary ``children``
tables of :mod:`sohsm.clustering.trees` are special cases; converters are here.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class HierarchyTables(NamedTuple):
    """Flat tables of a hierarchy (see the module docstring).

    Attributes:
        offsets: ``[I + 1]`` start of each internal node's edges; ``offsets[-1] == E``.
        child: ``[E]`` internal node id, or ``I + word`` for a leaf.
    """

    offsets: Tensor
    child: Tensor


def check_hierarchy(tree, n_words: int) -> list:
    """Validate nested lists of word ids covering ``0 .. n_words - 1`` once each; return a plain copy.

    Raises:
        ValueError: not a list, an empty list, an item that is neither an integer nor a list,
            a word out of range or given twice, a list met twice (a shared node or a cycle),
            or words missing (naming how many and the first).
    """
    if n_words < 2:
        raise ValueError(f"a hierarchy needs at least 2 words, got {n_words}")
    if not isinstance(tree, (list, tuple)):
        raise ValueError(f"a hierarchy must be a list of word ids and lists, got {type(tree).__name__}")
    seen = torch.zeros(n_words, dtype=torch.bool)
    on_path: set[int] = set()
    met: set[int] = set()

    def copy(node, where: str) -> list:
        if id(node) in on_path:
            raise ValueError(f"the hierarchy has a cycle: the list at {where} contains itself")
        if id(node) in met:
            raise ValueError(f"the hierarchy has a shared node: the list at {where} appears twice")
        if len(node) == 0:
            raise ValueError(f"the hierarchy has an empty node at {where}")
        on_path.add(id(node))
        met.add(id(node))
        out: list = []  # word ids and subtrees
        for i, item in enumerate(node):
            here = f"{where}[{i}]"
            if isinstance(item, (list, tuple)):
                out.append(copy(item, here))
            elif isinstance(item, bool) or not hasattr(item, "__index__"):
                raise ValueError(f"the hierarchy's items must be word ids or lists, got {item!r} at {here}")
            else:
                word = int(item)
                if not 0 <= word < n_words:
                    raise ValueError(f"word id {word} at {here} is out of range [0, {n_words})")
                if seen[word]:
                    raise ValueError(f"word {word} appears twice in the hierarchy (again at {here})")
                seen[word] = True
                out.append(word)
        on_path.discard(id(node))
        return out

    result = copy(tree, "root")
    if not bool(seen.all()):
        missing = (~seen).nonzero().squeeze(1)
        raise ValueError(f"the hierarchy leaves out {missing.numel()} of {n_words} words (first: {int(missing[0])})")
    if len(result) == 1 and isinstance(result[0], list):
        return result[0]  # a root with one child list: the same distribution, one softmax less
    return result


def hierarchy_tables(tree: list, n_words: int) -> HierarchyTables:
    """Breadth-first tables of a hierarchy already checked by :func:`check_hierarchy`."""
    internal = [tree]
    child: list[int] = []
    offsets = [0]
    i = 0
    while i < len(internal):  # breadth first: a node's internal children get the next ids
        for item in internal[i]:
            if isinstance(item, list):
                child.append(-len(internal))  # placeholder: internal node id, marked negative until I is known
                internal.append(item)
            else:
                child.append(item)
        offsets.append(len(child))
        i += 1
    n_internal = len(internal)
    child_t = torch.tensor(child, dtype=torch.long)
    child_t = torch.where(child_t < 0, -child_t, child_t + n_internal)
    return HierarchyTables(torch.tensor(offsets, dtype=torch.long), child_t)


def tables_to_hierarchy(tables: HierarchyTables) -> list:
    """Nested lists of word ids from flat tables (the inverse of :func:`hierarchy_tables`)."""
    offsets, child = tables.offsets.tolist(), tables.child.tolist()
    n_internal = len(offsets) - 1
    nodes: list[list] = [[] for _ in range(n_internal)]
    for i in range(n_internal):
        for c in child[offsets[i]: offsets[i + 1]]:
            nodes[i].append(nodes[c] if c < n_internal else c - n_internal)
    return nodes[0]


def assignment_to_hierarchy(assignment: Tensor) -> list:
    """A two-level hierarchy from an ``[N]`` cluster assignment: one list per non-empty cluster, ids ascending."""
    assignment = torch.as_tensor(assignment).reshape(-1).long().cpu()
    order = torch.sort(assignment, stable=True).indices
    sizes = torch.bincount(assignment).tolist()
    return [block.tolist() for block, size in zip(order.split(sizes), sizes) if size]


def hierarchy_to_assignment(tree: list, n_words: int) -> Tensor:
    """The ``[N]`` assignment of a two-level hierarchy: cluster ``c`` is the root's ``c``-th child.

    A word directly under the root forms a cluster of its own.

    Raises:
        ValueError: the hierarchy is deeper than two levels.
    """
    assignment = torch.full((n_words,), -1, dtype=torch.long)
    for c, item in enumerate(tree):
        words = item if isinstance(item, list) else [item]
        if any(isinstance(w, list) for w in words):
            raise ValueError(f"a two-level clustering was expected but the hierarchy is {depth(tree)} levels deep")
        assignment[torch.tensor(words, dtype=torch.long)] = c
    return assignment


def children_to_hierarchy(children: Tensor) -> list:
    """Nested lists of a binary ``children`` table (:mod:`sohsm.clustering.trees`), child 0 first."""
    table = torch.as_tensor(children).tolist()
    n_internal = len(table)
    nodes: list[list] = [[] for _ in range(n_internal)]
    for n in reversed(range(n_internal)):
        nodes[n] = [nodes[c] if c < n_internal else c - n_internal for c in table[n]]
    return nodes[0]


def depth(tree: list) -> int:
    """Levels of internal nodes on the longest root-to-leaf path (a flat list has depth 1)."""
    level, d = [tree], 0
    while level:
        d += 1
        level = [item for node in level for item in node if isinstance(item, list)]
    return d


def balanced_hierarchy(n_words: int, branching: int, generator: torch.Generator | None = None) -> list:
    """A balanced tree with at most ``branching`` children per node and the words at random leaves.

    The words (a random permutation drawn from ``generator``) are cut into
    ``branching`` nearly equal groups, recursively, until a group has at most
    ``branching`` words; all leaves are then within one level of each other.

    >>> depth(balanced_hierarchy(1000, 10))
    3
    """
    if int(n_words) < 2:
        raise ValueError(f"a hierarchy needs at least 2 words, got {n_words}")
    if int(branching) < 2:
        raise ValueError(f"branching must be >= 2, got {branching}")
    words = torch.randperm(n_words, generator=generator).tolist()
    return group_balanced(words, int(branching))


def group_balanced(words: list, branching: int) -> list:
    """``words`` in a balanced tree with at most ``branching`` children per node, order kept."""
    if len(words) <= branching:
        return list(words)
    levels = math.ceil(math.log(len(words), branching) - 1e-9)
    size = branching ** (levels - 1)  # words under each child, at most
    parts = math.ceil(len(words) / size)
    bounds = [round(i * len(words) / parts) for i in range(parts + 1)]
    return [group_balanced(words[lo:hi], branching) if hi - lo > 1 else words[lo]
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def branching_for_depth(n_words: int, levels: int) -> int:
    """The smallest branching factor whose balanced tree over ``n_words`` has at most ``levels`` levels."""
    b = max(2, math.ceil(n_words ** (1.0 / levels) - 1e-9))
    while b ** levels < n_words:
        b += 1
    return b
