"""Algorithm 1 on the device, by deferred acceptance: no loop over the words on the host.

Algorithm 1 (:func:`sohsm.clustering.greedy_assignment`) is a serial dictatorship:
the words, most frequent first, each take their best cluster that is still open
(fewer than ``max_size`` words, token mass below ``freq_budget``). Every cluster
ranks the words the same way (by frequency), and each cluster's acceptance rule is
a *prefix* rule: among the words that want it, it takes the most frequent ones for
as long as it stays open. With one common ranking, deferred acceptance (Gale and
Shapley) then ends in the serial dictatorship's assignment:

* every round, each word without a cluster proposes to its next cluster (best
  ``q`` first, ties to the lower id);
* every cluster keeps the longest prefix, by frequency, of the words it holds and
  the new proposers that keeps it open; the others are rejected and propose again.

A word is only ever displaced by more frequent words, so by induction on the
frequency order each word ends in the first cluster of its list that the more
frequent words leave open: Algorithm 1's choice. A round is a few tensor
operations over all words at once; rounds run until no word is left to propose
(one read-back per round, far fewer rounds than words).

The fallback of Algorithm 1 (a word that no cluster can take under both rules goes
to the lightest cluster with room) concerns a *suffix* of the frequency order
(clusters only fill up), so it is applied after the rounds, to those words, in
order. It only happens when ``n_clusters * freq_budget < 1`` (small vocabularies).
"""
from __future__ import annotations

import torch
from torch import Tensor

from sohsm.clustering.assignments import GreedyResult, _check_greedy_args


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
    cluster_ids = torch.arange(n_clusters, device=device)
    assignment = torch.full((n_words,), -1, dtype=torch.long, device=device)
    # each word's last proposal, (score, cluster): the next one is the best cluster after it in (-q, id) order
    last_score = torch.full((n_words,), float("inf"), device=device)
    last_cluster = torch.full((n_words,), -1, dtype=torch.long, device=device)
    exhausted = torch.zeros(n_words, dtype=torch.bool, device=device)
    held = torch.zeros(n_words, dtype=torch.bool, device=device)
    while True:
        proposers = (~held & ~exhausted).nonzero().squeeze(1)
        if proposers.numel() == 0:
            break
        scores = q[proposers]  # [P, C]
        after = (scores < last_score[proposers, None]) | (
            (scores == last_score[proposers, None]) & (cluster_ids > last_cluster[proposers, None]))
        choice = torch.where(after, scores, float("-inf")).argmax(dim=1)  # ties: the lower id
        left = after.any(dim=1)
        exhausted[proposers[~left]] = True
        proposers, choice = proposers[left], choice[left]
        last_score[proposers] = q[proposers, choice]
        last_cluster[proposers] = choice
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
        keep = (position < max_size) & (before < freq_budget)
        held.zero_()
        held[words[keep]] = True
        assignment[words[keep]] = clusters[keep]
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
    return GreedyResult(assignment, int(fallback.numel()))
