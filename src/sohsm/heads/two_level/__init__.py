"""The two-level family: a softmax over clusters, then over the words of the target's cluster.

* :mod:`~sohsm.heads.two_level.softmax`: :class:`TwoLevelSoftmax`, the module (fixed clusters):
  its parameters, the rows of its word vectors grouped by cluster; its parts mixed in beside it
  (:mod:`~sohsm.heads.two_level.scoring`, :mod:`~sohsm.heads.two_level.moves`,
  :mod:`~sohsm.heads.two_level.backend_choice`, :mod:`~sohsm.heads.two_level.tied_words`);
* :mod:`~sohsm.heads.two_level.ops`: its computation over explicit tensors: the cluster
  log-softmax, the in-cluster backends and the one registry that says which runs where;
* :mod:`~sohsm.heads.two_level.best_first` and :mod:`~sohsm.heads.two_level.ops.topk`: exact top-k;
* :mod:`~sohsm.heads.two_level.word_bands`: differentiated dimensions (``div_value``);
* :mod:`~sohsm.heads.two_level.run_defaults`: what the family knows of its runs (the registry's hooks);
* :mod:`~sohsm.heads.two_level.self_organizing`: :class:`SelfOrganizedSoftmax` and the machinery
  that re-learns the clusters (statistics, schedule, freezing, moved words, several processes).
"""
from sohsm.heads.two_level.best_first import TopKResult
from sohsm.heads.two_level.self_organizing import SelfOrganizedSoftmax
from sohsm.heads.two_level.softmax import TwoLevelSoftmax

__all__ = ["SelfOrganizedSoftmax", "TopKResult", "TwoLevelSoftmax"]
