"""TreeSoftmax (any arity, any depth) against a naive float64 walk of the nested lists, and its special cases."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sohsm import TreeSoftmax, build_head
from sohsm.clustering import huffman_tree
from sohsm.clustering.hierarchy import (
    assignment_to_hierarchy,
    balanced_hierarchy,
    check_hierarchy,
    children_to_hierarchy,
    depth,
)
from sohsm.heads import BinaryTreeSoftmax, TwoLevelSoftmax

D = 5


def random_hierarchy(n: int, seed: int, max_arity: int = 5) -> list:
    """Nested lists over ``n`` words with arities 1..max_arity and leaves at many depths."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randperm(n, generator=g).tolist()

    def build(items: list) -> list:
        out = []
        while items:
            if len(items) > 1 and torch.rand(1, generator=g).item() < 0.6:
                take = int(torch.randint(1, min(len(items), 3 * max_arity) + 1, (1,), generator=g))
                out.append(build(items[:take]) if take > 1 else items[0])
                items = items[take:]
            else:
                out.append(items[0])
                items = items[1:]
        if len(out) > max_arity:  # group the surplus so arities stay small-ish but varied
            cut = len(out) // 2
            out = [out[:cut], out[cut:]] if cut > 1 else out
        return out

    return check_hierarchy(build(words), n)


