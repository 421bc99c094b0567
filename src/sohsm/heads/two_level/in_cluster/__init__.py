"""The in-cluster softmax of a two-level head's training step: ``log P(w | h, C(w))`` for each row.

Which path runs is the head's ``backend`` (:func:`~sohsm.heads.two_level.in_cluster.grouped.choose_backend`):

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

The device top-k (:mod:`sohsm.heads.two_level.device_topk`) scores its candidate clusters with the
same tiles.
"""
