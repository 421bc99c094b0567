"""A language model's evaluation on a token stream: the LSTM state carried across windows, a transformer's
windows disjoint.

    ppl            = exp( -(1/M) sum_t log P(w_t | w_<t) )
    ppl_cluster    = exp( -(1/M) sum_t log P(C(w_t) | w_<t) )          (paper Eq. 5)
    ppl_in_cluster = exp( -(1/M) sum_t log P(w_t | w_<t, C(w_t)) )     (paper Eq. 6)

(:func:`sohsm.train.evaluation.evaluate` sums them, for every task.)
"""
from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor, nn

from sohsm.data.batching import batchify, bptt_batches
from sohsm.heads.base import Head
from sohsm.train.evaluation import EvalResult, evaluate


def evaluate_stream(model: nn.Module, head: Head, ids: Tensor, batch_size: int = 32,
                    bptt: int = 20) -> EvalResult:
    """Score every token of the 1-D stream ``ids`` but the first with ``model`` and ``head``.

    The stream is laid out in ``batch_size`` columns (:func:`sohsm.data.batchify`; at
    most ``batch_size - 1`` trailing tokens are dropped) and read in windows of
    ``bptt`` rows with the LSTM state carried across windows. A transformer carries
    nothing: it reads each column in disjoint windows of ``bptt`` tokens, so a token
    sees the 0 to ``bptt - 1`` tokens before it in its window (about ``bptt / 2`` on
    average; a sliding window would see more, at ``bptt`` times the cost).

    Args:
        model: makes the hidden states.
        head: scores them.
        ids: 1-D token ids (a corpus split).
        batch_size: columns of the layout.
        bptt: rows per window (for the LSTM it does not change the result, only memory and speed; for a
            transformer it is the context, the run's own).

    Returns:
        :class:`~sohsm.train.evaluation.EvalResult`.

    Raises:
        ValueError: ``ids`` is too short for ``batch_size`` columns of two tokens.
    """
    return evaluate(model, head, _Stream(ids, batch_size, bptt))


class _Stream:
    """A token stream as evaluation data (``eval_hidden_states``)."""

    def __init__(self, ids: Tensor, batch_size: int, bptt: int) -> None:
        self.ids, self.batch_size, self.bptt = ids, batch_size, bptt

    def eval_hidden_states(self, model: nn.Module) -> Iterator[tuple[Tensor, Tensor]]:
        return stream_hidden_states(model, self.ids, self.batch_size, self.bptt)


def stream_hidden_states(model: nn.Module, ids: Tensor, batch_size: int, bptt: int,
                         columns: slice | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """``(hidden [t*B, d], targets [t*B])`` of a token stream in ``batch_size`` columns, the state carried (an
    LSTM's; a transformer has none, so its windows are disjoint).

    ``columns``: only these columns of the layout (a rank's share; each column is
    read on its own, so the shares' sums add up to the whole's).

    Raises:
        ValueError: ``ids`` is too short for ``batch_size`` columns of two tokens.
    """
    device = next(model.parameters()).device
    if ids.dim() != 1 or ids.numel() < 2 * batch_size:
        raise ValueError(f"cannot evaluate {ids.numel()} tokens in {batch_size} columns: "
                         "need at least two tokens per column")
    data = batchify(ids, batch_size, device)  # [T, B]
    if columns is not None:
        data = data[:, columns]  # [T, b]

    def windows() -> Iterator[tuple[Tensor, Tensor]]:
        state = None
        for inputs, targets in bptt_batches(data, bptt):
            hidden, state = model(inputs, state)  # [t, B, d]
            yield hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)  # [t*B, d], [t*B]

    return windows()
