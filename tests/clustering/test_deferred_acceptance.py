"""Algorithm 1 by deferred acceptance equals the sequential greedy (the paper's loop), fallback included."""
from __future__ import annotations

import math

import pytest
import torch

from sohsm.clustering.assignments import greedy_assignment, greedy_assignment_reference
from sohsm.clustering.deferred_acceptance import greedy_assignment_deferred


def _case(g: torch.Generator, trial: int):
    n_words = int(torch.randint(2, 150, (1,), generator=g))
    n_clusters = min(n_words, int(torch.randint(1, 16, (1,), generator=g)))
    max_size = max(math.ceil(n_words / n_clusters), int(torch.randint(1, 25, (1,), generator=g)))
    freq_budget = float(torch.rand(1, generator=g)) * 0.5 + 0.01  # small budgets force the fallback
    q = torch.randn(n_words, n_clusters, generator=g)
    if trial % 3 == 0:
        q = q.round()  # tied scores: the lower cluster id first
    if trial % 5 == 0:
        q[torch.rand(n_words, n_clusters, generator=g) < 0.2] = float("-inf")  # empty clusters' scores
    if trial % 7 == 0:
        q = q + 3 * torch.randn(1, n_clusters, generator=g)  # popular clusters: many rejections
    tf = torch.rand(n_words, generator=g, dtype=torch.float64) ** 3
    if trial % 4 == 0:
        tf = tf.round(decimals=1)  # tied frequencies: the lower word id first
    tf = tf / tf.sum() if tf.sum() > 0 else torch.full_like(tf, 1.0 / n_words)
    return q, tf, max_size, freq_budget


def test_deferred_acceptance_equals_sequential_greedy_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    fallback_cases = 0
    for trial in range(250):
        q, tf, max_size, freq_budget = _case(g, trial)
        expected = greedy_assignment_reference(q, tf, max_size, freq_budget)
        got = greedy_assignment_deferred(q, tf, max_size, freq_budget)
        assert torch.equal(got.assignment, expected.assignment), trial
        assert got.fallback_words == expected.fallback_words, trial
        fallback_cases += expected.fallback_words > 0
    assert fallback_cases >= 30  # the fallback rule was exercised, not only the main rule


def test_deferred_acceptance_equals_vectorised_greedy_at_a_larger_size():
    g = torch.Generator().manual_seed(1)
    n_words = 1500
    n_clusters = math.ceil(math.sqrt(n_words))
    q = torch.randn(n_words, n_clusters, generator=g) + 2 * torch.randn(1, n_clusters, generator=g)
    zipf = 1.0 / torch.arange(1, n_words + 1, dtype=torch.float64)
    tf = (zipf / zipf.sum())[torch.randperm(n_words, generator=g)]
    max_size = math.ceil(1.5 * math.sqrt(n_words))
    expected = greedy_assignment(q, tf, max_size, 0.1)
    got = greedy_assignment_deferred(q, tf, max_size, 0.1)
    assert torch.equal(got.assignment, expected.assignment) and got.fallback_words == expected.fallback_words


@pytest.mark.parametrize("q, tf, max_size, budget, match", [
    (torch.zeros(4), torch.ones(4), 4, 0.1, "q must have shape"),
    (torch.zeros(4, 2), torch.ones(3), 4, 0.1, "tf must have shape"),
    (torch.zeros(5, 2), torch.ones(5), 2, 0.1, "cannot hold"),
    (torch.zeros(4, 2), torch.ones(4), 4, 0.0, "freq_budget must be positive"),
])
def test_bad_arguments_are_refused(q, tf, max_size, budget, match):
    with pytest.raises(ValueError, match=match):
        greedy_assignment_deferred(q, tf, max_size, budget)


def _young_run(n_words: int, seen: float, g: torch.Generator):
    """q as a young run has it: the most frequent ``seen`` share of the words trained, the rest on the start row."""
    n_clusters = math.ceil(math.sqrt(n_words))
    q = torch.randn(n_words, n_clusters, generator=g) - math.log2(n_clusters)
    q[int(n_words * seen):] = -math.log2(n_clusters)
    zipf = 1.0 / torch.arange(1, n_words + 1, dtype=torch.float64)
    return q, zipf / zipf.sum(), math.ceil(1.5 * math.sqrt(n_words))


def test_rows_on_the_start_row_take_a_few_rounds_not_one_per_cluster():
    """90% of the words unseen: with ties to the lowest id they queued for one cluster a round (42 rounds)."""
    q, tf, max_size = _young_run(5000, 0.1, torch.Generator().manual_seed(2))
    got = greedy_assignment_deferred(q, tf, max_size, 0.1)
    assert got.rounds <= 4, got.rounds
    assert torch.equal(got.assignment, greedy_assignment(q, tf, max_size, 0.1).assignment)
    assert torch.bincount(got.assignment).max() <= max_size


def _is_stable(q: torch.Tensor, tf: torch.Tensor, assignment: torch.Tensor, max_size: int, budget: float) -> bool:
    """The assignment is Algorithm 1's, checked as a stable matching in float64 with no solver's code.

    Every cluster holds at most ``max_size`` words, and each of its words found it open (fewer words, less
    mass than ``budget``) counting only its more frequent members; no word prefers (by q, then the tie
    order) a cluster that its more frequent members leave open to it. With one ranking of the words for
    every cluster, this matching is unique.
    """
    q, n_clusters = q.double(), q.shape[1]
    rank = {w: r for r, w in enumerate(sorted(range(len(tf)), key=lambda w: (-float(tf[w]), w)))}

    def open_to(c: int, w: int) -> bool:
        ahead = [v for v in range(len(tf)) if int(assignment[v]) == c and rank[v] < rank[w]]
        return len(ahead) < max_size and sum(float(tf[v]) for v in ahead) < budget

    for w in range(len(tf)):
        own = int(assignment[w])
        if not open_to(own, w):
            return False
        key = lambda c: (float(q[w, c]), -((c - rank[w]) % n_clusters))  # noqa: E731
        if any(open_to(c, w) for c in range(n_clusters) if key(c) > key(own)):
            return False
    return True


@pytest.mark.parametrize("seed", range(12))
def test_deferred_acceptance_is_stable_on_small_inputs_with_tied_rows(seed):
    g = torch.Generator().manual_seed(seed)
    n_words = int(torch.randint(10, 60, (1,), generator=g))
    q, tf, _ = _young_run(n_words, [0.0, 0.1, 0.5][seed % 3], g)
    n_clusters = q.shape[1]
    max_size = math.ceil(n_words / n_clusters) + seed % 3
    if seed % 2:  # a few more ties inside the trained rows
        q = q.round()
    got = greedy_assignment_deferred(q, tf, max_size, 1.0)  # budget 1: no fallback, every word placed by q
    assert got.fallback_words == 0
    assert _is_stable(q, tf, got.assignment, max_size, 1.0)
    assert torch.equal(got.assignment, greedy_assignment_reference(q, tf, max_size, 1.0).assignment)
