"""Pure functions that build word structures: assignments (a ``[N]`` long tensor of cluster ids) and trees."""
from sohsm.clustering.assignments import (
    GreedyResult,
    check_assignment,
    default_max_cluster_size,
    default_n_clusters,
    frequency_binning,
    greedy_assignment,
    greedy_assignment_reference,
    initial_assignment,
    random_assignment,
)
from sohsm.clustering.bootstrap_tree import bootstrap_tree
from sohsm.clustering.trees import TreePaths, check_tree, huffman_tree, load_tree, random_tree, save_tree, tree_paths
from sohsm.clustering.vectors import vector_assignment

__all__ = [
    "GreedyResult",
    "TreePaths",
    "bootstrap_tree",
    "check_assignment",
    "check_tree",
    "default_max_cluster_size",
    "default_n_clusters",
    "frequency_binning",
    "greedy_assignment",
    "greedy_assignment_reference",
    "huffman_tree",
    "initial_assignment",
    "load_tree",
    "random_assignment",
    "random_tree",
    "save_tree",
    "tree_paths",
    "vector_assignment",
]
