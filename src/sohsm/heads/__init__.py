"""Output layers. Every head implements :class:`Head`; importing each file here fills the registry."""
from sohsm.heads.adaptive import AdaptiveSoftmax
from sohsm.heads.base import (
    ClusteredHead,
    ClusterScores,
    Head,
    HeadInputError,
    HeadMemory,
    HeadOutput,
    HierarchicalHead,
    SelfOrganizingHead,
)
from sohsm.heads.binary_tree import BinaryTreeSoftmax, TreeTopK
from sohsm.heads.dsoftmax import DifferentiatedSoftmax
from sohsm.heads.full import FullSoftmax
from sohsm.heads.nary_tree import NodeTopK, TreeSoftmax
from sohsm.heads.pairs import BinaryPairs, binary_pairs
from sohsm.heads.registry import (
    HeadDefaults,
    HeadOption,
    HeadSetting,
    build_head,
    check_head_options,
    head_names,
    head_options,
    hierarchy_options,
    learns_clusters,
    legacy_options,
    memory_estimate,
    preset,
    register_head,
    resume_refusal,
    setting_defaults,
    takes_tree,
    tree_heads,
    tying_refusal,
    update_every_for,
    with_seed,
)
from sohsm.heads.sampled import ImportanceSamplingSoftmax, NCESoftmax, PMISoftmax, SampledSoftmax
from sohsm.heads.spec import HeadSpec
from sohsm.heads.two_level.best_first import TopKResult
from sohsm.heads.two_level.self_organizing.reclustering import Reclustering
from sohsm.heads.two_level.self_organizing.self_organized import SelfOrganizedSoftmax
from sohsm.heads.two_level.softmax import TwoLevelSoftmax

__all__ = [
    "AdaptiveSoftmax",
    "BinaryPairs",
    "BinaryTreeSoftmax",
    "ClusterScores",
    "ClusteredHead",
    "DifferentiatedSoftmax",
    "FullSoftmax",
    "Head",
    "HeadDefaults",
    "HeadInputError",
    "HeadMemory",
    "HeadOption",
    "HeadOutput",
    "HeadSetting",
    "HeadSpec",
    "HierarchicalHead",
    "ImportanceSamplingSoftmax",
    "NCESoftmax",
    "NodeTopK",
    "PMISoftmax",
    "Reclustering",
    "SampledSoftmax",
    "SelfOrganizedSoftmax",
    "SelfOrganizingHead",
    "TopKResult",
    "TreeSoftmax",
    "TreeTopK",
    "TwoLevelSoftmax",
    "binary_pairs",
    "build_head",
    "check_head_options",
    "head_names",
    "head_options",
    "hierarchy_options",
    "learns_clusters",
    "legacy_options",
    "memory_estimate",
    "preset",
    "register_head",
    "resume_refusal",
    "setting_defaults",
    "takes_tree",
    "tree_heads",
    "tying_refusal",
    "update_every_for",
    "with_seed",
]
