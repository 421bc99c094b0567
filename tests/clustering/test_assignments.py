"""Word clusterings: random, frequency binning (Mikolov et al. 2011) and Algorithm 1 (Shen et al. 2017)."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from sohsm.clustering import (
    check_assignment,
    default_max_cluster_size,
    default_n_clusters,
    frequency_binning,
    greedy_assignment,
    greedy_assignment_reference,
    random_assignment,
)
from sohsm.clustering.assignments import best_clusters, tie_order
from sohsm.clustering.deferred_acceptance import greedy_assignment_deferred


def _random_tf(n: int, g: torch.Generator, kind: str) -> torch.Tensor:
    if kind == "zipf":
        counts = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
        counts = counts[torch.randperm(n, generator=g)]
    elif kind == "ties":  # small integer counts: many equal tf values
        counts = torch.randint(1, 5, (n,), generator=g).to(torch.float64)
    else:
        counts = torch.rand(n, generator=g, dtype=torch.float64) ** 3 + 1e-3
    return counts / counts.sum()


def _replay(q: torch.Tensor, tf: torch.Tensor, assignment: torch.Tensor, max_size: int, f_b: float) -> int:
    """Check Algorithm 1's rules word by word (descending tf) on a result; returns the fallback count.

    An independent oracle: each word must be in the best cluster by q among the open ones
    (ties: the word of rank r prefers r mod C, then r + 1 mod C, ...); when none is open, in the
    lightest cluster with room (ties: lowest id).
    """
    n_clusters = q.size(1)
    sizes, masses, fallback = [0] * n_clusters, [0.0] * n_clusters, 0
    for rank, w in enumerate(torch.sort(tf, descending=True, stable=True).indices.tolist()):
        c = int(assignment[w])
        open_ = [k for k in range(n_clusters) if sizes[k] < max_size and masses[k] < f_b]
        if open_:
            best = max(open_, key=lambda k: (float(q[w, k]), -((k - rank) % n_clusters)))
            assert c == best, f"word {w} went to {c}, its best open cluster is {best}"
        else:
            fallback += 1
            room = [k for k in range(n_clusters) if sizes[k] < max_size]
            lightest = min(room, key=lambda k: (masses[k], k))
            assert c == lightest, f"fallback word {w} went to {c}, the lightest cluster with room is {lightest}"
        sizes[c] += 1
        masses[c] += float(tf[w])
    return fallback


# -- Algorithm 1: constraints ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zipf", "uniformish", "ties"])
def test_greedy_respects_both_constraints_on_random_q(kind):
    n_words, n_clusters, f_b = 200, 15, 0.1
    max_size = default_max_cluster_size(n_words)  # ceil(1.5 * sqrt(200)) = 22
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(n_words, n_clusters, generator=g)
        tf = _random_tf(n_words, g, kind)
        result = greedy_assignment(q, tf, max_size, f_b)
        a = result.assignment
        assert a.shape == (n_words,) and a.dtype == torch.long
        assert ((a >= 0) & (a < n_clusters)).all()
        assert result.fallback_words == 0  # 15 clusters * 0.1 > 1: every word finds an open cluster
        sizes = torch.bincount(a, minlength=n_clusters)
        assert sizes.max() <= max_size
        for c in range(n_clusters):
            members = tf[a == c]
            if members.numel():
                # the cluster was open (mass < f_b) when its last, lightest word arrived
                assert float(members.sum() - members.min()) < f_b, (seed, c)


def test_greedy_places_words_in_descending_tf():
    """All three words want cluster 0, which has room for two: the two heaviest get it, not words 0 and 1."""
    q = torch.tensor([[0.0, -1.0], [0.0, -1.0], [0.0, -1.0]])
    tf = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    for fn in (greedy_assignment, greedy_assignment_reference):
        assert fn(q, tf, 2, 1.0).assignment.tolist() == [1, 0, 0]
    # the frequency budget too is spent by the heaviest words first
    q = torch.tensor([[0.0, -1.0, -2.0]] * 4)
    tf = torch.tensor([0.05, 0.4, 0.3, 0.25], dtype=torch.float64)
    for fn in (greedy_assignment, greedy_assignment_reference):
        assert fn(q, tf, 4, 0.35).assignment.tolist() == [2, 0, 1, 1]


def test_greedy_prefers_higher_q_and_breaks_ties_by_the_tie_order():
    """Ties go to the cluster at the word's frequency rank mod C, then the ones after it (:func:`tie_order`)."""
    q = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    tf = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], dtype=torch.float64)
    # rank 1 ties 0 and 1: 1 first; rank 2 ties all: 2 first; rank 3: 0 first; rank 4 (order 1, 2, 0):
    # 1 is full, 2 has room (the lowest id, 0, would have had room too)
    for fn in (greedy_assignment, greedy_assignment_reference, greedy_assignment_deferred):
        assert fn(q, tf, 2, 1.0).assignment.tolist() == [1, 1, 2, 0, 2], fn.__name__
    assert tie_order(torch.tensor([0, 4]), 3).tolist() == [[0, 1, 2], [3, 1, 2]]  # order of (c - r) mod 3
    assert best_clusters(torch.tensor([[0.0, 1.0, 0.0]]), tie_order(torch.tensor([2]), 3)).tolist() == [1]


