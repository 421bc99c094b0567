"""What heads return: a step's output and loss, the two parts of a two-level score, a head's memory."""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class HeadOutput(NamedTuple):
    """What ``head(hidden, target)`` returns.

    Attributes:
        output: ``log P(target_i | hidden_i)`` for every row, shape ``[B]``.
        loss: the mean negative log-likelihood of the batch (nats), a scalar.

    .. note::
        A head trained with a sampled objective (``head.objective != "nll"``)
        returns, in training mode, that objective's per-row term as ``output``
        and ``-output.mean()`` as ``loss``: not a log-likelihood, not to be
        read as a perplexity. In eval mode every head returns the exact
        ``log P(target | hidden)`` and the NLL. :attr:`Head.loss_is_nll` says
        which holds now.
    """

    output: Tensor
    loss: Tensor


class HeadMemory(NamedTuple):
    """What a head of given sizes holds during a training step, known before it is built (a run's pre-flight check).

    Attributes:
        parameters: its parameter count, word vectors included.
        word_vectors: of which its word vectors (what tying shares with the input embedding).
        extra_bytes: bytes alive during a step beyond parameters, gradients and optimizer state.
        extra: what ``extra_bytes`` are (``""`` when none), as a list's item: ``"output logits"``.
        graph_bytes: bytes its step holds besides when captured as a CUDA graph (a static form's buffers, kept in
            the graph's memory pool for the whole run).
    """

    parameters: int
    word_vectors: int
    extra_bytes: int = 0
    extra: str = ""
    graph_bytes: int = 0


class ClusterScores(NamedTuple):
    """The two factors of a two-level head's log-probability, per row.

    ``cluster + in_cluster == output`` of :class:`HeadOutput`; averaged over a
    corpus they give the cluster and in-cluster perplexities (paper Eq. 5-6).

    Attributes:
        cluster: ``log P(C(target_i) | hidden_i)``, shape ``[B]``.
        in_cluster: ``log P(target_i | hidden_i, C(target_i))``, shape ``[B]``.
    """

    cluster: Tensor
    in_cluster: Tensor
