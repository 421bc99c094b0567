"""Algorithm 1 on the device, by deferred acceptance: no loop over the words on the host.

Algorithm 1 (:func:`sohsm.clustering.greedy_assignment`) is a serial dictatorship:
the words, most frequent first, each take their best cluster that is still open
(fewer than ``max_size`` words, token mass below ``freq_budget``). Every cluster
ranks the words the same way (by frequency), and each cluster's acceptance rule is
a *prefix* rule: among the words that want it, it takes the most frequent ones for
as long as it stays open. With one common ranking, deferred acceptance (Gale and
Shapley) then ends in the serial dictatorship's assignment:

* every round, each word without a cluster proposes to its next cluster (best
  ``q`` first, ties in the word's :func:`~sohsm.clustering.assignments.tie_order`);
* every cluster keeps the longest prefix, by frequency, of the words it holds and
  the new proposers that keeps it open; the others are rejected and propose again.

A word is only ever displaced by more frequent words, so by induction on the
frequency order each word ends in the first cluster of its list that the more
frequent words leave open: Algorithm 1's choice. A round is a few tensor
operations over all words at once; rounds run until no word is left to propose
(two read-backs of a count per round).

Two things keep the rounds few. A cluster that rejects the word of rank ``r`` is
closed to every word of rank ``r`` or more for good (it stays filled by more
frequent words), so a proposer skips the clusters known closed to it instead of
being rejected by each in turn. And the tie order spreads words with equal rows
(the words not seen yet, all on q's starting row) over every cluster: with ties
to the lowest id they all proposed to one cluster a round, about ``N / max_size``
rounds (144 at 50k words).

The fallback of Algorithm 1 (a word that no cluster can take under both rules goes
to the lightest cluster with room) concerns a *suffix* of the frequency order
(clusters only fill up), so it is applied after the rounds, to those words, in
order. It only happens when ``n_clusters * freq_budget < 1`` (small vocabularies).
"""
from __future__ import annotations

import torch
from torch import Tensor

from sohsm.clustering.assignments import GreedyResult, _check_greedy_args, best_clusters, tie_order

#: most ``q`` entries a round scores at once (its temporaries are a few times this many floats)
_CHUNK_ELEMENTS = 1 << 24


def _check(q: Tensor, tf: Tensor, max_size: int, freq_budget: float) -> tuple[Tensor, Tensor]:
    """Algorithm 1's argument checks, keeping q on its device."""
    return _check_greedy_args(q, tf, max_size, freq_budget, on_device=True)


@torch.no_grad()
def greedy_assignment_deferred(q: Tensor, tf: Tensor, max_size: int, freq_budget: float) -> GreedyResult:
    """Algorithm 1 by deferred acceptance, on ``q``'s device; same result as :func:`greedy_assignment`.

    Args:
        q: ``[N, n_clusters]`` cluster statistics (higher = better cluster for the word).
        tf: ``[N]`` relative term frequencies (or counts, scaled alike with ``freq_budget``).
        max_size: most words a cluster may hold.
        freq_budget: ``f_b``, the token mass above which a cluster takes no more words.

    Returns:
        :class:`~sohsm.clustering.GreedyResult` (the assignment on ``q``'s device).

    .. note::
        A cluster's mass is summed as a difference of prefix sums, Algorithm 1 one word at a
        time: the two can differ in the last bits, which changes the result only for a mass
        within a few ulps of ``freq_budget``.
    """
    q, tf = _check(q, tf, max_size, freq_budget)
    n_words, n_clusters = q.shape
    device = q.device
    order = torch.sort(tf, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n_words, device=device)
    assignment = torch.full((n_words,), -1, dtype=torch.long, device=device)
    # each word's last proposal, (score, place in its tie order): the next one is the best cluster after it
    last_score = torch.full((n_words,), float("inf"), device=device)
    last_tie = torch.full((n_words,), -1, dtype=torch.int32, device=device)
    # cutoff[c]: c refuses every word of this rank or more (it rejected that one); the extra slot: no cluster
    cutoff = torch.full((n_clusters + 1,), n_words, dtype=torch.long, device=device)
    exhausted = torch.zeros(n_words, dtype=torch.bool, device=device)
    held = torch.zeros(n_words, dtype=torch.bool, device=device)
    rows = max(1, _CHUNK_ELEMENTS // n_clusters)  # proposers' rows scored at once: bounded memory at large N
    rounds = 0
    while True:
        proposers = (~held & ~exhausted).nonzero().squeeze(1)
        if proposers.numel() == 0:
            break
        rounds += 1
        choice = torch.empty_like(proposers)
        left = torch.empty_like(proposers, dtype=torch.bool)
        for begin in range(0, proposers.numel(), rows):
            words = proposers[begin : begin + rows]
            scores = q[words]  # [P, C]
            ties = tie_order(rank[words], n_clusters)  # [P, C]
            if rounds == 1:  # every word proposes to its best cluster, none closed yet
                choice[begin : begin + rows] = best_clusters(scores, ties)
                left[begin : begin + rows] = True
                continue
            after = (scores < last_score[words, None]) | (
                (scores == last_score[words, None]) & (ties > last_tie[words, None]))
            after &= cutoff[None, :n_clusters] > rank[words, None]  # not known closed to the word
            choice[begin : begin + rows] = best_clusters(torch.where(after, scores, float("-inf")), ties)
            left[begin : begin + rows] = after.any(dim=1)
        exhausted[proposers] = ~left  # no cluster left: Algorithm 1's fallback, after the rounds
        last_score[proposers] = q[proposers, choice]
        last_tie[proposers] = (choice + n_clusters * (choice < rank[proposers].remainder(n_clusters))).int()  # tie key
        choice = torch.where(left, choice, n_clusters)  # the exhausted ones propose nowhere
        # every cluster: the words it holds and its new proposers, most frequent first
        holders = held.nonzero().squeeze(1)
        words = torch.cat([holders, proposers])
        clusters = torch.cat([assignment[holders], choice])
        by_cluster = torch.argsort(clusters * n_words + rank[words])
        words, clusters = words[by_cluster], clusters[by_cluster]
        start = torch.searchsorted(clusters, clusters)  # first candidate of each one's cluster
        position = torch.arange(words.numel(), device=device) - start
        mass = tf[words]
        prefix = mass.cumsum(0)
        before = prefix - mass - torch.where(start > 0, prefix[(start - 1).clamp(min=0)], torch.zeros_like(prefix))
        keep = (position < max_size) & (before < freq_budget) & (clusters < n_clusters)
        held[words] = keep
        assignment[words] = torch.where(keep, clusters, assignment[words])
        cutoff.scatter_reduce_(0, clusters, torch.where(keep, n_words, rank[words]), reduce="amin")
    fallback = exhausted.nonzero().squeeze(1)
    if fallback.numel():  # a suffix of the frequency order: the lightest cluster with room, one word at a time
        placed = order[~exhausted[order]]
        sizes = torch.bincount(assignment[placed], minlength=n_clusters)
        masses = torch.zeros(n_clusters, dtype=torch.float64, device=device).index_add_(
            0, assignment[placed], tf[placed])
        for w in fallback[torch.argsort(rank[fallback])].tolist():
            c = int(torch.where(sizes < max_size, masses, float("inf")).argmin())
            assignment[w] = c
            sizes[c] += 1
            masses[c] += tf[w]
    return GreedyResult(assignment, int(fallback.numel()), rounds)
