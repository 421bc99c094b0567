"""The language model of a run: the LSTM or the transformer, and its head, built from the run's config."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.models.transformer_lm import TransformerLM
from sohsm.tasks.heads import build_run_head
from sohsm.tasks.lm.config import LMConfig, ModelConfig


def build_model(m: ModelConfig, n_words: int, context: int) -> LSTMLanguageModel | TransformerLM:
    """The model of a ``model`` section over ``n_words`` words; ``context``: a transformer's longest window (bptt)."""
    if m.architecture == "transformer":
        return TransformerLM(n_words, hidden_size=m.hidden_size, layers=m.layers, attention_heads=m.attention_heads,
                             context=context, dropout=m.dropout, positions=m.positions)
    return LSTMLanguageModel(n_words, emb_size=m.emb_size, hidden_size=m.hidden_size, layers=m.layers,
                             dropout=m.dropout, init_range=m.init_range)


def build_model_and_head(config: LMConfig, vocab: Vocabulary, device: torch.device | str = "cpu", *,
                         clusters: Tensor | None = None, tree: list | None = None) -> tuple[nn.Module, Head]:
    """The model (``config.model.architecture``) and the head of a run, initialised from ``config.seed`` and
    moved to ``device``.

    Seeds torch's global generator with ``config.seed`` first, so the initial
    weights, and the dropout masks drawn afterwards, follow from the seed.
    ``clusters`` and ``tree``: a hierarchy the head takes (:func:`~sohsm.tasks.heads.build_run_head`).
    """
    torch.manual_seed(config.seed)
    model = build_model(config.model, len(vocab), config.bptt)
    head = build_run_head(config, vocab, clusters=clusters, tree=tree)
    if config.model.tie_weights:
        model.tie_weights(head)
    return model.to(device), head.to(device)


def describe_model(m: ModelConfig, bptt: int) -> str:
    """The model in a few words: ``LSTM 1×512/512`` or ``transformer 4×256, 4 heads, learned positions, context 128``.

    >>> describe_model(ModelConfig(), 20)
    'LSTM 1×512/512'
    """
    if m.architecture == "transformer":
        return (f"transformer {m.layers}×{m.hidden_size}, {m.attention_heads} heads, {m.positions} positions, "
                f"context {bptt}")
    return f"LSTM {m.layers}×{m.emb_size}/{m.hidden_size}"
