"""Models that produce hidden states for a head, never logits: the LSTM language model
(:mod:`~sohsm.models.lstm_lm`, sampling in :mod:`~sohsm.models.generate`) and the attention
encoder-decoder of headline generation (:mod:`~sohsm.models.seq2seq`, beam search in :mod:`~sohsm.models.beam`)."""
from sohsm.models.generate import generate
from sohsm.models.lstm_lm import LSTMLanguageModel, LSTMState, detach_state

__all__ = ["LSTMLanguageModel", "LSTMState", "detach_state", "generate"]
