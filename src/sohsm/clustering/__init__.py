"""Pure functions that build word-to-cluster assignments (a ``[N]`` long tensor of cluster ids)."""
from sohsm.clustering.assignments import (
    GreedyResult,
    check_assignment,
    default_max_cluster_size,
    default_n_clusters,
    frequency_binning,
    greedy_assignment,
    greedy_assignment_reference,
    random_assignment,
)

__all__ = [
    "GreedyResult",
    "check_assignment",
    "default_max_cluster_size",
    "default_n_clusters",
    "frequency_binning",
    "greedy_assignment",
    "greedy_assignment_reference",
    "random_assignment",
]
