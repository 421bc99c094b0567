"""Language modelling: an LSTM (truncated BPTT) or a transformer reads running text in windows; the head predicts
the next word.

* :mod:`~sohsm.tasks.lm.config`: :class:`LMConfig` (the paper's text8 setting) and its sections.
* :mod:`~sohsm.tasks.lm.task`: :class:`LMTask`, the data side of the loop (batches, shards, positions).
* :mod:`~sohsm.tasks.lm.model`: :func:`build_model_and_head` (the LSTM or the transformer), :func:`describe_model`.
* :mod:`~sohsm.tasks.lm.preflight`: the checks made before a run directory is written.
* :mod:`~sohsm.tasks.lm.evaluation`: :func:`evaluate_stream` (ppl, cluster ppl, in-cluster ppl of a token stream).
* :mod:`~sohsm.tasks.lm.run`: :func:`evaluate_run` (per token, per word, bits per byte), :func:`generate_text` (a
  finished run).
* :mod:`~sohsm.tasks.lm.context`: the Mnih-Hinton bootstrapped tree from a run's context vectors.
"""
from sohsm.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.tasks.lm.config": ("LSTM_DEFAULTS", "RESUMABLE_FIELDS", "TRANSFORMER_DEFAULTS", "DataConfig", "LMConfig",
                              "ModelConfig"),
    "sohsm.tasks.lm.evaluation": ("evaluate_stream", "stream_hidden_states"),
    "sohsm.tasks.lm.model": ("build_model", "build_model_and_head", "describe_model"),
    "sohsm.tasks.lm.run": ("Generation", "SplitEvalResult", "evaluate_run", "generate_text"),
    "sohsm.tasks.lm.task": ("LMTask", "check_vocabulary", "load_lm_corpus", "normalise_tokenizer", "run_tokenizer"),
    "sohsm.train.task": ("normalise_corpus",),
})
