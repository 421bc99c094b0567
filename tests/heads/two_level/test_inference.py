"""Exact evaluation and top-k of the two-level heads from their stored word vectors, against a dense float64 reference.

``log_prob`` scores each band's weight where it is stored (never widened), normalises each cluster by one
``index_add`` taken below the row's best score, and re-normalises a cluster far below it with its own maximum; the
top-k search scores the bands in place and hands a row with a flat cluster distribution to the dense path. The
reference is written from the definition: every word's vector in word order (zero outside its band's block, the
hidden state's band views side by side), each cluster's words normalised on their own.
"""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import TwoLevelSoftmax, build_head
from sohsm.heads.two_level import best_first
from sohsm.heads.two_level.best_first import ordered_topk

D, N = 16, 120


def _counts() -> torch.Tensor:
    return (1000.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()


def _head(kind: str, banded: bool, dtype=torch.float64, **options):
    torch.manual_seed(4)
    bands = {"div_value": 4, "cutoffs": [10, 40]} if banded else {}
    if kind == "two_level":
        head = TwoLevelSoftmax(D, N, counts=_counts(), n_clusters=9, **bands, **options)
    else:
        head = build_head("self_organized", D, N, counts=_counts(), **bands, **options)
    return head.to(dtype).eval()


def reference_log_prob(head, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` float64, from the definition (word vectors in word order, one cluster's softmax at a time)."""
    h = hidden.detach().double()
    vectors = head.word_vectors().detach().double()  # [N, width], word order
    if head.band_projections is not None:
        h_w = torch.cat([h, *(h @ p.weight.detach().double().t() for p in head.band_projections)], dim=1)
    else:
        h_w = h
    cluster_logits = h @ head.cluster_weight.detach().double().t()
    sizes = torch.bincount(head.assignment, minlength=head.n_clusters)
    cluster_log_probs = torch.log_softmax(cluster_logits.masked_fill(sizes == 0, float("-inf")), dim=1)
    logits = h_w @ vectors.t()
    out = torch.empty_like(logits)
    for c in range(head.n_clusters):
        members = (head.assignment == c).nonzero().flatten()
        if members.numel():
            out[:, members] = cluster_log_probs[:, c : c + 1] + torch.log_softmax(logits[:, members], dim=1)
    return out


def _hidden(seed: int, batch: int = 24, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(batch, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("banded", [False, True])
@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
@pytest.mark.parametrize("grad", [False, True])
def test_log_prob_matches_the_dense_reference(kind, banded, grad):
    head = _head(kind, banded)
    hidden = 3 * _hidden(1)
    with torch.set_grad_enabled(grad):
        log_probs = head.log_prob(hidden)
    assert log_probs.shape == (24, N) and log_probs.is_contiguous()
    torch.testing.assert_close(log_probs.detach(), reference_log_prob(head, hidden), rtol=0, atol=1e-10)
    if grad:  # differentiable where a gradient is wanted
        (log_probs * torch.rand(log_probs.shape, dtype=log_probs.dtype)).sum().backward()
        rare = head.words.weights[-1]  # the rarest words' vectors (never alone in a cluster)
        assert rare.grad is not None and rare.grad.abs().sum() > 0 and head.cluster_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("banded", [False, True])
def test_a_cluster_far_below_the_best_word_is_normalised_with_its_own_maximum(banded):
    """Scores 150 nats below a row's best word underflow ``exp(score - row max)`` in float32: that cluster is
    normalised again with its own maximum, and its words keep their in-cluster probabilities."""
    head = _head("two_level", banded, dtype=torch.float32)
    hidden = _hidden(2, batch=4, dtype=torch.float32)
    with torch.no_grad():
        cluster = int(head.assignment[0])
        members = (head.assignment == cluster).nonzero().flatten()
        direction = hidden.mean(0) / hidden.mean(0).norm()
        slots = head._layout.slot_of_word[members]
        if banded:  # the band-0 words of that cluster: pushed far below every other word
            bands = head.words.band_rows(head._layout)
            rows = bands.row_of_slot[slots][bands.band_of_slot[slots] == 0]
            head.band_weights[0][rows] = -40 * direction + 0.3 * torch.randn(rows.numel(), D)
            members = members[bands.band_of_slot[slots] == 0]
        else:
            head.weight[slots] = -40 * direction + 0.3 * torch.randn(members.numel(), D)
        hidden = 6 * direction.expand(4, D) + 0.1 * hidden
        log_probs = head.log_prob(hidden)
    expected = reference_log_prob(head, hidden)
    assert torch.isfinite(log_probs).all()
    torch.testing.assert_close(log_probs.double(), expected, rtol=0, atol=2e-4)
    # the far words' share of their cluster, exactly as the reference has it (the cluster part alone is ~0 there)
    within = log_probs[:, members].double().logsumexp(1) - expected[:, members].logsumexp(1)
    assert within.abs().max() < 1e-3


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("banded", [False, True])
def test_log_prob_and_topk_follow_every_step_and_reclustering(banded):
    """Nothing the evaluation keeps goes stale: after each optimizer step and each re-clustering (every step here),
    ``log_prob`` and ``topk`` are those of the weights as they are now."""
    head = _head("self_organized", banded, update_every=1)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    hidden = 3 * _hidden(3, batch=6)
    g = torch.Generator().manual_seed(9)
    moved = 0
    for _ in range(4):
        head.train()
        before = head.assignment.clone()
        batch = 3 * torch.randn(64, D, generator=g, dtype=torch.float64)
        target = torch.randint(0, N, (64,), generator=g)
        optimizer.zero_grad()
        head(batch, target).loss.backward()
        optimizer.step()
        moved += int((head.assignment != before).sum())
        head.eval()
        with torch.no_grad():
            expected = reference_log_prob(head, hidden)
            torch.testing.assert_close(head.log_prob(hidden), expected, rtol=0, atol=1e-10)
            values, _ = head.topk(hidden, 5)
        torch.testing.assert_close(values, expected.topk(5).values, rtol=0, atol=1e-10)
    assert moved > 0  # the re-clusterings moved words: the layout-derived indices were derived again


def _tied_head(banded: bool):
    """A float64 head whose scores tie: word vectors on a coarse grid, several words of a cluster sharing one."""
    head = _head("two_level", banded)
    with torch.no_grad():
        for weight in head.words.weights:
            weight.copy_((weight * 4).round() / 4)
            weight[1::3] = weight[0::3][: weight[1::3].size(0)]  # neighbours in a block: same cluster, same vector
        head.cluster_weight.copy_((head.cluster_weight * 2).round() / 2)
    return head


def _check_topk(values, indices, expected: torch.Tensor, k: int) -> None:
    """``(values, indices)`` are the exact top ``k`` of ``expected`` (float64), equal scores by lower word id."""
    torch.testing.assert_close(values, expected.topk(k).values, rtol=0, atol=1e-10)
    torch.testing.assert_close(expected.gather(1, indices), values, rtol=0, atol=1e-10)
    for row in range(expected.size(0)):
        assert indices[row].unique().numel() == k
        kth = values[row, -1]
        better = (expected[row] > kth + 1e-9).nonzero().flatten()
        assert set(better.tolist()) <= set(indices[row].tolist())
        tied = (expected[row] - kth).abs() <= 1e-9
        chosen_tied = sorted(i for i in indices[row].tolist() if tied[i])
        assert chosen_tied == tied.nonzero().flatten().tolist()[: len(chosen_tied)]  # the lowest ids of the tie


@pytest.mark.parametrize("banded", [False, True])
@pytest.mark.parametrize("path", ["search", "dense", "decided"])
@pytest.mark.parametrize("k", [1, 3, 20, N])
def test_topk_is_exact_with_ties_and_k_beyond_a_cluster(banded, path, k, monkeypatch):
    """Search only, dense only, and the rule deciding per row: the same exact answer, equal scores by word id
    (``k = 20`` exceeds every cluster of 9 clusters over 120 words but one; ``k = N`` takes every word)."""
    head = _tied_head(banded)
    if path == "search":
        head.dense_topk = False
    elif path == "dense":
        monkeypatch.setattr(best_first, "DENSE_FRACTION", -1.0)
    hidden = torch.cat([(2 * _hidden(5, batch=10)).round(), torch.zeros(1, D)])  # the last row: a flat distribution
    expected = reference_log_prob(head, hidden)
    values, indices = head.topk(hidden, k)
    _check_topk(values, indices, expected, k)
    result = head.search_topk(hidden, k)
    assert torch.equal(result.indices, indices)
    if path == "dense":
        assert torch.equal(result.clusters_visited, torch.full((11,), head.n_clusters))


def test_a_trained_head_searches_a_few_clusters_and_a_flat_one_goes_dense():
    """The rule: a row whose open clusters hold over a quarter of the words is scored densely (every cluster
    counted as visited); a peaked row is searched."""
    head = _head("two_level", False)
    with torch.no_grad():
        head.cluster_weight.mul_(0.0)  # every cluster equally probable: nothing bounds the search
        flat = head.search_topk(_hidden(6, batch=3), 10)
        assert torch.equal(flat.clusters_visited, torch.full((3,), head.n_clusters))
        head.cluster_weight.copy_(torch.eye(head.n_clusters, D, dtype=torch.float64) * 60)
        peaked = head.search_topk(torch.eye(3, D, dtype=torch.float64), 10)
    assert (peaked.clusters_visited <= 2).all()


def test_ordered_topk_breaks_ties_by_lower_index():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (50, 30), generator=g).double()  # many ties, ties across the k-th place
    for k in (1, 5, 30):
        values, indices = ordered_topk(scores, k)
        order = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        assert torch.equal(indices, order)
        assert torch.equal(values, scores.gather(1, order))


@pytest.mark.parametrize("banded", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sample_draws_from_the_exact_distribution(banded, seed):
    """A cluster, then a word of it: 20,000 draws for each of two states within total variation 0.04 of
    ``exp(log_prob)`` (threshold set before looking: the expected distance of 20,000 draws over 120 words, most of
    the mass on a few dozen, is about 0.02)."""
    head = _head("self_organized", banded)
    hidden = _hidden(7 + seed, batch=2)
    draws = 20_000
    g = torch.Generator().manual_seed(seed)
    words = head.sample(hidden.repeat_interleave(draws, dim=0), generator=g).view(2, draws)
    expected = reference_log_prob(head, hidden).exp()
    for row in range(2):
        observed = torch.bincount(words[row], minlength=N).double() / draws
        assert 0.5 * (observed - expected[row]).abs().sum() < 0.04
    assert head.sample(hidden[0], generator=g).dim() == 0  # unbatched, as every head method
    powered = head.sample(hidden, temperature=0.5, generator=g)  # every word scored
    assert powered.shape == (2,) and ((powered >= 0) & (powered < N)).all()
