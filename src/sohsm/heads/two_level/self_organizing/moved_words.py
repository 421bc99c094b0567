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
def give_cluster_means(head, moved: Tensor, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Give each moved word the mean vector (and optimizer state) of the words that stayed in its new cluster.

    With differentiated dimensions (``div_value``) the mean is over the stayers of the word's own band, the rows
    of the same band's weight; a word with no such mate keeps its vector.
    """
    if head.band_projections is not None:
        bands = head._band_rows()
        for b, weight in enumerate(head.band_weights):  # a band's words: the rows of its own weight
            words = head._layout.word_of_slot[bands.slots[b]]
            _give_means([weight.data, *head._optimizer_state(weight, optimizer, rows=True)],
                        head.assignment[words], moved[words], head.n_clusters)
        return
    layout = head._layout
    _give_means([head.weight.data, *head._optimizer_state(head.weight, optimizer, rows=True)],
                head.assignment[layout.word_of_slot], moved[layout.word_of_slot], head.n_clusters)


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
