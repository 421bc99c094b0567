"""Output layers. Every head implements :class:`Head`; this file imports each one so the registry is complete."""
from sohsm.heads.base import ClusterScores, Head, HeadOutput
from sohsm.heads.registry import build_head, head_names, register_head

try:  # being written
    from sohsm.heads.full import FullSoftmax
    from sohsm.heads.two_level import TwoLevelSoftmax
    from sohsm.heads.self_organized import SelfOrganizedSoftmax
except ImportError:  # pragma: no cover
    FullSoftmax = TwoLevelSoftmax = SelfOrganizedSoftmax = None
