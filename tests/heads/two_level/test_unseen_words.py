"""``unseen_words="apart"``: the self-organized head keeps the words of count 0 in clusters of their own, beyond
``n_clusters``, from the start and through every re-assignment; where every word is seen it changes nothing."""
import math

import pytest
import torch

from sohsm import build_head
from sohsm.heads.two_level.self_organizing.reclustering import Reclustering
from sohsm.heads.two_level.self_organizing.self_organized import SelfOrganizedSoftmax

N, D = 2000, 16


def _counts(seed: int = 0, unseen: int = 1400) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 50, (N,), generator=g)
    counts[torch.randperm(N, generator=g)[:unseen]] = 0
    return counts


def _train(head: SelfOrganizedSoftmax, counts: torch.Tensor, steps: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    share = counts.double() / counts.sum()
    for _ in range(steps):
        target = torch.multinomial(share, 64, replacement=True, generator=g)
        _, loss = head(torch.randn(64, D, generator=g, dtype=head.cluster_weight.dtype), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _check_apart(head: SelfOrganizedSoftmax, counts: torch.Tensor, n_clusters: int, bounded: bool = True) -> None:
    """The reserved clusters hold the unseen words alone; ``bounded``: no cluster over Algorithm 1's size limit
    (initial frequency bins are not bounded, with the unseen words apart or not)."""
    seen, first = counts > 0, head.n_clusters - head.reserved_clusters
    unseen = ~seen & (head.assignment >= head.shortlist)  # a small corpus's shortlist can hold unseen words too
    assert head.n_clusters == head.shortlist + n_clusters + head.reserved_clusters
    assert head.reserved_clusters == math.ceil(int(unseen.sum()) / head.max_cluster_size)
    assert not bool((head.assignment[seen] >= first).any()), "a seen word in a reserved cluster"
    assert bool((head.assignment[unseen] >= first).all()), "an unseen word among the seen ones"
    reserved_sizes = torch.bincount(head.assignment[unseen] - first)
    assert int(reserved_sizes.max()) <= head.max_cluster_size and int(reserved_sizes.min()) > 0
    if bounded:
        assert int(torch.bincount(head.assignment).max()) <= head.max_cluster_size


@pytest.mark.parametrize("solver", ["sequential", "deferred_acceptance"])
@pytest.mark.parametrize("q_clusters", [None, 8])
@pytest.mark.parametrize("shortlist, init", [(None, "random"), (0, "frequency"), (None, "frequency")])
def test_unseen_words_stay_apart_through_the_reassignments(solver, q_clusters, shortlist, init):
    counts = _counts()
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(D, N, counts=counts, unseen_words="apart", shortlist=shortlist, init=init,
                                n_clusters=40, reclustering=Reclustering(update_every=3, solver=solver,
                                                                         q_clusters=q_clusters))
    _check_apart(head, counts, 40, bounded=init == "random")
    _train(head, counts, steps=9)
    assert len(head.history) == 3 and head.history[0]["change_rate"] > 0  # the seen words did move
    _check_apart(head, counts, 40)


def test_the_solvers_agree_with_the_unseen_words_apart():
    counts, assignments = _counts(), []
    for solver in ("sequential", "deferred_acceptance"):
        torch.manual_seed(0)
        head = SelfOrganizedSoftmax(D, N, counts=counts, unseen_words="apart",
                                    reclustering=Reclustering(update_every=3, solver=solver))
        _train(head, counts, steps=6)
        assignments.append(head.assignment.clone())
    assert torch.equal(*assignments)


@pytest.mark.parametrize("shortlist", [None, 0])
def test_apart_changes_nothing_where_every_word_is_seen(shortlist):
    counts = _counts(unseen=0)
    heads = []
    for unseen_words in ("spread", "apart"):
        torch.manual_seed(0)
        heads.append(SelfOrganizedSoftmax(D, N, counts=counts, unseen_words=unseen_words, shortlist=shortlist,
                                          reclustering=Reclustering(update_every=3)))
        _train(heads[-1], counts, steps=6)
    spread, apart = heads
    assert apart.reserved_clusters == 0 and apart.n_clusters == spread.n_clusters
    assert torch.equal(apart.assignment, spread.assignment)


def test_the_distribution_stays_whole_with_reserved_clusters():
    """Every row's probabilities, reserved clusters included, sum to 1 (float64)."""
    counts = _counts()
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(D, N, counts=counts, unseen_words="apart",
                                reclustering=Reclustering(update_every=3)).double()
    _train(head, counts, steps=6)
    total = head.log_prob(torch.randn(32, D, dtype=torch.float64)).exp().sum(1)
    torch.testing.assert_close(total, torch.ones(32, dtype=torch.float64), rtol=0, atol=1e-12)


def test_the_option_comes_by_name_and_bad_uses_are_refused():
    counts = _counts()
    head = build_head("self_organized", D, N, counts=counts, unseen_words="apart")
    assert head.reserved_clusters > 0 and "unseen_words=apart" in repr(head)
    with pytest.raises(ValueError, match="needs the word counts"):
        SelfOrganizedSoftmax(D, N, unseen_words="apart", shortlist=0)
    with pytest.raises(ValueError, match="unseen_words must be one of"):
        SelfOrganizedSoftmax(D, N, counts=counts, unseen_words="elsewhere")


def test_apart_leaves_less_mass_on_the_unseen_words():
    """Over three seeds, each: the head with the unseen words apart leaves under half the mass the spread head
    leaves on them (threshold set before the seeds were run; each word seen in context of its own direction)."""
    for seed in (1, 2, 3):
        g = torch.Generator().manual_seed(seed)
        counts = _counts(seed, unseen=1400)
        direction = torch.randn(N, D, generator=g)
        mass = {}
        for unseen_words in ("spread", "apart"):
            torch.manual_seed(seed)
            head = SelfOrganizedSoftmax(D, N, counts=counts, unseen_words=unseen_words,
                                        reclustering=Reclustering(update_every=50))
            optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
            head.attach(optimizer)
            data = torch.Generator().manual_seed(seed)
            share = counts.double() / counts.sum()
            for _ in range(300):
                target = torch.multinomial(share, 128, replacement=True, generator=data)
                _, loss = head(direction[target] + 0.5 * torch.randn(128, D, generator=data), target)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            with torch.no_grad():
                target = torch.multinomial(share, 1000, replacement=True, generator=data)
                probs = head.log_prob(direction[target] + 0.5 * torch.randn(1000, D, generator=data)).exp()
                mass[unseen_words] = float(probs[:, counts == 0].sum(1).mean())
        assert mass["apart"] < 0.5 * mass["spread"], (seed, mass)


@pytest.mark.parametrize("seen", [10, 60])  # every seen word in the shortlist; fewer seen words than clusters
def test_a_small_corpus_over_a_large_vocabulary(seen):
    counts = torch.zeros(N, dtype=torch.long)
    counts[torch.randperm(N, generator=torch.Generator().manual_seed(0))[:seen]] = torch.arange(seen, 0, -1)
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(D, N, counts=counts, unseen_words="apart", shortlist=20,
                                reclustering=Reclustering(update_every=3))
    _train(head, counts, steps=6)
    assert len(head.history) == 2
    _check_apart(head, counts, head.n_clusters - head.shortlist - head.reserved_clusters)
