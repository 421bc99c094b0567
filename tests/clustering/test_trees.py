"""Trees for the tree softmax: Huffman (word2vec's construction) and random balanced trees."""
from __future__ import annotations

import heapq
import math

import pytest
import torch

from sohsm.clustering import check_tree, huffman_tree, random_tree, tree_paths


def _counts(n: int, kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "zipf":
        return (1e6 / torch.arange(1, n + 1, dtype=torch.float64)).round()[torch.randperm(n, generator=g)]
    if kind == "ties":  # many equal counts
        return torch.randint(1, 5, (n,), generator=g)
    return torch.randint(1, 10_000, (n,), generator=g)


def _codes(children: torch.Tensor) -> list[str]:
    paths = tree_paths(children)
    return ["".join(str(c) for c in row[:length]) for row, length in zip(paths.codes.tolist(), paths.lengths.tolist())]


def _optimal_cost(counts: list[int]) -> int:
    """Minimum of sum(count * code length) over binary trees: the sum of a Huffman heap's merges."""
    heap = list(counts)
    heapq.heapify(heap)
    cost = 0
    while len(heap) > 1:
        merged = heapq.heappop(heap) + heapq.heappop(heap)
        cost += merged
        heapq.heappush(heap, merged)
    return cost


@pytest.mark.parametrize("kind", ["zipf", "ties", "uniform"])
@pytest.mark.parametrize("n", [2, 3, 17, 200])
def test_huffman_codes_are_prefix_free_and_optimal(kind, n):
    counts = _counts(n, kind)
    children = huffman_tree(counts)
    codes = _codes(children)
    assert len(set(codes)) == n
    ordered = sorted(codes)  # a prefix sorts right before the codes it prefixes
    assert not any(b.startswith(a) for a, b in zip(ordered, ordered[1:]))
    lengths = tree_paths(children).lengths
    assert int((counts.long() * lengths).sum()) == _optimal_cost(counts.long().tolist())
    assert sum(2.0 ** -len(c) for c in codes) == pytest.approx(1.0)  # a full binary tree (Kraft equality)


def test_huffman_is_deterministic_under_ties_and_follows_word2vec():
    counts = _counts(300, "ties", seed=4)
    assert torch.equal(huffman_tree(counts), huffman_tree(counts.clone()))
    assert torch.equal(huffman_tree(torch.ones(64)), huffman_tree(torch.ones(64)))
    assert tree_paths(huffman_tree(torch.ones(64))).lengths.tolist() == [6] * 64
    # ties go to the merged node (word2vec, fastText): {2, 2, 1, 1} -> lengths 1, 2, 3, 3, not 2, 2, 2, 2
    assert tree_paths(huffman_tree(torch.tensor([2, 2, 1, 1]))).lengths.tolist() == [1, 2, 3, 3]
    # among equal counts the lower word id is the more frequent one (shorter or equal code)
    lengths = tree_paths(huffman_tree(torch.tensor([4, 1, 1, 1, 1, 1]))).lengths.tolist()
    assert lengths[1:] == sorted(lengths[1:])
    # the rarer word of a merged pair takes code 0
    assert _codes(huffman_tree(torch.tensor([3, 1]))) == ["1", "0"]


def test_huffman_frequent_words_get_short_codes():
    counts = _counts(500, "zipf", seed=2)
    lengths = tree_paths(huffman_tree(counts)).lengths
    order = counts.argsort(descending=True)
    assert (lengths[order][:-1] <= lengths[order][1:]).all()  # monotone in frequency
    assert int(lengths[order[0]]) <= 3


def test_huffman_unseen_words_count_once():
    counts = torch.tensor([1000] + [0] * 63)
    lengths = tree_paths(huffman_tree(counts)).lengths
    assert int(lengths.max()) <= 8  # no chain of zero-count merges
    assert torch.equal(huffman_tree(counts), huffman_tree(counts.clamp(min=1)))


def test_huffman_bad_counts():
    with pytest.raises(ValueError, match="at least 2 words"):
        huffman_tree(torch.tensor([3]))
    with pytest.raises(ValueError, match="non-negative"):
        huffman_tree(torch.tensor([3, -1]))


@pytest.mark.parametrize("n", [2, 3, 5, 8, 100, 1000])
def test_random_tree_is_balanced_with_every_word_once(n):
    children = random_tree(n, torch.Generator().manual_seed(n))
    paths = tree_paths(children)
    assert int(paths.lengths.max()) - int(paths.lengths.min()) <= 1
    assert int(paths.lengths.max()) == math.ceil(math.log2(n))
    assert sorted(children[children >= n - 1].tolist()) == list(range(n - 1, 2 * n - 1))
    assert len(set(_codes(children))) == n


def test_random_tree_follows_its_generator():
    a = random_tree(50, torch.Generator().manual_seed(1))
    assert torch.equal(a, random_tree(50, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, random_tree(50, torch.Generator().manual_seed(2)))


def test_check_tree_renumbers_breadth_first_and_keeps_the_tree():
    # root 0 -> (2, leaf w0); node 2 -> (1, leaf w1); node 1 -> (leaf w2, leaf w3): depth-first ids
    children = torch.tensor([[2, 3], [5, 6], [1, 4]])
    canonical = check_tree(children, 4)
    assert canonical.tolist() == [[1, 3], [2, 4], [5, 6]]
    assert _codes(canonical) == ["1", "01", "000", "001"]
    assert torch.equal(check_tree(canonical, 4), canonical)


@pytest.mark.parametrize(
    "children, match",
    [
        (torch.tensor([[1, 2]]), r"shape \[3, 2\]"),
        (torch.tensor([[1, 2], [3, 3], [4, 5]]), "exactly one parent"),
        (torch.tensor([[0, 3], [2, 4], [5, 6]]), r"values must be in \[1, 6\]"),
        (torch.tensor([[3, 4], [2, 5], [1, 6]]), "not reachable"),
        (torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "integer"),
    ],
)
def test_check_tree_errors(children, match):
    with pytest.raises(ValueError, match=match):
        check_tree(children, 4)
