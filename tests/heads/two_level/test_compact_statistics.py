"""SelfOrganizedSoftmax with ``q_clusters``: q kept as each word's top M clusters and one value for the rest."""
from __future__ import annotations

import io
import math

import pytest
import torch
from tests.heads.reference import shuffled_zipf_counts

from sohsm.clustering import greedy_assignment
from sohsm.heads import Reclustering, SelfOrganizedSoftmax
from sohsm.heads.two_level.self_organizing.compact_statistics import CompactRows

D, N = 6, 64
C = 8  # ceil(sqrt(64))


def _counts(n: int = N) -> torch.Tensor:
    return shuffled_zipf_counts(n)


def make_head(q_clusters=None, seed: int = 0, **kwargs) -> SelfOrganizedSoftmax:
    torch.manual_seed(seed)
    options = dict(counts=_counts(), update_every=3, seed=seed, shortlist=0, q_clusters=q_clusters)
    options.update(kwargs)
    reclustering = Reclustering.take(options)  # the class itself checks q_clusters, against its learned clusters
    return SelfOrganizedSoftmax(D, N, reclustering=reclustering, **options).double()


def _batch(generator: torch.Generator, batch: int = 48):
    hidden = torch.randn(batch, D, generator=generator, dtype=torch.float64)
    target = torch.randint(0, N, (batch,), generator=generator)
    target[: batch // 4] = target[batch // 4 : batch // 2]  # repeated words
    return hidden, target


def _train_together(heads, steps: int, seed: int = 5, check=None):
    optimizers = [torch.optim.Adagrad(h.parameters(), lr=0.5) for h in heads]
    for head, optimizer in zip(heads, optimizers):
        head.attach(optimizer)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        hidden, target = _batch(generator)
        hidden = hidden.to(heads[0].weight.dtype)
        for head, optimizer in zip(heads, optimizers):
            head(hidden, target).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if check is not None:
            check()
    return optimizers


def _dense_q(head) -> torch.Tensor:
    return head.statistics_rows().dense() if head.reclustering.q_clusters is not None else head.q


@pytest.mark.parametrize("shortlist, counts_given, dtype", [(0, True, torch.float64), (0, False, torch.float64),
                                                         (3, True, torch.float64), (3, True, torch.float32)])
def test_all_clusters_kept_equals_the_dense_head_bit_for_bit(shortlist, counts_given, dtype):
    counts = _counts() if counts_given else None  # (a shortlist needs counts)
    dense = make_head(None, shortlist=shortlist, counts=counts).to(dtype)
    compact = make_head(C, shortlist=shortlist, counts=counts).to(dtype)
    assert compact.q is None and compact.statistics.values.shape == (N, C)

    def same():
        assert torch.equal(_dense_q(compact), dense.q)
        assert torch.equal(compact.assignment, dense.assignment)

    _train_together([dense, compact], steps=10, check=same)
    assert len(dense.history) == len(compact.history) == 3
    assert any(record["change_rate"] > 0 for record in dense.history)  # the re-clusterings moved words
    assert dense.history == compact.history
    assert torch.equal(compact.weight, dense.weight)


def _per_token_top_m(index, values, rest, target, cluster_log_probs, counts, m):
    """The top-M rule one token at a time, float64: kept clusters and ``rest`` smoothed, then the M best
    of the row's C updated values kept and ``rest`` the highest of the others."""
    index, values, rest = index.clone().long(), values.clone(), rest.clone()
    samples = cluster_log_probs / math.log(2.0)
    for t, w in enumerate(target.tolist()):
        lam = 1.0 - 1.0 / max(float(counts[w]), 1.0)
        row = torch.full((C,), float(rest[w]), dtype=torch.float64)
        row[index[w]] = values[w]
        row = lam * row + (1.0 - lam) * samples[t]
        order = sorted(range(C), key=lambda c: -float(row[c]))
        kept, others = order[:m], order[m:]
        values[w], index[w] = row[kept], torch.tensor(kept)
        rest[w] = row[others].max()
    return index, values, rest


def test_top_m_update_equals_the_rule_applied_token_by_token():
    head = make_head(3, update_every=0)
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():  # a q whose rows differ, so that the kept sets differ from word to word
        head.statistics.values.copy_(-3.0 * torch.rand(N, 3, generator=generator, dtype=torch.float64) - 1.0)
        head.statistics.index.copy_(torch.stack([torch.randperm(C, generator=generator)[:3] for _ in range(N)]))
        head.statistics.rest.copy_(-4.0 - torch.rand(N, generator=generator, dtype=torch.float64))
    for _ in range(4):  # distinct words in a batch: one token per word, the rule exactly
        target = torch.randperm(N, generator=generator)[:20]
        log_probs = torch.log_softmax(3.0 * torch.randn(20, C, generator=generator, dtype=torch.float64), dim=1)
        stats = head.statistics
        expected = _per_token_top_m(stats.index, stats.values, stats.rest, target, log_probs, head.counts, 3)
        head.update_statistics(target, log_probs)
        got = CompactRows(head.statistics.index, head.statistics.values, head.statistics.rest, C).dense()
        want = CompactRows(*expected, C).dense()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        torch.testing.assert_close(head.statistics.rest, expected[2], rtol=0, atol=1e-12)


def test_rest_is_the_best_value_dropped_and_never_above_a_kept_one():
    dense, compact = make_head(None, update_every=0), make_head(2, update_every=0)
    _train_together([dense, compact], steps=6)
    assert bool((compact.statistics.values >= compact.statistics.rest[:, None]).all())
    assert not torch.equal(_dense_q(compact), dense.q)  # information was dropped


def test_a_cluster_that_becomes_best_for_a_frequent_word_enters_its_kept_clusters_in_time():
    """A cluster not kept becomes a frequent word's best: it must enter the word's kept clusters about
    when it enters the dense q's top M (a ``rest`` standing for the dropped clusters' mean keeps it out
    far longer: it restarts from the row's average at every batch; here it entered at step 2561, the
    dense top M at 1489)."""
    counts = torch.full((N,), 1000.0)  # smoothing 0.999: one batch moves a row by a thousandth
    dense, compact = (make_head(m, counts=counts, update_every=0) for m in (None, 2))
    word, entered = torch.tensor([5]), {}
    for step in range(3000):
        probs = torch.full((C,), 0.2 / (C - 2), dtype=torch.float64)
        probs[:2] = 0.4
        if step >= 1000:  # cluster 7 takes over from cluster 1
            probs[1], probs[7] = probs[7], 0.4
        for head in (dense, compact):
            head.update_statistics(word, probs.log()[None])
        if "dense" not in entered and 7 in dense.q[5].topk(2).indices.tolist():
            entered["dense"] = step
        if "compact" not in entered and 7 in compact.statistics.index[5].tolist():
            entered["compact"] = step
    assert set(entered) == {"dense", "compact"}, entered
    assert abs(entered["compact"] - entered["dense"]) <= 10, entered
    assert sorted(compact.statistics.index[5].tolist()) == [0, 7]


def test_compact_head_trains_reclusters_and_round_trips_its_state():
    head = make_head(2)
    initial = head.assignment.clone()
    _train_together([head], steps=9)
    assert len(head.history) == 3
    assert not torch.equal(head.assignment, initial)
    assert any(record["change_rate"] > 0 for record in head.history)
    state = head.state_dict()
    assert "q" not in state and {"q_index", "q_values", "q_rest"} <= set(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = make_head(2, seed=7)
    fresh.load_state_dict(torch.load(buffer))
    for name in ("q_index", "q_values", "q_rest", "assignment", "counts"):
        assert torch.equal(fresh.state_dict()[name], state[name]), name
    assert fresh.statistics.index.dtype == torch.int32
    # the same statistics give the same next re-clustering
    fresh.reassign()
    head.reassign()
    assert torch.equal(fresh.assignment, head.assignment)
    with pytest.raises(RuntimeError, match="q_values"):  # another M does not load
        make_head(3).load_state_dict(head.state_dict())
    with pytest.raises(RuntimeError, match="q_index"):  # nor a dense checkpoint
        make_head(2).load_state_dict(make_head(None).state_dict())


def test_memory_is_n_times_2m_plus_1_floats():
    n = 10_000
    dense = SelfOrganizedSoftmax(8, n, shortlist=0, reclustering=Reclustering(update_every=0))
    compact = SelfOrganizedSoftmax(8, n, shortlist=0, reclustering=Reclustering(update_every=0, q_clusters=16))
    assert dense.statistics_bytes() == n * 100 * 4
    assert compact.statistics_bytes() == n * (2 * 16 + 1) * 4
    stats = compact.statistics
    assert stats.index.dtype == torch.int32 and stats.values.dtype == stats.rest.dtype == torch.float32


def test_greedy_assignment_reads_compact_rows_as_the_dense_matrix():
    generator = torch.Generator().manual_seed(4)
    n, c, m = 300, 20, 5
    index = torch.stack([torch.randperm(c, generator=generator)[:m] for _ in range(n)]).int()
    values = -torch.rand(n, m, generator=generator)
    rest = -1.0 - torch.rand(n, generator=generator)
    rows = CompactRows(index, values, rest, c)
    tf = torch.rand(n, generator=generator, dtype=torch.float64)
    tf /= tf.sum()
    expected = greedy_assignment(rows.dense(), tf, 26, 0.2, block_size=64)
    got = greedy_assignment(rows, tf, 26, 0.2, block_size=64)
    assert torch.equal(got.assignment, expected.assignment) and got.fallback_words == expected.fallback_words


@pytest.mark.parametrize("seed", range(40))
def test_the_kept_clusters_solver_gives_the_reference_assignment(seed):
    """Compact rows are read by their kept clusters alone (each at least the row's rest, as the fold keeps them):
    the same assignment as Algorithm 1 written one word at a time over the dense rows, with ties (values on a few
    levels, rest equal to the weakest kept value), words that share a row, tight sizes, a small frequency budget
    (blocked clusters, fallbacks) and blocks cut at every size."""
    from sohsm.clustering.assignments import greedy_assignment_reference

    generator = torch.Generator().manual_seed(seed)
    n, c = int(torch.randint(5, 300, (1,), generator=generator)), int(torch.randint(3, 40, (1,), generator=generator))
    m = int(torch.randint(1, c, (1,), generator=generator))
    ties = seed % 2 == 0
    values = (torch.randint(0, 4, (n, m), generator=generator).float() if ties
              else torch.randn(n, m, generator=generator)).sort(dim=1, descending=True).values
    index = torch.stack([torch.randperm(c, generator=generator)[:m] for _ in range(n)]).int()
    gap = torch.randint(0, 2, (n,), generator=generator).float() if ties else torch.rand(n, generator=generator)
    rest = values.min(dim=1).values - (0 if seed % 5 == 0 else gap)
    rows = CompactRows(index, values, rest, c)
    tf = torch.ones(n, dtype=torch.float64) if seed % 3 == 0 else torch.rand(n, generator=generator,
                                                                            dtype=torch.float64) ** 3
    tf /= tf.sum()
    max_size = -(-n // c) + int(torch.randint(0, n, (1,), generator=generator)) // 3
    freq_budget = (0.02, 0.1, 1.0, 0.5 / c)[seed % 4]
    expected = greedy_assignment_reference(rows.dense(), tf, max_size, freq_budget)
    for block_size in (1024, 7, 1):
        got = greedy_assignment(rows, tf, max_size, freq_budget, block_size=block_size)
        assert torch.equal(got.assignment, expected.assignment) and got.fallback_words == expected.fallback_words


def test_rows_whose_rest_passes_a_kept_value_are_read_as_dense_rows():
    """A ``rest`` above a kept value (not what the fold keeps) leaves the kept clusters' shortcut: dense rows."""
    from sohsm.clustering.assignments import _kept_form, greedy_assignment_reference

    generator = torch.Generator().manual_seed(7)
    n, c, m = 200, 12, 3
    index = torch.stack([torch.randperm(c, generator=generator)[:m] for _ in range(n)]).int()
    values = torch.randn(n, m, generator=generator)
    rows = CompactRows(index, values, values.max(dim=1).values + 0.5, c)  # every other cluster beats the kept
    assert _kept_form(rows) is None
    tf = torch.rand(n, generator=generator, dtype=torch.float64)
    tf /= tf.sum()
    expected = greedy_assignment_reference(rows.dense(), tf, 25, 0.1)
    assert torch.equal(greedy_assignment(rows, tf, 25, 0.1).assignment, expected.assignment)


def test_deferred_solver_takes_the_compact_q():
    heads = [make_head(2, solver=solver) for solver in ("sequential", "deferred_acceptance")]
    _train_together(heads, steps=6)
    assert torch.equal(heads[0].assignment, heads[1].assignment)


@pytest.mark.parametrize("value", [0, C + 1, 2.0, True, "4"])
def test_bad_q_clusters_is_refused(value):
    with pytest.raises(ValueError, match=rf"q_clusters must be None or an integer in \[1, {C}\].*got {value!r}"):
        make_head(value)


def test_sync_free_path_refuses_compact_statistics():
    head = make_head(2)
    head.backend = "grouped_torch"
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    hidden, target = _batch(torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="sync-free path keeps the dense statistics only.*q_clusters=2"):
        head(hidden, target)


@pytest.mark.parametrize("q_clusters", [None, 3])
def test_statistics_seeded_from_known_values_read_back_as_given(q_clusters):
    """``ClusterStatistics.seed``: the dense ``q`` is the given one; the compact keeps each word's top ``M`` exactly
    and the rest at their mean; a ``q`` of the wrong width is refused."""
    from sohsm.heads.two_level.self_organizing.cluster_statistics import ClusterStatistics

    stats = ClusterStatistics(5, 6, 0, -math.log2(6), "epoch", q_clusters, counts_given=True)
    q = -torch.rand(5, 6, generator=torch.Generator().manual_seed(0)) * 4
    stats.seed(q)
    if q_clusters is None:
        assert torch.equal(stats.dense, q)
    else:
        values, index = q.topk(3, dim=1)
        assert torch.equal(stats.values, values) and torch.equal(stats.index.long(), index)
        torch.testing.assert_close(stats.rest, (q.sum(1) - values.sum(1)) / 3)
    with pytest.raises(ValueError, match=r"q must be \[N, 6\]"):
        stats.seed(q[:, :4])
