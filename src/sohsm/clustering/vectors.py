"""Clusters of words whose vectors point alike: the starting clusters of a two-level head that takes over a trained
output layer.

A pretrained output layer scores word ``w`` as ``u_w . h``. Words whose rows point the same way are scored alike in
every context, so a cluster of them has a log-sum-exp of its scores that a single cluster vector can follow: the
clusters the self-organized head's re-clustering would otherwise have to find by training. :func:`vector_assignment`
is spherical k-means on the rows, each assignment step being Algorithm 1 (:func:`greedy_assignment`) with the
cosine similarity to the centres as ``q``, so that the clusters keep Algorithm 1's bounds (at most ``max_size``
words, a cluster closed to new words once it holds ``freq_budget`` of the token mass).
"""
from __future__ import annotations

import torch
from torch import Tensor

from sohsm.clustering.assignments import greedy_assignment


def vector_assignment(vectors: Tensor, n_clusters: int, max_size: int, tf: Tensor | None = None,
                      freq_budget: float = 1.0, iterations: int = 10, seed: int = 0, normalize: bool = True) -> Tensor:
    """``[N]`` cluster ids: spherical k-means of ``vectors``' rows within Algorithm 1's bounds.

    Args:
        vectors: ``[N, d]`` word vectors (a trained output layer's rows).
        n_clusters: number of clusters ``C`` (``C * max_size >= N``).
        max_size: most words a cluster holds.
        tf: ``[N]`` term frequencies (the frequent words choose first, as in Algorithm 1); ``None``: all alike.
        freq_budget: token mass above which a cluster takes no more words.
        iterations: k-means rounds (assign, then each centre the normalised mean of its words).
        seed: which rows start as centres (a seeded draw).
        normalize: cluster the rows' directions (cosine similarity); ``False``: the rows themselves (squared
            Euclidean distance, centres the plain means).

    Raises:
        ValueError: ``vectors`` not ``[N, d]``, or the bounds leave some word no cluster.
    """
    if not isinstance(vectors, Tensor) or vectors.dim() != 2 or vectors.size(0) < 1:
        raise ValueError(f"vectors must be an [N, d] tensor of word vectors, got "
                         f"{tuple(vectors.shape) if isinstance(vectors, Tensor) else type(vectors).__name__}")
    n_words = vectors.size(0)
    if not 1 <= n_clusters <= n_words or n_clusters * max_size < n_words:
        raise ValueError(f"{n_clusters} clusters of at most {max_size} words cannot hold {n_words} words")
    x = vectors.detach().to("cpu", torch.float64)
    if normalize:
        x = torch.nn.functional.normalize(x, dim=1)
    tf = torch.full((n_words,), 1.0 / n_words, dtype=torch.float64) if tf is None else \
        torch.as_tensor(tf, dtype=torch.float64).reshape(-1).cpu()
    total = float(tf.sum())
    tf = tf / total if total > 0 else torch.full_like(tf, 1.0 / n_words)
    generator = torch.Generator().manual_seed(seed)
    centres = x[torch.randperm(n_words, generator=generator)[:n_clusters]]
    assignment = None
    for _ in range(max(1, int(iterations))):
        scores = x @ centres.T if normalize else 2 * x @ centres.T - (centres * centres).sum(1)
        new = greedy_assignment(scores, tf, max_size, freq_budget).assignment
        if assignment is not None and torch.equal(new, assignment):
            break
        assignment = new
        sums = torch.zeros_like(centres).index_add_(0, assignment, x)
        sizes = torch.bincount(assignment, minlength=n_clusters)
        means = sums / sizes.clamp_min(1)[:, None]
        means = torch.nn.functional.normalize(means, dim=1) if normalize else means
        centres = torch.where((sizes == 0)[:, None], centres, means)
    assert assignment is not None  # one iteration at least
    return assignment
