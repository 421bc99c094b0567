"""What a word's vector becomes when Algorithm 1 moves it (the head's ``moved_vectors`` option).

``"keep"`` (the paper): a moved word keeps its vector and optimizer state, which
:meth:`TwoLevelSoftmax.set_assignment` moves with it. ``"cluster_mean"``: it takes
the mean vector and optimizer state of the words that stayed in its new cluster
(:func:`give_cluster_means`), so that it starts where its new neighbours are.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: the values of ``moved_vectors``
MOVED_VECTORS = ("keep", "cluster_mean")


@torch.no_grad()
def give_cluster_means(rows: list[tuple[list[Tensor], Tensor]], assignment: Tensor, moved: Tensor,
                       n_clusters: int) -> None:
    """Give each moved word the mean vector (and optimizer state) of the words that stayed in its new cluster.

    Args:
        rows: for each weight (one, or one per band with differentiated dimensions), its row-shaped tensors (the
            weight's data, its optimizer state) and ``[n]`` the word each row holds; the mean is over the stayers of
            the same weight, and a word with no such mate keeps its vector.
        assignment: ``[N]`` the new cluster of every word.
        moved: ``[N]`` bool, which words moved.
        n_clusters: ``C``.
    """
    for tensors, words in rows:
        _give_means(tensors, assignment[words], moved[words], n_clusters)


def _give_means(tensors: list[Tensor], cluster_of_row: Tensor, moved_row: Tensor, n_clusters: int) -> None:
    """Each moved row of ``tensors`` takes the mean of the rows that stayed in its cluster (none: it keeps its own)."""
    stay_rows = (~moved_row).nonzero().squeeze(1)
    stay_clusters = cluster_of_row[stay_rows]
    n_stay = torch.bincount(stay_clusters, minlength=n_clusters)
    moved_rows = moved_row.nonzero().squeeze(1)
    target = cluster_of_row[moved_rows]
    has_mates = n_stay[target] > 0
    moved_rows, target = moved_rows[has_mates], target[has_mates]
    for t in tensors:
        sums = t.new_zeros(n_clusters, t.size(1)).index_add_(0, stay_clusters, t[stay_rows])
        means = sums / n_stay.clamp(min=1).to(t.dtype)[:, None]
        t[moved_rows] = means[target]