def test_greedy_fallback_goes_to_the_lightest_cluster_with_room():
    """3 clusters with f_b = 0.05 close after one word each; the rest falls back.

    Word 3 goes to cluster 2 (lightest, 0.1), which is then full (max_size 2) although still the
    lightest (0.2), so word 4 must go to cluster 1 (0.25) rather than cluster 2.
    """
    q = torch.tensor([[1.0, 0.0, 0.0]] * 5)
    tf = torch.tensor([0.5, 0.25, 0.1, 0.1, 0.05], dtype=torch.float64)
    for fn in (greedy_assignment, greedy_assignment_reference):
        result = fn(q, tf, 2, 0.05)
        assert result.assignment.tolist() == [0, 1, 2, 2, 1]
        assert result.fallback_words == 2


@pytest.mark.parametrize("seed", range(6))
def test_greedy_fallback_on_small_vocabularies(seed):
    """n_clusters * f_b < 1: fallback happens, sizes stay bounded, fallback words go to the lightest cluster with
    room."""
    g = torch.Generator().manual_seed(seed)
    n_words = 30
    n_clusters = default_n_clusters(n_words)  # 6 clusters * 0.1 < 1
    max_size = default_max_cluster_size(n_words)
    q = torch.randn(n_words, n_clusters, generator=g)
    tf = _random_tf(n_words, g, "zipf" if seed % 2 else "uniformish")
    result = greedy_assignment(q, tf, max_size, 0.1)
    assert result.fallback_words > 0
    assert torch.bincount(result.assignment, minlength=n_clusters).max() <= max_size
    assert _replay(q, tf, result.assignment, max_size, 0.1) == result.fallback_words


# -- Algorithm 1: the vectorised implementation equals the sequential definition ------------


def test_vectorised_equals_reference_and_oracle_on_random_inputs():
    checked = 0
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        n_words = int(torch.randint(5, 80, (1,), generator=g))
        n_clusters = int(torch.randint(1, 10, (1,), generator=g))
        max_size = math.ceil(n_words / n_clusters) + int(torch.randint(0, 4, (1,), generator=g))
        if seed % 2:  # ties in q and in tf
            q = torch.randint(0, 3, (n_words, n_clusters), generator=g).float()
            tf = _random_tf(n_words, g, "ties")
        else:
            q = torch.randn(n_words, n_clusters, generator=g)
            tf = _random_tf(n_words, g, "zipf" if seed % 4 else "uniformish")
        f_b = [0.05, 0.1, 0.2, 0.3][seed % 4]
        expected = greedy_assignment_reference(q, tf, max_size, f_b)
        assert _replay(q, tf, expected.assignment, max_size, f_b) == expected.fallback_words
        for block_size in (1, 3, 1024):
            result = greedy_assignment(q, tf, max_size, f_b, block_size=block_size)
            assert torch.equal(result.assignment, expected.assignment), (seed, block_size)
            assert result.fallback_words == expected.fallback_words, (seed, block_size)
            checked += 1
    assert checked == 120


