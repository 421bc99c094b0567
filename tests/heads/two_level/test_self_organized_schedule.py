"""SelfOrganizedSoftmax's schedule: K from the epoch length, freezing the clusters, moved words' vectors."""
from __future__ import annotations

import io

import pytest
import torch

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, build_head

D, N = 6, 64


def _counts() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return torch.randint(1, 200, (N,), generator=g).double()


def _step(head, optimizer, seed: int, batch: int = 32) -> None:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, D, generator=g)
    target = torch.randint(0, N, (batch,), generator=g)
    head(hidden, target).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_update_every_none_gives_about_eight_reclusterings_per_epoch():
    counts = _counts()
    head = SelfOrganizedSoftmax(D, N, counts=counts)
    assert head.update_every is None  # not known before the first training batch
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    _step(head, optimizer, 0, batch=16)
    expected = max(1, round(float(counts.sum()) / 16 / 8))
    assert head.update_every == expected
    for s in range(1, expected):
        _step(head, optimizer, s, batch=16)
    assert len(head.history) == 1 and head.history[0]["step"] == expected


@pytest.mark.filterwarnings("ignore:SelfOrganizedSoftmax is training without an attached optimizer")
def test_reclusters_per_epoch_sets_k_and_the_paper_k_without_counts():
    counts = _counts()
    head = SelfOrganizedSoftmax(D, N, counts=counts, reclustering=Reclustering(reclusters_per_epoch=2))
    head(torch.randn(10, D), torch.randint(0, N, (10,)))
    assert head.update_every == round(float(counts.sum()) / 10 / 2)
    no_counts = SelfOrganizedSoftmax(D, N)
    no_counts(torch.randn(10, D), torch.randint(0, N, (10,)))
    assert no_counts.update_every == 1000
    explicit = SelfOrganizedSoftmax(D, N, counts=counts, reclustering=Reclustering(update_every=7))
    explicit(torch.randn(10, D), torch.randint(0, N, (10,)))
    assert explicit.update_every == 7


def test_resolved_k_tokens_and_frozen_state_survive_a_state_dict():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(freeze_after_tokens=64))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    for s in range(3):
        _step(head, optimizer, s)
    assert head.frozen and head.tokens_seen == 64  # frozen after the step that reached 64 tokens
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    buffer.seek(0)
    fresh = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(freeze_after_tokens=64))
    fresh.load_state_dict(torch.load(buffer))
    assert (fresh.update_every, fresh.tokens_seen, fresh.frozen) == (head.update_every, 64, True)


def test_freezing_runs_a_last_reassignment_then_never_again():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(),
                                reclustering=Reclustering(update_every=1000, freeze_after_tokens=96))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    for s in range(3):
        _step(head, optimizer, s)
    assert head.frozen and len(head.history) == 1 and head.history[0]["step"] == 3
    assignment, q = head.assignment.clone(), head.q.clone()
    for s in range(3, 8):
        _step(head, optimizer, s)
    assert torch.equal(head.assignment, assignment) and torch.equal(head.q, q)
    assert len(head.history) == 1


def test_reset_on_freeze_reinitialises_the_head_and_its_optimizer_state():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(),
                                reclustering=Reclustering(freeze_after_tokens=32, reset_on_freeze="head"))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    _step(head, optimizer, 0)
    assert head.frozen
    assert all(float(optimizer.state[p]["sum"].abs().sum()) == 0 for p in head.parameters())
    bound = D ** -0.5
    assert float(head.weight.detach().abs().max()) <= bound and float(head.cluster_weight.detach().abs().max()) <= bound


