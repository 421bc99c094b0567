"""Models that produce hidden states for a head, never logits: the LSTM language model
(:mod:`~sohsm.models.lstm_lm`), the decoder-only transformer (:mod:`~sohsm.models.transformer_lm`),
sampling from either in :mod:`~sohsm.models.generate`, and the attention
encoder-decoder of headline generation (:mod:`~sohsm.models.seq2seq`, beam search in :mod:`~sohsm.models.beam`)."""
from sohsm.models.generate import generate
from sohsm.models.lstm_lm import LSTMLanguageModel, LSTMState, detach_state
from sohsm.models.transformer_lm import TransformerLM

__all__ = ["LSTMLanguageModel", "LSTMState", "TransformerLM", "detach_state", "generate"]
