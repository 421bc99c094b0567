"""BinaryTreeSoftmax against a dense float64 walk of the tree, and its best-first search."""
from __future__ import annotations

import pytest
import torch

from sohsm.clustering import huffman_tree, tree_paths
from sohsm.heads import BinaryTreeSoftmax, build_head

from .reference import tree_log_prob

D, N = 6, 60


def _counts(n: int = N) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return (1000.0 / torch.arange(1, n + 1, dtype=torch.float64)).round()[torch.randperm(n, generator=g)]


def _explicit_tree() -> torch.Tensor:
    """A caterpillar (node i -> (node i + 1, word i); paths up to N - 1 long), internal ids shuffled."""
    n_internal = N - 1
    rows = [[i + 1, n_internal + i] for i in range(n_internal - 1)] + [[n_internal + N - 2, n_internal + N - 1]]
    children = torch.tensor(rows)
    relabel = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(n_internal - 1, 0, -1)])  # root stays 0
    shuffled = torch.empty_like(children)
    shuffled[relabel] = torch.where(children < n_internal, relabel[children.clamp(max=n_internal - 1)], children)
    return shuffled


def make_head(tree: str, seed: int = 0, sparse: bool = False) -> BinaryTreeSoftmax:
    torch.manual_seed(seed)
    if tree == "explicit":
        head = BinaryTreeSoftmax(D, N, tree=_explicit_tree(), sparse=sparse)
    else:
        head = BinaryTreeSoftmax(D, N, tree=tree, counts=_counts(), seed=seed, sparse=sparse)
    return head.double()


TREES = ["huffman", "random", "explicit"]