def test_vectorised_equals_reference_on_larger_inputs_with_block_cuts():
    g = torch.Generator().manual_seed(11)
    n_words, n_clusters = 400, 20
    q = torch.randn(n_words, n_clusters, generator=g)
    q[:, 3] += 2.0  # a popular cluster: many block cuts when it closes
    tf = _random_tf(n_words, g, "zipf")
    max_size = default_max_cluster_size(n_words)
    expected = greedy_assignment_reference(q, tf, max_size, 0.1)
    for block_size in (3, 64, 1024):
        assert torch.equal(greedy_assignment(q, tf, max_size, 0.1, block_size=block_size).assignment,
                           expected.assignment)


def test_vectorised_closes_a_cluster_whose_mass_reaches_the_budget_exactly():
    """Minimal repro: word 0 brings cluster 0 to exactly f_b = 0.2, which closes it (mass < f_b fails).

    Word 1 must go to cluster 1. Inside one block the vectorised code computes the mass before
    word 1 as cumsum - own tf = (0.2 + 0.15) - 0.15 = 0.19999999999999998 < 0.2 and puts it in
    cluster 0, breaking the budget and disagreeing with the reference.
    """
    q = torch.tensor([[0.0, -1.0], [0.0, -1.0]])
    tf = torch.tensor([0.2, 0.15], dtype=torch.float64)
    assert greedy_assignment_reference(q, tf, 2, 0.2).assignment.tolist() == [0, 1]
    assert greedy_assignment(q, tf, 2, 0.2, block_size=1).assignment.tolist() == [0, 1]
    assert greedy_assignment(q, tf, 2, 0.2).assignment.tolist() == [0, 1]


def test_vectorised_equals_reference_with_counts_that_fill_clusters_exactly():
    """tf = counts / total with small integer counts: cluster masses hit f_b exactly (found by random search)."""
    q = torch.tensor(
        [
            [0.0, 0.0, 1.0, 2.0, 2.0, 0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 2.0, 2.0],
            [0.0, 1.0, 2.0, 2.0, 1.0, 0.0, 1.0, 1.0, 2.0],
            [2.0, 0.0, 2.0, 0.0, 1.0, 2.0, 2.0, 1.0, 2.0],
            [1.0, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0],
            [2.0, 1.0, 2.0, 1.0, 2.0, 2.0, 2.0, 1.0, 2.0],
        ]
    )
    counts = torch.tensor([4.0, 4.0, 4.0, 4.0, 1.0, 3.0], dtype=torch.float64)
    tf = counts / counts.sum()
    expected = greedy_assignment_reference(q, tf, 4, 0.2)
    assert expected.assignment.tolist() == [3, 4, 2, 5, 6, 6]
    assert torch.equal(greedy_assignment(q, tf, 4, 0.2).assignment, expected.assignment)


