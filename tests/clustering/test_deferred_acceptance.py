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