def _batch(seed: int, batch: int = 40, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, D, generator=g, dtype=dtype)
    target = torch.randint(0, N, (batch,), generator=g)
    target[: batch // 4] = target[batch // 4 : batch // 2]  # repeated words
    return hidden, target


@pytest.mark.parametrize("tree", TREES)
def test_loss_and_gradients_match_dense_reference(tree):
    head = make_head(tree, seed=1)
    hidden, target = _batch(1)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()

    weight = head.weight.detach().clone().requires_grad_(True)
    h = hidden.detach().clone().requires_grad_(True)
    expected = tree_log_prob(head.tree, weight, h).gather(1, target[:, None]).squeeze(1)
    (-expected.mean()).backward()
    assert out.output.dtype == torch.float64
    torch.testing.assert_close(out.output, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.loss, -expected.mean().detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tree", TREES)
def test_log_prob_normalised_equals_reference_and_output(tree):
    head = make_head(tree, seed=2)
    hidden, target = _batch(2)
    hidden = hidden * 3
    log_prob = head.log_prob(hidden)
    assert log_prob.shape == (hidden.size(0), N)
    assert log_prob.logsumexp(1).abs().max() < 1e-12
    torch.testing.assert_close(log_prob, tree_log_prob(head.tree, head.weight.detach(), hidden), rtol=0, atol=1e-12)
    output = head(hidden, target).output
    torch.testing.assert_close(output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-12)
    assert head.score_parts(hidden, target) is None


def test_log_prob_is_differentiable():
    head = make_head("huffman", seed=3)
    hidden, target = _batch(3, batch=8)
    hidden.requires_grad_(True)
    head.log_prob(hidden).gather(1, target[:, None]).sum().backward()
    grad_hidden, grad_weight = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    head(hidden, target).output.sum().backward()
    torch.testing.assert_close(grad_hidden, hidden.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_weight, head.weight.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("tree", TREES)
def test_topk_and_predict_equal_log_prob_topk(tree, k):
    head = make_head(tree, seed=4)
    hidden, _ = _batch(4, batch=64)
    hidden = hidden * 2
    log_prob = head.log_prob(hidden)
    ref_values, ref_indices = log_prob.topk(k, dim=1)
    result = head.search_topk(hidden, k)
    values, indices = head.topk(hidden, k)
    assert torch.equal(values, result.values) and torch.equal(indices, result.indices)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-12)
    assert torch.equal(indices, ref_indices)  # random gaussian inputs: no ties
    visited = result.nodes_visited
    # at least the k-th word's path, at most every internal node
    assert (visited >= head.path_lengths()[indices[:, -1]]).all() and (visited <= N - 1).all()
    if k == 1:
        assert torch.equal(head.predict(hidden), ref_indices[:, 0])


@pytest.mark.parametrize("k", [1, 3, N])
def test_topk_float32_and_up_to_the_whole_vocabulary(k):
    head = make_head("random", seed=5).float()
    hidden, _ = _batch(5, batch=16, dtype=torch.float32)
    values, indices = head.topk(hidden, k)
    torch.testing.assert_close(values, head.log_prob(hidden).topk(k, dim=1).values, rtol=0, atol=1e-5)
    assert all(len(set(row)) == k for row in indices.tolist())


def test_search_visits_few_nodes_when_decisions_are_confident():
    """Trained to separate one prototype per word, the search visits about one path per row."""
    torch.manual_seed(6)
    d = 64  # N random prototypes in d > N dimensions: every node's split is linearly separable
    head = BinaryTreeSoftmax(d, N, tree="huffman", counts=_counts()).double()
    prototypes = torch.randn(N, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    for _ in range(200):
        optimizer.zero_grad()
        head(prototypes, torch.arange(N)).loss.backward()
        optimizer.step()
    result = head.search_topk(prototypes, 1)
    assert torch.equal(result.indices[:, 0], torch.arange(N))
    assert torch.equal(result.indices[:, 0], head.log_prob(prototypes).argmax(1))
    mean_visited = result.nodes_visited.double().mean()
    assert mean_visited < 1.5 * head.path_lengths().double().mean() and mean_visited < (N - 1) / 4


def test_sparse_gradient_equals_dense():
    dense, sparse = make_head("huffman", seed=7), make_head("huffman", seed=7, sparse=True)
    hidden, target = _batch(7)
    dense(hidden, target).loss.backward()
    sparse(hidden, target).loss.backward()
    assert sparse.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad, rtol=0, atol=1e-12)
    before = sparse.weight.detach().clone()
    torch.optim.SGD(sparse.parameters(), lr=0.1).step()  # takes sparse gradients
    torch.testing.assert_close(sparse.weight.detach(), before - 0.1 * dense.weight.grad, rtol=0, atol=1e-12)


def test_tree_options_and_paths():
    counts = _counts()
    head = BinaryTreeSoftmax(D, N, tree="huffman", counts=counts)
    assert torch.equal(head.tree, huffman_tree(counts))
    assert torch.equal(head.path_lengths(), tree_paths(head.tree).lengths)
    nodes, signs = head.paths()
    assert nodes.shape == signs.shape == (N, int(head.path_lengths().max()))
    assert torch.equal((signs != 0).sum(1), head.path_lengths())
    assert head.weight.shape == (N - 1, D)
    a, b = BinaryTreeSoftmax(D, N, tree="random", seed=1), BinaryTreeSoftmax(D, N, tree="random", seed=2)
    assert not torch.equal(a.tree, b.tree)
    assert torch.equal(a.tree, BinaryTreeSoftmax(D, N, tree="random", seed=1).tree)


def test_state_dict_brings_its_tree_and_dtype_moves_keep_tables():
    source = make_head("huffman", seed=8)
    target_head = make_head("random", seed=9)
    target_head.load_state_dict(source.state_dict())
    hidden, target = _batch(8)
    torch.testing.assert_close(target_head.log_prob(hidden), source.log_prob(hidden), rtol=0, atol=0)
    torch.testing.assert_close(target_head(hidden, target).output, source(hidden, target).output, rtol=0, atol=0)
    as_float = make_head("huffman", seed=8).float()
    out = as_float(hidden.float(), target)
    assert out.output.dtype == torch.float32
    torch.testing.assert_close(out.output.double(), source(hidden, target).output, rtol=0, atol=1e-5)
    out_3d = source(hidden.reshape(5, 8, D), target.reshape(5, 8))
    torch.testing.assert_close(out_3d.output, source(hidden, target).output, rtol=0, atol=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="needs the word counts"):
        BinaryTreeSoftmax(D, N, tree="huffman")
    with pytest.raises(ValueError, match="tree must be 'huffman', 'random'"):
        BinaryTreeSoftmax(D, N, tree="balanced")
    with pytest.raises(ValueError, match=r"counts must have shape \[60\]"):
        BinaryTreeSoftmax(D, N, counts=torch.ones(N - 1))
    with pytest.raises(ValueError, match=r"children must have shape \[59, 2\]"):
        BinaryTreeSoftmax(D, N, tree=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="k must be"):
        make_head("random").topk(torch.randn(2, D, dtype=torch.float64), N + 1)


def test_build_head_names():
    counts = _counts()
    huffman = build_head("tree_huffman", D, N, counts=counts, seed=3)
    assert torch.equal(huffman.tree, huffman_tree(counts))
    random_head = build_head("tree_random", D, N, counts=counts, seed=3, sparse=True)
    assert torch.equal(random_head.tree, BinaryTreeSoftmax(D, N, tree="random", seed=3).tree) and random_head.sparse
    with pytest.raises(ValueError, match="counts"):
        build_head("tree_huffman", D, N)
