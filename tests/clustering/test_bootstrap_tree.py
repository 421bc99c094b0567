"""Mnih and Hinton's bootstrapped trees: balanced when asked, the adaptive variant follows the mixture's split."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from sohsm.clustering import bootstrap_tree, load_tree, save_tree, tree_paths
from sohsm.heads import BinaryTreeSoftmax, build_head


def _planted(sizes: list[int], d: int = 16, spread: float = 6.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Well separated Gaussian clusters of the given sizes, words of a cluster interleaved with the others."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])
    labels = labels[torch.randperm(labels.numel(), generator=g)]
    centres = torch.randn(len(sizes), d, generator=g) * spread
    return centres[labels] + torch.randn(labels.numel(), d, generator=g), labels


def _root_sides(children: torch.Tensor) -> list[set[int]]:
    """Words below child 0 and child 1 of the root."""
    paths = tree_paths(children)
    return [set((paths.codes[:, 0] == side).nonzero().flatten().tolist()) for side in (0, 1)]


@pytest.mark.parametrize("n", [2, 3, 7, 64, 100])
def test_balanced_tree_is_balanced(n):
    x, _ = _planted([n // 2, n - n // 2] if n > 2 else [1, 1])
    lengths = tree_paths(bootstrap_tree(x, "balanced", torch.Generator().manual_seed(1))).lengths
    assert int(lengths.max()) - int(lengths.min()) <= 1


def test_adaptive_root_split_follows_the_mixture_balanced_halves():
    x, labels = _planted([10, 30], seed=2)
    adaptive = _root_sides(bootstrap_tree(x, "adaptive", torch.Generator().manual_seed(0)))
    clusters = [set((labels == c).nonzero().flatten().tolist()) for c in (0, 1)]
    assert sorted(adaptive, key=len) == sorted(clusters, key=len)  # the unequal clusters, exactly
    balanced = _root_sides(bootstrap_tree(x, "balanced", torch.Generator().manual_seed(0)))
    assert sorted(len(s) for s in balanced) == [20, 20]
    small = min(clusters, key=len)
    assert any(small <= side for side in balanced)  # the small cluster is not cut


def test_planted_clusters_share_subtrees():
    x, labels = _planted([25] * 8, seed=3)
    for variant, least in (("adaptive", 0.9), ("balanced", 0.7)):  # random trees: about 0.25
        paths = tree_paths(bootstrap_tree(x, variant, torch.Generator().manual_seed(1)))
        prefix = [tuple(row[:3].tolist()) for row in paths.codes]
        purity = sum(Counter(prefix[i] for i in range(200) if labels[i] == c).most_common(1)[0][1]
                     for c in range(8)) / 200
        assert purity >= least, (variant, purity)


def test_deterministic_given_the_generator_and_handles_duplicates():
    x, _ = _planted([20, 20], seed=4)
    a = bootstrap_tree(x, "adaptive", torch.Generator().manual_seed(5))
    assert torch.equal(a, bootstrap_tree(x, "adaptive", torch.Generator().manual_seed(5)))
    same = torch.ones(9, 4)  # identical vectors: a tree still comes out
    for variant in ("balanced", "adaptive"):
        lengths = tree_paths(bootstrap_tree(same, variant)).lengths
        assert lengths.numel() == 9 and int(lengths.max()) <= 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="variant must be one of balanced, adaptive"):
        bootstrap_tree(torch.randn(5, 3), "random")
    with pytest.raises(ValueError, match=r"shape \[N, d\] with N >= 2"):
        bootstrap_tree(torch.randn(1, 3))
    with pytest.raises(ValueError, match="finite"):
        bootstrap_tree(torch.tensor([[0.0], [float("nan")]]))
    with pytest.raises(ValueError, match="em_steps"):
        bootstrap_tree(torch.randn(4, 2), em_steps=0)


def test_tree_file_round_trip_and_tree_file_head(tmp_path):
    x, _ = _planted([15, 15], seed=6)
    children = bootstrap_tree(x, "balanced", torch.Generator().manual_seed(0))
    path = tmp_path / "tree.pt"
    save_tree(path, children, kind="bootstrap", variant="balanced")
    loaded, meta = load_tree(path, 30)
    assert torch.equal(loaded, children) and meta["variant"] == "balanced" and meta["n_words"] == 30
    head = build_head("tree_file", 8, 30, path=str(path), sparse=True)
    assert isinstance(head, BinaryTreeSoftmax) and torch.equal(head.tree, children) and head.sparse
    with pytest.raises(ValueError, match="the tree has 30 words, the vocabulary 31"):
        load_tree(path, 31)
    with pytest.raises(ValueError, match="needs the path of a tree file"):
        build_head("tree_file", 8, 30)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a sohsm tree file"):
        load_tree(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("no")
    with pytest.raises(ValueError, match="not a readable tree file"):
        load_tree(tmp_path / "text.pt")
