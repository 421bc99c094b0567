"""Perplexity, cluster perplexity and in-cluster perplexity of a model and head on dev data.

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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from sohsm.heads.base import Head


class Evaluable(Protocol):
    """Anything whose dev data a model can turn into hidden states and targets (every task can)."""

    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]: ...


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


class EvaluationStopped(Exception):
    """:func:`evaluate` was asked to stop (``should_stop``) before it scored everything; no result."""


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


@torch.no_grad()
def evaluate(model: nn.Module, head: Head, data: Evaluable,
             sum_over: Callable[[Tensor], Tensor] | None = None,
             should_stop: Callable[[], bool] | None = None) -> EvalResult:
    """Score every target of ``data`` with ``model`` and ``head``.

    ``data`` is any task (:class:`~sohsm.train.task.Task`), or anything else whose
    ``eval_hidden_states(model)`` gives hidden states and targets batch by batch
    (a language model's token stream: :func:`sohsm.tasks.lm.evaluate_stream`).
    Losses are summed on the device and read once at the end.

    Args:
        model: makes the hidden states.
        head: scores them.
        data: gives the hidden states and targets (called with the model in eval mode).
        sum_over: adds a tensor over processes in place (each scored its share of the
            data, :meth:`sohsm.train.distributed.Ranks.sum_`); the result is that of all shares.
        should_stop: asked before every batch; ``True`` abandons the evaluation (a Ctrl-C while
            training: the run stops after the current step, not after a whole dev pass).

    Returns:
        :class:`EvalResult`.

    Raises:
        ValueError: the data has no targets, or (raised by ``data``) cannot be read in its batches.
        EvaluationStopped: ``should_stop()`` answered ``True``.
    """
    was_training = model.training, head.training
    model.eval()
    head.eval()
    start = time.perf_counter()
    try:
        total, has_parts = _summed_log_probs(model, head, data, should_stop)
        if sum_over is not None:
            sum_over(total)
        log_prob, log_cluster, log_in_cluster, targets = total.tolist()  # the one device sync
        tokens = int(targets)
    finally:
        model.train(was_training[0])
        head.train(was_training[1])
    if tokens == 0:
        raise ValueError("the evaluation data has no targets")
    seconds = time.perf_counter() - start
    nll = -log_prob / tokens
    return EvalResult(
        nll_nats=nll,
        ppl=_exp(nll),
        ppl_cluster=_exp(-log_cluster / tokens) if has_parts else None,
        ppl_in_cluster=_exp(-log_in_cluster / tokens) if has_parts else None,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else float("inf"),
    )


def _summed_log_probs(model: nn.Module, head: Head, data: Evaluable,
                      should_stop: Callable[[], bool] | None) -> tuple[Tensor, bool]:
    """``([sum log P, sum of its cluster part, sum of its in-cluster part, targets], has_parts)`` over the
    dev data, summed on the device; a head without clusters leaves the parts at 0 (``has_parts`` false)."""
    total = torch.zeros(4, dtype=torch.float64, device=next(model.parameters()).device)
    has_parts = True
    for hidden, targets in data.eval_hidden_states(model):
        if should_stop is not None and should_stop():
            raise EvaluationStopped("the evaluation was stopped before it scored every target")
        hidden = hidden.reshape(-1, hidden.size(-1))  # [M, d]
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
        total[3] += targets.numel()
    return total, has_parts
