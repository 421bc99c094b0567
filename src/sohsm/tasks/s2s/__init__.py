"""Headline generation (the paper's second experiment): an attention encoder-decoder writes a title for an article.

* :mod:`~sohsm.tasks.s2s.config`: :class:`S2SConfig` (the paper's Gigaword setting) and its sections.
* :mod:`~sohsm.tasks.s2s.task`: :class:`S2STask`, the data side of the loop (shuffled padded batches), the
  model builder and the clusters taken from a language model.
* :mod:`~sohsm.tasks.s2s.decoding`: beam search on the head's exact top-k, sequence accuracy.
"""
from sohsm.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.tasks.s2s.config": ("S2S_RESUMABLE_FIELDS", "S2SConfig", "S2SDataConfig", "S2SModelConfig"),
    "sohsm.tasks.s2s.decoding": ("Decoded", "decode", "held_out_pairs", "sequence_accuracy"),
    "sohsm.tasks.s2s.task": ("S2STask", "build_model_and_head", "target_rows"),
})
