"""The self-organized head and what re-learns its clusters, one idea a file (see :mod:`.self_organized`)."""
from sohsm.heads.two_level.self_organizing.reclustering import Reclustering
from sohsm.heads.two_level.self_organizing.self_organized import SelfOrganizedSoftmax

__all__ = ["Reclustering", "SelfOrganizedSoftmax"]
