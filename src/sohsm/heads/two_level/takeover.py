"""A two-level head taking over a trained output layer ``W`` (``[N, d]``, logits ``W h``), keeping what it learned.

* word vectors: word ``w``'s in-cluster vector is ``W[w]``, so the softmax inside a cluster is the trained layer's
  softmax restricted to the cluster, exactly. Where a word has fewer dimensions (``div_value``'s bands,
  ``word_dim``) its band's rows take the best rank-``d_i`` fit of the *scores* (:func:`low_rank_fit`): the band's
  projection and vectors are chosen so that ``P_i^T u_w . h`` is as close to ``W[w] . h`` as the rank allows over
  the hidden states seen (their second moment), not merely the closest vectors;
* clusters: words the layer scores alike go together (:func:`~sohsm.clustering.vector_assignment`, within
  Algorithm 1's bounds), the shortlist of the self-organized head kept as it is;
* cluster vectors: each cluster's token-weighted mean word vector, a start for the fit to the trained layer's
  distribution (:mod:`sohsm.hf.fitting`), which alone can give each cluster its log-sum-exp.

:func:`keep_output_layer` does all three and returns what it could not keep, one line each (Eq. 1's ReLU
projection scores words in a space the layer never had: nothing of it is kept).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from sohsm.clustering import default_max_cluster_size, greedy_assignment, vector_assignment

#: Algorithm 1's defaults (``Reclustering``'s), the bounds of the starting clusters of a head without its own
GAMMA, FREQ_BUDGET = 1.5, 0.1


def low_rank_fit(weight: Tensor, rank: int, second_moment: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(vectors [n, rank], projection [rank, d])`` with ``vectors @ projection @ h`` closest to ``weight @ h``.

    Closest in mean square over hidden states of second moment ``S = E[h h^T]`` (``None``: the identity, the
    plain truncated SVD of ``weight``): the SVD of ``weight S^(1/2)`` truncated to ``rank``, mapped back by
    ``S^(-1/2)`` (Eckart-Young in the metric of the data). Computed in float64.
    """
    w = weight.detach().to(torch.float64)
    n, d = w.shape
    rank = min(int(rank), n, d)
    if second_moment is None:
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        return (u[:, :rank] * s[:rank]).to(weight.dtype), vh[:rank].to(weight.dtype)
    moment = second_moment.detach().to(torch.float64)
    moment = moment + 1e-6 * (moment.diagonal().mean().clamp_min(1e-12)) * torch.eye(d, dtype=torch.float64)
    values, basis = torch.linalg.eigh(moment)
    values = values.clamp_min(1e-12)
    root, inverse_root = (basis * values.sqrt()) @ basis.T, (basis / values.sqrt()) @ basis.T
    u, s, vh = torch.linalg.svd(w @ root, full_matrices=False)
    return (u[:, :rank] * s[:rank]).to(weight.dtype), (vh[:rank] @ inverse_root).to(weight.dtype)


def _bounds(head, n_words: int, n_clusters: int) -> tuple[int, float]:
    """``(max_size, freq_budget)`` of ``head``'s clusters: its own re-clustering's, else Algorithm 1's defaults (and
    never too few places for the words)."""
    reclustering = getattr(head, "reclustering", None)
    gamma = GAMMA if reclustering is None else reclustering.gamma
    budget = FREQ_BUDGET if reclustering is None else reclustering.freq_budget
    max_size = getattr(head, "max_cluster_size", None) or default_max_cluster_size(head.n_classes, gamma)
    return max(max_size, math.ceil(n_words / n_clusters)), budget


def reassigned(head, q: Tensor, tf: Tensor) -> Tensor:
    """``[N]`` Algorithm 1's clusters from ``q`` (``[N, C]``, higher: a better cluster for the word) and the words'
    token mass ``tf``, in ``head``'s bounds; a self-organized head's shortlist stays where it is."""
    shortlist = int(getattr(head, "shortlist", 0) or 0)
    if not shortlist:
        max_size, budget = _bounds(head, head.n_classes, head.n_clusters)
        return greedy_assignment(q, tf, max_size, budget).assignment
    tail = head.tail_words.cpu()
    max_size, budget = _bounds(head, tail.numel(), head.n_clusters - shortlist)
    assignment = head.assignment.detach().cpu().clone()
    assignment[tail] = greedy_assignment(q[tail][:, shortlist:], tf[tail], max_size, budget).assignment + shortlist
    return assignment


