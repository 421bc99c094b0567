"""Headline generation (the paper's second experiment): an attention encoder-decoder writes a title for an article.

* :mod:`~sohsm.tasks.s2s.config`: :class:`S2SConfig` (the paper's Gigaword setting) and its sections.
* :mod:`~sohsm.tasks.s2s.task`: :class:`S2STask`, the data side of the loop (shuffled padded batches), the
  model builder and the clusters taken from a language model.
* :mod:`~sohsm.tasks.s2s.decoding`: beam search on the head's exact top-k, sequence accuracy.
"""
from sohsm.tasks.s2s.config import S2S_RESUMABLE_FIELDS, S2SConfig, S2SDataConfig, S2SModelConfig
from sohsm.tasks.s2s.decoding import Decoded, decode, held_out_pairs, sequence_accuracy
from sohsm.tasks.s2s.task import S2STask, build_model_and_head, target_rows

__all__ = [
    "Decoded",
    "S2SConfig",
    "S2SDataConfig",
    "S2SModelConfig",
    "S2STask",
    "S2S_RESUMABLE_FIELDS",
    "build_model_and_head",
    "decode",
    "held_out_pairs",
    "sequence_accuracy",
    "target_rows",
]
