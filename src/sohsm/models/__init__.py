"""Models that produce hidden states for a head, never logits: the LSTM language model
(:mod:`~sohsm.models.lstm_lm`), the decoder-only transformer (:mod:`~sohsm.models.transformer_lm`),
sampling from either in :mod:`~sohsm.models.generation`, and the attention
encoder-decoder of headline generation (:mod:`~sohsm.models.seq2seq`, beam search in :mod:`~sohsm.models.beam`)."""
from sohsm.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.models.generation": ("generate",),
    "sohsm.models.lstm_lm": ("LSTMLanguageModel", "LSTMState", "detach_state"),
    "sohsm.models.transformer_lm": ("TransformerLM",),
})