def reference_log_prob(tree: list, weight: torch.Tensor, bias: torch.Tensor | None,
                       hidden: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` by walking the nested lists: the edges of each node, breadth first, are consecutive rows."""
    n_words = sum(1 for _ in _leaves(tree))
    out = hidden.new_zeros(hidden.size(0), n_words)
    queue, row = [(tree, hidden.new_zeros(hidden.size(0)))], 0
    while queue:
        node, lp = queue.pop(0)
        rows = weight[row: row + len(node)]
        scores = hidden @ rows.t() + (0 if bias is None else bias[row: row + len(node)])
        branch = F.log_softmax(scores, dim=1)
        row += len(node)
        for i, item in enumerate(node):
            if isinstance(item, list):
                queue.append((item, lp + branch[:, i]))
            else:
                out[:, item] = lp + branch[:, i]
    return out


def _leaves(tree):
    for item in tree:
        if isinstance(item, list):
            yield from _leaves(item)
        else:
            yield item


def make_head(n: int, seed: int, bias: bool = True, sparse: bool = False) -> tuple[TreeSoftmax, list]:
    tree = random_hierarchy(n, seed)
    torch.manual_seed(seed)
    head = TreeSoftmax(D, n, tree=tree, bias=bias, sparse=sparse).double()
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    return head, tree


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_and_gradients_match_naive_reference(seed):
    n = 40
    head, tree = make_head(n, seed)
    assert depth(tree) >= 3 and len(set(head.path_lengths().tolist())) >= 2  # leaves at different depths
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(30, D, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, n, (30,), generator=g)
    out = head(hidden, target)
    out.loss.backward()
    weight = head.weight.detach().clone().requires_grad_(True)
    bias = head.bias.detach().clone().requires_grad_(True)
    h = hidden.detach().clone().requires_grad_(True)
    ref = reference_log_prob(tree, weight, bias, h).gather(1, target[:, None]).squeeze(1)
    (-ref.mean()).backward()
    torch.testing.assert_close(out.output, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(head.bias.grad, bias.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", [3, 4])
def test_log_prob_is_exact_and_normalised(seed):
    head, tree = make_head(50, seed)
    hidden = torch.randn(12, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    log_prob = head.log_prob(hidden)
    torch.testing.assert_close(log_prob, reference_log_prob(tree, head.weight, head.bias, hidden),
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_prob.exp().sum(1), torch.ones(12, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    target = torch.arange(12)
    torch.testing.assert_close(head(hidden, target).output, log_prob.gather(1, target[:, None]).squeeze(1))


@pytest.mark.parametrize("k", [1, 3, 17])
@pytest.mark.parametrize("seed", [5, 6])
def test_topk_equals_dense_topk(k, seed):
    head, _ = make_head(60, seed)
    with torch.no_grad():
        head.weight.mul_(4.0)  # a peaked distribution: the search prunes
    hidden = torch.randn(25, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    values, words = head.topk(hidden, k)
    dense_values, dense_words = head.log_prob(hidden).topk(k, dim=1)
    torch.testing.assert_close(values, dense_values, rtol=1e-10, atol=1e-10)
    assert torch.equal(words, dense_words)
    assert torch.equal(head.predict(hidden), head.log_prob(hidden).argmax(1))
    assert int(head.search_topk(hidden, 1).nodes_visited.max()) <= head.n_internal


def test_binary_tree_head_is_a_special_case():
    counts = (1000.0 / torch.arange(1, 31, dtype=torch.float64)).round()
    binary = BinaryTreeSoftmax(D, 30, tree="huffman", counts=counts).double()
    tree = TreeSoftmax(D, 30, tree=children_to_hierarchy(binary.tree)).double()
    with torch.no_grad():  # P(child 0) = sigma(v . h) = softmax([v . h, 0 . h])[0]
        tree.weight.zero_()
        tree.weight[tree.offsets[:-1]] = binary.weight
    hidden = torch.randn(20, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    target = torch.randint(0, 30, (20,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(tree.log_prob(hidden), binary.log_prob(hidden), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tree(hidden, target).output, binary(hidden, target).output, rtol=1e-10, atol=1e-10)
    assert torch.equal(tree.path_lengths(), binary.path_lengths())


def test_two_level_head_is_a_special_case():
    n, clusters = 37, 6
    two = TwoLevelSoftmax(D, n, assignment="random", n_clusters=clusters, seed=3).double()
    hierarchy = assignment_to_hierarchy(two.assignment)
    tree = TreeSoftmax(D, n, tree=hierarchy).double()
    with torch.no_grad():
        root = tree.offsets[1]
        tree.weight[:root] = two.cluster_weight  # every cluster holds words here
        words = torch.tensor([w for cluster in hierarchy for w in cluster])
        tree.weight[root:] = two.word_vectors()[words]
    hidden = torch.randn(15, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    target = torch.randint(0, n, (15,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(tree.log_prob(hidden), two.log_prob(hidden), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tree(hidden, target).output, two(hidden, target).output, rtol=1e-10, atol=1e-10)


def test_balanced_tree_from_registry_has_the_asked_depth():
    head = build_head("tree", 8, 1000, depth=3, seed=1)
    assert isinstance(head, TreeSoftmax)
    assert int(head.path_lengths().max()) == 3 and int(head.path_lengths().min()) >= 2
    assert head.weight.size(0) < 1000 + 2 * 100  # edges: N leaves plus the internal nodes
    other = build_head("tree", 8, 1000, depth=3, seed=2)
    assert head.hierarchy() != other.hierarchy()  # the seed draws the word order
    assert depth(balanced_hierarchy(64, 4)) == 3


def test_sparse_gradient_equals_dense():
    dense, _ = make_head(30, 7, sparse=False)
    sparse, _ = make_head(30, 7, sparse=True)
    hidden = torch.randn(10, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 30, (10,), generator=torch.Generator().manual_seed(2))
    dense(hidden, target).loss.backward()
    sparse(hidden, target).loss.backward()
    assert sparse.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad)


def test_load_state_dict_brings_its_tree():
    head, _ = make_head(30, 8)
    other = TreeSoftmax(D, 30, bias=True).double()  # a balanced tree: other tables, other weight shape
    other.load_state_dict(head.state_dict())
    assert other.hierarchy() == head.hierarchy()
    hidden = torch.randn(4, D, dtype=torch.float64)
    torch.testing.assert_close(other.log_prob(hidden), head.log_prob(hidden))


@pytest.mark.parametrize("tree, message", [
    ([[0, 1], [1, 2]], "appears twice"),
    ([[0, 1], []], "empty node"),
    ([[0, 1], 2], "leaves out 1"),
    ([[0, 1], [2, "x"]], "word ids or lists"),
    ([[0, 1], [2, 9]], "out of range"),
])
def test_bad_hierarchies_are_refused(tree, message):
    with pytest.raises(ValueError, match=message):
        TreeSoftmax(D, 4, tree=tree)


def test_shared_and_cyclic_nodes_are_refused():
    shared = [0, 1]
    with pytest.raises(ValueError, match="shared node"):
        check_hierarchy([shared, shared], 2)
    cyclic: list = [0, 1]
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="cycle"):
        check_hierarchy(cyclic, 2)


def test_huffman_children_convert_to_nested_lists():
    children = huffman_tree(torch.tensor([5, 1, 1, 2]))
    nested = children_to_hierarchy(children)
    assert depth(nested) == 3 and sorted(_leaves(nested)) == [0, 1, 2, 3]
    assert 0 in nested  # the most frequent word sits under the root


def test_the_hierarchies_doc_example_runs():
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "hierarchies.md"
    (source,) = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    namespace: dict = {}
    exec(compile(source, str(doc), "exec"), namespace)
    assert namespace["head"].path_lengths().tolist() == [2, 2, 2, 2, 3, 3, 1]
