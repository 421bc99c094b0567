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

    With differentiated dimensions (``div_value``) the mean is over the stayers of the word's own band, whose
    vectors live in the same block; a word with no such mate keeps its vector.
    """
    layout = head._layout
    group = head.assignment  # the words whose vectors may be averaged together
    n_groups = head.n_clusters
    if head.band_projections is not None:
        n_bands = len(head.band_dims)
        group, n_groups = group * n_bands + head.band_of_word, n_groups * n_bands
    stay_slots = layout.slot_of_word[~moved]
    stay_groups = group[~moved]
    tensors = [head.weight.data, *head._optimizer_state(head.weight, optimizer, rows=True)]
    n_stay = torch.bincount(stay_groups, minlength=n_groups).to(head.weight.dtype)
    moved_words = moved.nonzero().squeeze(1)
    target_groups = group[moved_words]
    has_mates = n_stay[target_groups] > 0
    moved_words, target_groups = moved_words[has_mates], target_groups[has_mates]
    slots = layout.slot_of_word[moved_words]
    for t in tensors:
        sums = t.new_zeros(n_groups, t.size(1)).index_add_(0, stay_groups, t[stay_slots])
        means = sums / n_stay.clamp(min=1)[:, None]
        t[slots] = means[target_groups]
