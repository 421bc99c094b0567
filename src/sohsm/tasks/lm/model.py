"""The language model of a run: the LSTM and its head, built from the run's config."""
from __future__ import annotations

import torch
from torch import Tensor

from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.tasks.heads import build_run_head
from sohsm.tasks.lm.config import LMConfig


def build_model_and_head(config: LMConfig, vocab: Vocabulary, device: torch.device | str = "cpu", *,
                         clusters: Tensor | None = None, tree: list | None = None) -> tuple[LSTMLanguageModel, Head]:
    """The LSTM and the head of a run, initialised from ``config.seed`` and moved to ``device``.

    Seeds torch's global generator with ``config.seed`` first, so the initial
    weights, and the dropout masks drawn afterwards, follow from the seed.
    ``clusters`` and ``tree``: a hierarchy the head takes (:func:`~sohsm.tasks.heads.build_run_head`).
    """
    torch.manual_seed(config.seed)
    m = config.model
    model = LSTMLanguageModel(len(vocab), emb_size=m.emb_size, hidden_size=m.hidden_size, layers=m.layers,
                              dropout=m.dropout)
    head = build_run_head(config, vocab, clusters=clusters, tree=tree)
    if m.tie_weights:
        model.tie_weights(head)
    return model.to(device), head.to(device)
