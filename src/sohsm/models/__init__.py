"""Models that produce hidden states for a head: the LSTM language model, and decoding with it."""
from sohsm.models.generate import generate
from sohsm.models.lstm_lm import LSTMLanguageModel, LSTMState, detach_state

__all__ = ["LSTMLanguageModel", "LSTMState", "detach_state", "generate"]
