"""Word embeddings with any head: word2vec's CBOW and skip-gram (``sohsm w2v``).

* :mod:`~sohsm.tasks.w2v.data`: vocabulary, sub-sampling, dynamic windows, batches;
* :mod:`~sohsm.tasks.w2v.model`: the input vectors and word2vec's SGD;
* :mod:`~sohsm.tasks.w2v.config` and :mod:`~sohsm.tasks.w2v.task`: the run, trained by :mod:`sohsm.train`;
* :mod:`~sohsm.tasks.w2v.vectors`: a run's vectors: export, neighbours, analogies, similarity.
"""
from sohsm.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.tasks.w2v.config": ("W2VConfig", "W2VDataConfig", "W2VModelConfig"),
    "sohsm.tasks.w2v.task": ("W2VTask", "build_w2v_head"),
    "sohsm.tasks.w2v.vectors": ("WordVectors", "load_vectors", "load_w2v_run"),
})
