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
    """Give each moved word the mean vector (and optimizer state) of the words that stayed in its new cluster."""
    layout = head._layout
    stay_slots = layout.slot_of_word[~moved]
    stay_clusters = head.assignment[~moved]
    tensors = [head.weight.data, *head._optimizer_state(head.weight, optimizer, rows=True)]
    n_stay = torch.bincount(stay_clusters, minlength=head.n_clusters).to(head.weight.dtype)
    moved_words = moved.nonzero().squeeze(1)
    target_clusters = head.assignment[moved_words]
    has_mates = n_stay[target_clusters] > 0
    moved_words, target_clusters = moved_words[has_mates], target_clusters[has_mates]
    slots = layout.slot_of_word[moved_words]
    for t in tensors:
        sums = t.new_zeros(head.n_clusters, t.size(1)).index_add_(0, stay_clusters, t[stay_slots])
        means = sums / n_stay.clamp(min=1)[:, None]
        t[slots] = means[target_clusters]
