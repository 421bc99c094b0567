"""Top-k on the device (``TwoLevelSoftmax.device_topk`` over ``sohsm.heads.two_level.ops.topk``) against the dense
float64 reference ``log_prob().topk``."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TwoLevelSoftmax

N, D = 80, 8


def _head(kind: str, projection: bool = False, sharp: bool = False) -> TwoLevelSoftmax:
    torch.manual_seed(0)
    counts = (1000.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()
    if kind == "two_level":
        head = TwoLevelSoftmax(D, N, assignment="random", counts=counts, projection=projection).double()
    else:
        head = SelfOrganizedSoftmax(D, N, counts=counts, projection=projection,
                                    reclustering=Reclustering(update_every=2)).double()
    if sharp:  # a trained head's cluster distribution: a few clusters hold most of a row's mass
        with torch.no_grad():
            head.cluster_weight.mul_(25.0)
    return head.eval()


def _hidden(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("k", [1, 5, 17])
def test_every_cluster_scored_is_the_exact_top_k(kind, projection, k):
    head = _head(kind, projection)
    hidden = _hidden(30, k)
    result = head.device_topk(hidden, k, clusters=head.n_clusters)
    expected = head.log_prob(hidden).topk(k, dim=1)
    assert bool(result.certified.all())
    torch.testing.assert_close(result.values, expected.values, rtol=0, atol=1e-12)
    log_probs = head.log_prob(hidden)
    torch.testing.assert_close(log_probs.gather(1, result.indices), expected.values, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
@pytest.mark.parametrize("clusters", [1, 2, 4])
def test_a_certified_row_is_exact_and_an_uncertified_one_may_not_be(kind, clusters):
    """The certificate is never wrong; over a flat (untrained) and a sharp cluster distribution it is
    earned by some rows and not by others, so both branches are exercised."""
    certified_rows = 0
    uncertified_rows = 0
    for sharp in (False, True):
        head = _head(kind, sharp=sharp)
        hidden = _hidden(200, clusters)
        k = 5
        result = head.device_topk(hidden, k, clusters=clusters)
        expected = head.log_prob(hidden).topk(k, dim=1).values
        ok = result.certified
        torch.testing.assert_close(result.values[ok], expected[ok], rtol=0, atol=1e-12)
        assert bool((result.values <= expected + 1e-12).all())  # a subset's best never beats the whole's
        certified_rows += int(ok.sum())
        uncertified_rows += int((~ok).sum())
    assert certified_rows > 0 and uncertified_rows > 0


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
def test_exact_topk_equals_log_prob_topk_and_topk(kind):
    for sharp in (False, True):
        head = _head(kind, sharp=sharp)
        hidden = _hidden(64, 3)
        values, indices = head.exact_topk(hidden, 7, clusters=2)
        expected = head.log_prob(hidden).topk(7, dim=1)
        torch.testing.assert_close(values, expected.values, rtol=0, atol=1e-12)
        search_values, search_indices = head.topk(hidden, 7)
        assert torch.equal(indices, search_indices)  # equal scores in word-id order, as the search


def test_more_words_asked_than_the_clusters_hold_are_minus_infinity_and_uncertified():
    head = _head("two_level")
    hidden = _hidden(4, 1)
    largest = int(head.cluster_sizes().max())
    result = head.device_topk(hidden, largest + 1, clusters=1)
    assert bool((result.values[:, -1] == float("-inf")).all()) and not bool(result.certified.any())
    assert bool((result.values[:, 0] > float("-inf")).all())


def test_arguments_are_checked():
    head = _head("two_level")
    with pytest.raises(ValueError, match="clusters must be an integer in"):
        head.device_topk(_hidden(2, 0), 3, clusters=0)
    with pytest.raises(ValueError, match="k must be an integer"):
        head.device_topk(_hidden(2, 0), 0)
    with pytest.raises(ValueError, match="hidden must have shape"):
        head.device_topk(torch.randn(2, D + 1, dtype=torch.float64), 3)


def test_device_topk_compiles_with_fullgraph():
    """Nothing is read back to the host: the whole call is one dynamo graph."""
    torch._dynamo.reset()
    head = _head("self_organized", sharp=True)
    # derive the layout eagerly (the compiled call reads it as it stands)
    head._layout  # noqa: B018 (a property read for its effect)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda h: head.device_topk(h, 5, clusters=3), fullgraph=True, backend=counter)
    for seed in range(2):
        hidden = _hidden(16, seed)
        got = compiled(hidden)
        expected = head.device_topk(hidden, 5, clusters=3)
        torch.testing.assert_close(got.values, expected.values, rtol=0, atol=1e-12)
        assert torch.equal(got.indices, expected.indices) and torch.equal(got.certified, expected.certified)
    assert counter.frame_count == 1


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
def test_topk_on_the_sync_free_path_takes_the_device_top_k(kind, monkeypatch):
    """``sync_free`` set: ``topk`` and ``predict`` go through exact_topk and still equal the reference."""
    head = _head(kind, sharp=True)
    calls = []
    original = head.exact_topk
    monkeypatch.setattr(head, "exact_topk", lambda *a, **k: calls.append(1) or original(*a, **k))
    head.backend = "grouped_torch"
    hidden = _hidden(40, 9)
    values, indices = head.topk(hidden, 4)
    expected = head.log_prob(hidden).topk(4, dim=1)
    torch.testing.assert_close(values, expected.values, rtol=0, atol=1e-12)
    assert torch.equal(head.predict(hidden), indices[:, 0]) and len(calls) == 2
    head.backend = "auto"
    head.topk(hidden, 4)
    assert len(calls) == 2  # the default path searches


def test_word_vectors_are_gathered_in_bounded_chunks(monkeypatch):
    """The tiles' word vectors are gathered ``GATHER_BYTES`` at a time (at 256k words, d 1024 and 1,024 rows all at
    once would be about 3.9 GB), with the same answer as one gather."""
    import sohsm.heads.two_level.ops.topk as module

    head = _head("self_organized", sharp=True)
    hidden = _hidden(40, 3)
    expected = head.device_topk(hidden, 5, clusters=3)
    width, row_bytes = head._sync_free_width(), head.weight.size(1) * head.weight.element_size()
    budget = 2 * width * row_bytes  # two tiles' word vectors
    monkeypatch.setattr(module, "GATHER_BYTES", budget)
    gathered, real_bmm = [], torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: gathered.append(b.numel() * b.element_size()) or real_bmm(a, b))
    got = head.device_topk(hidden, 5, clusters=3)
    assert len(gathered) > 1 and max(gathered) <= budget
    torch.testing.assert_close(got.values, expected.values, rtol=0, atol=1e-12)
    assert torch.equal(got.indices, expected.indices) and torch.equal(got.certified, expected.certified)
