"""Word embeddings with any head: word2vec's CBOW and skip-gram (``sohsm w2v``).

* :mod:`~sohsm.tasks.w2v.data`: vocabulary, sub-sampling, dynamic windows, batches;
* :mod:`~sohsm.tasks.w2v.model`: the input vectors and word2vec's SGD;
* :mod:`~sohsm.tasks.w2v.config` and :mod:`~sohsm.tasks.w2v.task`: the run, trained by :mod:`sohsm.train`;
* :mod:`~sohsm.tasks.w2v.vectors`: a run's vectors: export, neighbours, analogies, similarity.
"""
