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
from sohsm.tasks.lm.config import LSTM_DEFAULTS, RESUMABLE_FIELDS, TRANSFORMER_DEFAULTS, DataConfig, LMConfig, ModelConfig
from sohsm.tasks.lm.evaluation import evaluate_stream, stream_hidden_states
from sohsm.tasks.lm.model import build_model, build_model_and_head, describe_model
from sohsm.tasks.lm.run import Generation, SplitEvalResult, evaluate_run, generate_text
from sohsm.tasks.lm.task import LMTask, check_vocabulary, load_lm_corpus, normalise_tokenizer, run_tokenizer
from sohsm.train.task import normalise_corpus

__all__ = [
    "DataConfig",
    "Generation",
    "LMConfig",
    "LMTask",
    "ModelConfig",
    "RESUMABLE_FIELDS",
    "SplitEvalResult",
    "LSTM_DEFAULTS",
    "TRANSFORMER_DEFAULTS",
    "build_model",
    "build_model_and_head",
    "check_vocabulary",
    "describe_model",
    "evaluate_run",
    "evaluate_stream",
    "generate_text",
    "load_lm_corpus",
    "normalise_corpus",
    "normalise_tokenizer",
    "run_tokenizer",
    "stream_hidden_states",
]