def starting_clusters(head, weight: Tensor, counts: Tensor | None, seed: int = 0) -> Tensor:
    """``[N]`` the clusters ``head`` starts from: words whose rows of ``weight`` point alike share one.

    A self-organized head keeps its shortlist (each word its own cluster) and bounds the rest by its own
    ``gamma`` and ``freq_budget``; a head without re-clustering by Algorithm 1's defaults.
    """
    tf = None if counts is None else counts.to("cpu", torch.float64)
    shortlist = int(getattr(head, "shortlist", 0) or 0)
    if not shortlist:
        max_size, budget = _bounds(head, head.n_classes, head.n_clusters)
        return vector_assignment(weight, head.n_clusters, max_size, tf, budget, seed=seed)
    tail = head.tail_words.cpu()
    assignment = head.assignment.detach().cpu().clone()
    learned = head.n_clusters - shortlist
    max_size, budget = _bounds(head, tail.numel(), learned)
    tail_tf = None if tf is None else tf[tail]
    assignment[tail] = vector_assignment(weight[tail], learned, max_size, tail_tf, budget, seed=seed) + shortlist
    return assignment


@torch.no_grad()
def keep_output_layer(head, weight: Tensor, counts: Tensor | None = None, second_moment: Tensor | None = None,
                      seed: int = 0) -> list[str]:
    """Give the two-level ``head`` the trained layer ``weight`` (``[N, d]``): its words' vectors, starting clusters
    from them and cluster vectors from their means (the module's docstring); returns what could not be kept.

    Args:
        head: a :class:`~sohsm.heads.TwoLevelSoftmax` (or the self-organized head) of ``N`` words and width ``d``.
        weight: the trained layer's ``[N, d]`` weight (a row per word).
        counts: ``[N]`` token counts: the frequent words choose their clusters first; ``None``: all alike.
        second_moment: ``[d, d]`` ``E[h h^T]`` of the hidden states the head will see, the metric of the banded
            rows' fit (``None``: the identity).
    """
    weight = weight.detach()
    if tuple(weight.shape) != (head.n_classes, head.in_features):
        raise ValueError(f"the trained layer is {tuple(weight.shape)} but the head scores {head.n_classes} words "
                         f"from {head.in_features} features")
    if head.projection is not None:
        return ["projection=True scores words after Eq. 1's ReLU projection, which the trained layer never had: "
                "its word vectors, clusters and cluster vectors start from the head's own initialisation"]
    lost = []
    head.set_assignment(starting_clusters(head, weight, counts, seed).to(head.assignment.device))
    layout = head._layout
    words = head.words
    target = words.weights[0]
    if head.word_projection is not None:  # every word in word_dim dimensions: one rank-word_dim fit
        vectors, projection = low_rank_fit(weight, head.word_dim, second_moment)
        head.word_projection.weight.copy_(projection.to(head.word_projection.weight))
        target[layout.slot_of_word] = vectors.to(target)
        lost.append(f"word_dim={head.word_dim}: the words are scored by the best rank-{head.word_dim} fit of the "
                    f"trained layer's scores (of rank up to {head.in_features})")
    elif head.band_projections is None:
        head.set_word_vectors(weight.to(target))
    else:  # band b's rows in slot order; band 0 keeps all d entries, the others the best fit of their rank
        bands = words.band_rows(layout)
        for b, (band_weight, slots) in enumerate(zip(words.weights, bands.slots)):
            members = layout.word_of_slot[slots]
            if b == 0:
                band_weight.copy_(weight[members].to(band_weight))
                continue
            vectors, projection = low_rank_fit(weight[members], band_weight.size(1), second_moment)
            band_weight.copy_(vectors.to(band_weight))
            head.band_projections[b - 1].weight.copy_(projection.to(head.band_projections[b - 1].weight))
        dims = ", ".join(f"{int(n)} words in {dim}" for n, dim in zip(bands.sizes[1:], head.band_dims[1:]))
        lost.append(f"div_value: rarer words are scored by the best low-rank fit of the trained layer's scores "
                    f"({dims} dimensions of {head.in_features})")
    # each cluster's vector: its words' mean, weighted by their counts (a start; the fit gives each its log-sum-exp)
    mass = torch.ones(head.n_classes, dtype=torch.float64) if counts is None else \
        counts.detach().to("cpu", torch.float64) + 1.0
    assignment = head.assignment.cpu()
    sums = torch.zeros(head.n_clusters, head.in_features, dtype=torch.float64)
    sums.index_add_(0, assignment, weight.cpu().double() * mass[:, None])
    totals = torch.zeros(head.n_clusters, dtype=torch.float64).index_add_(0, assignment, mass)
    means = sums / totals.clamp_min(1e-12)[:, None]
    head.cluster_weight.copy_(means.to(head.cluster_weight))
    if head.cluster_bias is not None:  # log-sum-exp of n alike scores: their mean's score + log n
        sizes = torch.bincount(assignment, minlength=head.n_clusters).clamp_min(1)
        head.cluster_bias.copy_(sizes.double().log().to(head.cluster_bias))
    return lost
