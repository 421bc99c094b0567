"""Perplexity, cluster perplexity and in-cluster perplexity of a model and head on a token stream.

    ppl            = exp( -(1/M) sum_t log P(w_t | w_<t) )
    ppl_cluster    = exp( -(1/M) sum_t log P(C(w_t) | w_<t) )          (paper Eq. 5)
    ppl_in_cluster = exp( -(1/M) sum_t log P(w_t | w_<t, C(w_t)) )     (paper Eq. 6)

The paper writes them with base-2 logarithms and powers of 2; the value is the
same. ``ppl == ppl_cluster * ppl_in_cluster`` up to rounding. Heads without
clusters (``head.score_parts`` returns ``None``) report ``None`` for both parts.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from sohsm.data.batching import batchify, bptt_batches
from sohsm.heads.base import Head
from sohsm.models.lstm_lm import LSTMLanguageModel


@dataclass(frozen=True)
class EvalResult:
    """Scores of one evaluation pass.

    Attributes:
        nll_nats: mean negative log-likelihood per token (nats).
        ppl: ``exp(nll_nats)``.
        ppl_cluster: cluster perplexity (Eq. 5), ``None`` for heads without clusters.
        ppl_in_cluster: in-cluster perplexity (Eq. 6), ``None`` for heads without clusters.
        tokens: number of predicted tokens ``M``.
        seconds: wall time of the pass.
        tokens_per_s: ``tokens / seconds``.
    """

    nll_nats: float
    ppl: float
    ppl_cluster: float | None
    ppl_in_cluster: float | None
    tokens: int
    seconds: float
    tokens_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


@torch.no_grad()
def evaluate(model: LSTMLanguageModel, head: Head, ids: Tensor, batch_size: int = 32, bptt: int = 20) -> EvalResult:
    """Score every token of ``ids`` (after the first of each column) with ``model`` and ``head``.

    The stream is laid out in ``batch_size`` columns (:func:`sohsm.data.batchify`;
    at most ``batch_size - 1`` trailing tokens are dropped) and read in windows of
    ``bptt`` rows with the LSTM state carried across windows. Losses are summed
    on the device and read once at the end.

    Args:
        model: makes the hidden states.
        head: scores them.
        ids: 1-D token ids (a corpus split).
        batch_size: columns.
        bptt: rows per window (does not change the result, only memory and speed).

    Returns:
        :class:`EvalResult`.

    Raises:
        ValueError: ``ids`` is too short for ``batch_size`` columns of two tokens.
    """
    device = next(model.parameters()).device
    if ids.dim() != 1 or ids.numel() < 2 * batch_size:
        raise ValueError(f"cannot evaluate {ids.numel()} tokens in {batch_size} columns: "
                         "need at least two tokens per column")
    data = batchify(ids, batch_size, device)  # [T, B]
    was_training = model.training, head.training
    model.eval()
    head.eval()
    start = time.perf_counter()
    try:
        total = torch.zeros(3, dtype=torch.float64, device=device)  # sum log P, sum cluster, sum in-cluster
        has_parts = True
        tokens = 0
        state = None
        for inputs, targets in bptt_batches(data, bptt):
            hidden, state = model(inputs, state)  # [t, B, d]
            hidden = hidden.reshape(-1, hidden.size(-1))  # [t*B, d]
            targets = targets.reshape(-1)
            parts = head.score_parts(hidden, targets) if has_parts else None
            if parts is None:
                has_parts = False
                total[0] += head(hidden, targets).output.sum(dtype=torch.float64)
            else:
                cluster = parts.cluster.sum(dtype=torch.float64)
                in_cluster = parts.in_cluster.sum(dtype=torch.float64)
                total[0] += cluster + in_cluster
                total[1] += cluster
                total[2] += in_cluster
            tokens += targets.numel()
        sums = total.tolist()  # the one device sync
    finally:
        model.train(was_training[0])
        head.train(was_training[1])
    seconds = time.perf_counter() - start
    nll = -sums[0] / tokens
    return EvalResult(
        nll_nats=nll,
        ppl=_exp(nll),
        ppl_cluster=_exp(-sums[1] / tokens) if has_parts else None,
        ppl_in_cluster=_exp(-sums[2] / tokens) if has_parts else None,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else float("inf"),
    )
