"""Dense float64 reference computations for the head tests (not a test module).

Everything here is written from the equations (SPEC §1), independently of the
heads' own kernels: the two-level log-probability is the full logit matrix
masked to the target word's cluster.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def slot_of_word(head) -> Tensor:
    """Row of ``head.weight`` that holds each word, from the public ``clusters()``.

    ``weight`` rows are grouped by cluster, clusters in id order, words ascending
    inside a cluster, so concatenating ``clusters()`` gives the word of each row.
    """
    word_of_slot = torch.cat([c.cpu() for c in head.clusters()])
    return torch.argsort(word_of_slot)


def in_word_order(head, tensor_like_weight: Tensor) -> Tensor:
    """A weight-shaped tensor (gradient, optimizer state) re-ordered by word id."""
    return tensor_like_weight.detach()[slot_of_word(head).to(tensor_like_weight.device)]


class RefParams(NamedTuple):
    projection: Tensor | None  # [2d, d]
    cluster_weight: Tensor  # [C, d]
    word_weight: Tensor  # [N, d], word-id order
    assignment: Tensor  # [N]


def ref_params(head) -> RefParams:
    """float64 leaf copies of a two-level head's parameters (word vectors in word order)."""

    def leaf(t: Tensor) -> Tensor:
        return t.detach().to(torch.float64).clone().requires_grad_(True)

    return RefParams(
        leaf(head.projection.weight) if head.projection is not None else None,
        leaf(head.cluster_weight),
        leaf(head.word_vectors()),
        head.assignment.detach().clone(),
    )


def _split(params: RefParams, hidden: Tensor) -> tuple[Tensor, Tensor]:
    if params.projection is None:
        return hidden, hidden
    d = hidden.size(1)
    projected = F.relu(hidden @ params.projection.t())
    return projected[:, :d], projected[:, d:]


def two_level_parts(params: RefParams, hidden: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(log P(C(t)|h), log P(t|h, C(t)))`` per row, dense and naive."""
    hidden_c, hidden_w = _split(params, hidden)
    cluster_log_probs = torch.log_softmax(hidden_c @ params.cluster_weight.t(), dim=1)
    target_cluster = params.assignment[target]
    cluster_part = cluster_log_probs.gather(1, target_cluster[:, None]).squeeze(1)
    logits = hidden_w @ params.word_weight.t()  # [B, N]
    outside = params.assignment[None, :] != target_cluster[:, None]
    word_part = torch.log_softmax(logits.masked_fill(outside, float("-inf")), dim=1)
    word_part = word_part.gather(1, target[:, None]).squeeze(1)
    return cluster_part, word_part


def two_level_log_prob(params: RefParams, hidden: Tensor) -> Tensor:
    """``[B, N]`` exact log-probabilities over the whole vocabulary, one cluster at a time."""
    hidden_c, hidden_w = _split(params, hidden)
    cluster_log_probs = torch.log_softmax(hidden_c @ params.cluster_weight.t(), dim=1)
    logits = hidden_w @ params.word_weight.t()
    out = torch.empty_like(logits)
    for c in range(params.cluster_weight.size(0)):
        members = (params.assignment == c).nonzero().flatten()
        if members.numel():
            out[:, members] = cluster_log_probs[:, c : c + 1] + torch.log_softmax(logits[:, members], dim=1)
    return out


def sequential_q_update(q: Tensor, target: Tensor, cluster_log_probs: Tensor, counts: Tensor, smoothing: str) -> Tensor:
    """Eq. 9, one token at a time in batch order, float64; ``q`` in log2, inputs in natural log."""
    q = q.detach().to(torch.float64).clone()
    log2_probs = cluster_log_probs.detach().to(torch.float64) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    for t, w in enumerate(target.tolist()):
        f = max(float(counts[w]), 1.0)
        lam = 1.0 / f if smoothing == "paper_literal" else 1.0 - 1.0 / f
        q[w] = lam * q[w] + (1.0 - lam) * log2_probs[t]
    return q
