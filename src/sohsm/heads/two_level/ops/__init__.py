"""The two-level head's computation over explicit tensors: stateless functions and autograd Functions.

Nothing here holds state or sees the head: the head (:class:`~sohsm.heads.TwoLevelSoftmax`) owns the
parameters, the cluster layout and the gradient buffer, and passes them in. One file an idea:

* :mod:`.layout`: :class:`ClusterLayout`, where each word's row of the weight sits (rows grouped by cluster);
* :mod:`.log_prob`: the cluster log-softmax (written once), a training step's two parts, exact ``log_prob``;
* :mod:`.backends`: the one table of in-cluster backends, the devices each serves, where each is the default;
* :mod:`.gradient_sink`: where a backend that writes the weight's gradient itself puts it;
* the backends' ops: :mod:`.per_cluster`, :mod:`.grouped` (with :mod:`.tiles` and :mod:`.triton_kernels`);
* :mod:`.topk`: top-k with static shapes and a certificate (the sync-free backends' ``topk``).

Which backend runs is the head's ``backend`` option, read through :func:`.backends.select_backend`:

==================  ==========================================  =============================================
``backend``         runs                                        reads back
==================  ==========================================  =============================================
``"per_cluster"``   :mod:`.per_cluster`: one product per        the row count of every cluster in the batch
                    cluster the batch holds, a hand-written     (one ``tolist`` a step)
                    backward into a reused gradient buffer
``"triton"``        :mod:`.grouped` + :mod:`.triton_kernels`:   nothing (static shapes; traces whole under
                    rows sorted into tiles of one cluster       ``torch.compile(fullgraph=True)``)
                    (:mod:`.tiles`), one kernel launch forward,
                    two backward
``"grouped_torch"`` :mod:`.grouped`: the same tiles by batched  nothing (it gathers every tile's word vectors:
                    torch products, autograd backward           small sizes, tests, the CPU proof)
``"auto"``          ``"triton"`` on CUDA where its kernels run (tried once per device and dtype), else
                    ``"per_cluster"``, with one warning saying why where CUDA cannot run Triton
==================  ==========================================  =============================================

The device top-k (:mod:`.topk`) scores its candidate clusters with the same tiles.
"""
from sohsm.heads.two_level.ops.backends import BACKENDS, BackendInfo, check_backend, select_backend
from sohsm.heads.two_level.ops.gradient_sink import GradientSink
from sohsm.heads.two_level.ops.layout import ClusterLayout, move_rows
from sohsm.heads.two_level.ops.log_prob import TwoLevelLogProb, cluster_log_softmax, scored_log_prob, two_level_log_prob

__all__ = ["BACKENDS", "BackendInfo", "ClusterLayout", "GradientSink", "TwoLevelLogProb", "check_backend",
           "cluster_log_softmax", "move_rows", "scored_log_prob", "select_backend", "two_level_log_prob"]