def test_moved_words_take_the_mean_of_their_new_cluster_mates():
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), shortlist=0,
                                reclustering=Reclustering(update_every=0, moved_vectors="cluster_mean"))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    _step(head, optimizer, 1)
    old_assignment = head.assignment.clone()
    old_vectors = head.word_vectors()
    old_sums = optimizer.state[head.weight]["sum"][head._layout.slot_of_word].clone()
    head.q.copy_(torch.randn(N, head.n_clusters))
    head.reassign(optimizer)
    moved = head.assignment != old_assignment
    assert bool(moved.any()) and bool((~moved).any())
    vectors = head.word_vectors()
    sums = optimizer.state[head.weight]["sum"][head._layout.slot_of_word]
    assert torch.equal(vectors[~moved], old_vectors[~moved])
    for w in moved.nonzero().squeeze(1).tolist():
        mates = (head.assignment == head.assignment[w]) & ~moved
        if bool(mates.any()):
            torch.testing.assert_close(vectors[w], old_vectors[mates].mean(0))
            torch.testing.assert_close(sums[w], old_sums[mates].mean(0))


@pytest.mark.parametrize("kwargs, match", [
    (dict(reclusters_per_epoch=0), "reclusters_per_epoch"),
    (dict(reset_on_freeze="all"), "reset_on_freeze"),
    (dict(moved_vectors="zero"), "moved_vectors"),
])
def test_bad_schedule_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_head("self_organized", D, N, counts=_counts(), **kwargs)


def test_update_growth_spaces_the_reclusterings_geometrically():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=3, update_growth=2))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    for s in range(22):
        _step(head, optimizer, s)
    assert [r["step"] for r in head.history] == [3, 9, 21]  # intervals 3, 6, 12
    paper = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=3))
    assert [s for s in range(1, 13) if paper.is_reassign_step(s)] == [3, 6, 9, 12]


def test_first_update_delays_the_first_reclustering_then_every_k_steps():
    """A frequency start held ``first_update`` steps: nothing moves before, then Algorithm 1 every K (growing)."""
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), init="frequency", shortlist=0,
                                reclustering=Reclustering(update_every=3, first_update=7, gamma=8.0))
    start = head.assignment.clone()
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    for s in range(6):
        _step(head, optimizer, s)
    assert head.history == [] and torch.equal(head.assignment, start)
    for s in range(6, 16):
        _step(head, optimizer, s)
    assert [r["step"] for r in head.history] == [7, 10, 13, 16]
    grown = SelfOrganizedSoftmax(D, N, counts=_counts(),
                                 reclustering=Reclustering(update_every=2, first_update=5, update_growth=2))
    assert [s for s in range(1, 30) if grown.is_reassign_step(s)] == [5, 9, 17]  # then intervals 4, 8
    assert "the first after step 7" in head.describe_schedule()


@pytest.mark.parametrize("growth", [0.5, float("inf"), float("nan"), "2"])
def test_update_growth_below_one_or_not_a_number_is_refused(growth):
    with pytest.raises(ValueError, match="update_growth"):
        SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_growth=growth))


def test_a_resumed_head_reclusters_on_the_same_grown_schedule():
    def run(split: int | None):
        torch.manual_seed(0)
        head = SelfOrganizedSoftmax(D, N, counts=_counts(),
                                    reclustering=Reclustering(update_every=2, update_growth=1.5))
        optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
        head.attach(optimizer)
        for s in range(14):
            if s == split:
                buffer = io.BytesIO()
                torch.save({"head": head.state_dict(), "opt": optimizer.state_dict()}, buffer)
                buffer.seek(0)
                saved = torch.load(buffer, weights_only=False)
                head = SelfOrganizedSoftmax(D, N, counts=_counts(),
                                            reclustering=Reclustering(update_every=2, update_growth=1.5))
                head.load_state_dict(saved["head"])
                optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
                optimizer.load_state_dict(saved["opt"])
                head.attach(optimizer)
            _step(head, optimizer, s)
        return [r["step"] for r in head.history], head.assignment.clone()

    steps, assignment = run(None)
    resumed_steps, resumed_assignment = run(7)
    assert steps == resumed_steps == [2, 5, 9]  # intervals 2, 3, round(4.5) = 4
    assert torch.equal(assignment, resumed_assignment)