def test_vectorised_terminates_when_q_holds_minus_infinity():
    """log2 P(c|h) can underflow to -inf (or an implementation may mask dead clusters with -inf).

    Cluster 1 is the only open cluster for word 2 but its q is -inf, tied with the closed cluster 0:
    argmax picks the closed cluster, the block is cut before its first word, and the loop never ends.
    Run in a subprocess so that a hang fails the test instead of the suite.
    """
    code = textwrap.dedent(
        """
        import torch
        from sohsm.clustering import greedy_assignment
        print("imported", flush=True)
        q = torch.tensor([[0.0, float('-inf')]] * 3)
        tf = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
        print(greedy_assignment(q, tf, 2, 1.0).assignment.tolist())
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "imported"  # import time is not limited
        try:
            process.wait(timeout=5)  # the computation itself takes milliseconds
        except subprocess.TimeoutExpired:
            pytest.fail("greedy_assignment did not terminate on a q row holding -inf")
        assert process.returncode == 0, process.stderr.read()
        assert process.stdout.read().strip() == "[0, 0, 1]"  # as greedy_assignment_reference gives
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()


@pytest.mark.parametrize(
    "q, tf, max_size, f_b, match",
    [
        (torch.zeros(4), torch.ones(4), 2, 0.1, "q must have shape"),
        (torch.zeros(4, 2), torch.ones(3), 2, 0.1, "tf must have shape"),
        (torch.zeros(5, 2), torch.ones(5), 2, 0.1, "cannot hold"),
        (torch.zeros(4, 2), torch.ones(4), 2, 0.0, "freq_budget"),
    ],
)
def test_greedy_bad_arguments(q, tf, max_size, f_b, match):
    for fn in (greedy_assignment, greedy_assignment_reference):
        with pytest.raises(ValueError, match=match):
            fn(q, tf, max_size, f_b)


# -- frequency binning ---------------------------------------------------------------------


def _check_binning(counts: torch.Tensor, n_clusters: int) -> torch.Tensor:
    a = frequency_binning(counts, n_clusters)
    n_words = counts.numel()
    assert a.shape == (n_words,) and a.dtype == torch.long
    seen = counts > 0 if bool((counts > 0).any()) else torch.ones(n_words, dtype=torch.bool)
    order = torch.sort(counts[seen].double(), descending=True, stable=True).indices
    along = a[seen][order]
    steps = along[1:] - along[:-1]
    assert along[0] == 0 and along[-1] == min(n_clusters, int(seen.sum())) - 1
    assert ((steps == 0) | (steps == 1)).all()  # the seen words: consecutive ranges of the frequency order
    assert torch.equal(torch.bincount(a, minlength=n_clusters) > 0, torch.ones(n_clusters, dtype=torch.bool))
    return a


@pytest.mark.parametrize("n_seen, n_unseen, n_clusters", [(40, 1000, 8), (500, 2000, 23), (3, 10, 5), (100, 5, 10)])
def test_frequency_binning_spreads_unseen_words_over_the_smallest_clusters(n_seen, n_unseen, n_clusters):
    g = torch.Generator().manual_seed(n_seen + n_unseen)
    counts = torch.cat([(1e4 / torch.arange(1, n_seen + 1, dtype=torch.float64)).round(), torch.zeros(n_unseen)])
    counts = counts[torch.randperm(counts.numel(), generator=g)]
    a = _check_binning(counts, n_clusters)
    seen_sizes = torch.bincount(a[counts > 0], minlength=n_clusters)
    sizes = torch.bincount(a, minlength=n_clusters)
    # each unseen word went where the fewest words were: the largest cluster is a seen-only one, or no
    # cluster exceeds the smallest by more than one word
    assert int(sizes.max()) == max(int(seen_sizes.max()), int(sizes.min()) + (1 if sizes.max() > sizes.min() else 0))
    assert int(sizes.max()) <= max(int(seen_sizes.max()), -(-counts.numel() // n_clusters))
    # the binning of the seen words is the binning of their counts alone
    seen_ids = (counts > 0).nonzero().squeeze(1)
    assert torch.equal(a[seen_ids], frequency_binning(counts[seen_ids], min(n_clusters, n_seen)))


@pytest.mark.parametrize("n_words, n_clusters", [(500, 23), (100, 10), (64, 8), (30, 30), (30, 1)])
def test_frequency_binning_on_zipf_counts(n_words, n_clusters):
    g = torch.Generator().manual_seed(n_words)
    counts = (1e5 / torch.arange(1, n_words + 1, dtype=torch.float64)).round()
    counts = counts[torch.randperm(n_words, generator=g)]
    a = _check_binning(counts, n_clusters)
    tf = counts / counts.sum()
    share = 1.0 / n_clusters
    cumulative = 0.0
    for c in range(n_clusters):
        members = tf[a == c]
        mass = float(members.sum())
        cumulative += mass
        # ~1/C of the mass: the cluster was below its share before its last, lightest word
        assert mass - float(members.min()) <= share + 1e-12, c
        if members.numel() > 1:
            assert mass <= 2 * share + 1e-12, c  # only a single heavy word may exceed that
        words_after = int((a > c).sum())
        if c < n_clusters - 1 and words_after > n_clusters - 1 - c:  # not the forced one-word tail
            assert cumulative > (c + 1) * share - 1e-12, c
    heavy = (tf > share).nonzero().flatten()
    for w in heavy.tolist():  # a word heavier than a share has a cluster of its own
        assert int((a == a[w]).sum()) == 1
    if n_words == 500:
        assert heavy.numel() > 0  # Zipf: the top word holds 1 / H_500 = 0.15 > 1/23


def test_frequency_binning_uniform_counts_are_balanced():
    a = _check_binning(torch.ones(100), 10)
    sizes = torch.bincount(a, minlength=10)
    assert sizes.min() >= 9 and sizes.max() <= 11


@pytest.mark.parametrize(
    "counts, n_clusters",
    [
        (torch.tensor([1000.0, 1.0, 1.0, 1.0, 1.0, 1.0]), 4),  # one word holds almost everything
        (torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0]), 3),  # unseen words
        (torch.zeros(7), 3),  # nothing seen at all
        (torch.tensor([3.0, 3.0, 3.0]), 3),  # one word per cluster
        (torch.tensor([1.0, 100.0, 1.0, 100.0, 1.0, 1.0, 1.0]), 5),
    ],
)
def test_frequency_binning_leaves_no_cluster_empty(counts, n_clusters):
    _check_binning(counts, n_clusters)


def test_frequency_binning_bad_arguments():
    with pytest.raises(ValueError, match="n_clusters"):
        frequency_binning(torch.ones(5), 6)
    with pytest.raises(ValueError, match="n_clusters"):
        frequency_binning(torch.ones(5), 0)
    with pytest.raises(ValueError, match="non-negative"):
        frequency_binning(torch.tensor([1.0, -1.0, 2.0]), 2)


# -- random assignment and helpers -------------------------------------------------------------


@pytest.mark.parametrize("n_words, n_clusters", [(100, 10), (101, 10), (37, 7), (5, 5), (9, 1)])
def test_random_assignment_is_balanced(n_words, n_clusters):
    a = random_assignment(n_words, n_clusters, torch.Generator().manual_seed(0))
    assert a.shape == (n_words,) and a.dtype == torch.long
    sizes = torch.bincount(a, minlength=n_clusters)
    assert sizes.numel() == n_clusters
    assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


def test_random_assignment_is_seeded():
    def make(seed):
        return random_assignment(200, 15, torch.Generator().manual_seed(seed))

    assert torch.equal(make(1), make(1))
    assert not torch.equal(make(1), make(2))
    assert not torch.equal(make(1), torch.arange(200) % 15)  # actually shuffled


def test_random_assignment_bad_arguments():
    with pytest.raises(ValueError, match="n_clusters"):
        random_assignment(5, 0)
    with pytest.raises(ValueError, match="n_clusters"):
        random_assignment(5, 6)


def test_defaults_follow_the_paper():
    assert default_n_clusters(100) == 10
    assert default_n_clusters(101) == 11
    assert default_n_clusters(44000) == 210
    assert default_max_cluster_size(100) == 15
    assert default_max_cluster_size(44000) == math.ceil(1.5 * math.sqrt(44000))
    # the defaults always leave room for every word
    for n in (2, 10, 30, 1000, 44000):
        assert default_n_clusters(n) * default_max_cluster_size(n) >= n


def test_check_assignment():
    a = check_assignment(torch.tensor([0, 2, 1], dtype=torch.int32), 3, 3)
    assert a.dtype == torch.long and a.tolist() == [0, 2, 1]
    assert check_assignment([1, 0], 2, 2).tolist() == [1, 0]
    with pytest.raises(ValueError, match="shape"):
        check_assignment(torch.zeros(2, 2, dtype=torch.long), 4, 2)
    with pytest.raises(ValueError, match="integer"):
        check_assignment(torch.zeros(3), 3, 2)
    with pytest.raises(ValueError, match="values must be in"):
        check_assignment(torch.tensor([0, 3, 1]), 3, 3)
