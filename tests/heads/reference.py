"""Dense float64 reference computations for the head tests (not a test module).

Everything here is written from the equations (the paper's Eq. 1-4), independently of the
heads' own kernels: the two-level log-probability is the full logit matrix
masked to the target word's cluster.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def shuffled_zipf_counts(n: int) -> Tensor:
    """Word counts ``round(2000 / rank)`` in a fixed random word order (the self-organized head's tests)."""
    g = torch.Generator().manual_seed(321)
    zipf = (2000.0 / torch.arange(1, n + 1, dtype=torch.float64)).round()
    return zipf[torch.randperm(n, generator=g)]


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
    cluster_bias: Tensor | None = None  # [C]


def ref_params(head) -> RefParams:
    """float64 leaf copies of a two-level head's parameters (word vectors in word order)."""

    def leaf(t: Tensor) -> Tensor:
        return t.detach().to(torch.float64).clone().requires_grad_(True)

    return RefParams(
        leaf(head.projection.weight) if head.projection is not None else None,
        leaf(head.cluster_weight),
        leaf(head.word_vectors()),
        head.assignment.detach().clone(),
        leaf(head.cluster_bias) if getattr(head, "cluster_bias", None) is not None else None,
    )


def _split(params: RefParams, hidden: Tensor) -> tuple[Tensor, Tensor]:
    if params.projection is None:
        return hidden, hidden
    d = hidden.size(1)
    projected = F.relu(hidden @ params.projection.t())
    return projected[:, :d], projected[:, d:]


def _cluster_log_probs(params: RefParams, hidden_c: Tensor) -> Tensor:
    logits = hidden_c @ params.cluster_weight.t()
    return torch.log_softmax(logits if params.cluster_bias is None else logits + params.cluster_bias, dim=1)


def two_level_parts(params: RefParams, hidden: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(log P(C(t)|h), log P(t|h, C(t)))`` per row, dense and naive."""
    hidden_c, hidden_w = _split(params, hidden)
    cluster_log_probs = _cluster_log_probs(params, hidden_c)
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
    cluster_log_probs = _cluster_log_probs(params, hidden_c)
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


# -- baselines: adaptive softmax, binary tree, sampled objectives -----------------------


def adaptive_log_prob(head_weight: Tensor, head_bias: Tensor | None, tails: list[tuple[Tensor, Tensor]],
                      cutoffs: list[int], word_of_rank: Tensor, hidden: Tensor) -> Tensor:
    """``[B, N]`` adaptive softmax (Grave et al. 2017), word-id order, from its equations.

    Ranks ``[0, cutoffs[0])`` are scored in the head softmax beside one entry per
    tail cluster; rank ``r`` of tail cluster ``i`` is ``log P(cluster i) +
    log_softmax((h P_i^T) Q_i^T)[r - start_i]``.
    """
    head_logits = hidden @ head_weight.t()
    if head_bias is not None:
        head_logits = head_logits + head_bias
    head_lp = torch.log_softmax(head_logits, dim=1)
    short = cutoffs[0]
    parts = [head_lp[:, :short]]
    for i, (projection, out) in enumerate(tails):
        parts.append(head_lp[:, short + i : short + i + 1]
                     + torch.log_softmax((hidden @ projection.t()) @ out.t(), dim=1))
    by_rank = torch.cat(parts, dim=1)
    rank_of_word = torch.argsort(word_of_rank)
    return by_rank[:, rank_of_word]


def adaptive_input_matrix(head_weight: Tensor, tails: list[tuple[Tensor, Tensor]], cutoffs: list[int],
                          word_of_rank: Tensor) -> Tensor:
    """``[N, d]`` adaptive input (Baevski & Auli 2019) tied to an adaptive softmax, word-id order, one word at a time.

    Rank ``r < cutoffs[0]``: the head softmax's row ``r``; rank ``r`` of tail cluster ``i``: its output
    vector ``Q_i[r - start_i]`` read back up to ``d`` through the cluster's projection, ``Q_i[r - start_i] @ P_i``.
    """
    n = len(word_of_rank)
    starts = [cutoffs[0], *cutoffs[1:], n]
    rows: list[Tensor | None] = [None] * n
    for rank in range(n):
        word = int(word_of_rank[rank])
        if rank < cutoffs[0]:
            rows[word] = head_weight[rank]
            continue
        i = max(j for j in range(len(tails)) if starts[j] <= rank)
        projection, out = tails[i]
        rows[word] = out[rank - starts[i]] @ projection
    return torch.stack(rows)


def tree_log_prob(tree: Tensor, node_weight: Tensor, hidden: Tensor) -> Tensor:
    """``[B, N]`` binary-tree log-probabilities: for every word, walk up its parents in Python."""
    n_internal = tree.size(0)
    parent_of = {}
    for n, (left, right) in enumerate(tree.tolist()):
        parent_of[left] = (n, +1.0)
        parent_of[right] = (n, -1.0)
    scores = hidden @ node_weight.t()  # [B, N - 1]
    columns = []
    for w in range(n_internal + 1):
        node, total = n_internal + w, torch.zeros_like(hidden[:, 0])
        while node != 0:
            parent, sign = parent_of[node]
            total = total + torch.nn.functional.logsigmoid(sign * scores[:, parent])
            node = parent
        columns.append(total)
    return torch.stack(columns, dim=1)


def importance_sampling_output(weight, bias, log_q, hidden, target, noise, remove_hits: bool) -> Tensor:
    """Per-row sampled-softmax estimate of log P(t | h), one row at a time."""
    rows = []
    for i in range(hidden.size(0)):
        def score(w):
            s = hidden[i] @ weight[w] + (bias[w] if bias is not None else 0.0)
            return s - log_q[w]
        terms = [score(int(target[i]))]
        terms += [score(int(u)) for u in noise if not (remove_hits and int(u) == int(target[i]))]
        rows.append(terms[0] - torch.logsumexp(torch.stack(terms), dim=0))
    return torch.stack(rows)


def nce_output(weight, bias, log_q, hidden, target, noise) -> Tensor:
    """Per-row NCE objective with Z_c = 1 (Melamud et al. 2017, Eq. 2-3), one row at a time."""
    k = len(noise)
    rows = []
    for i in range(hidden.size(0)):
        def delta(w):
            return hidden[i] @ weight[w] + bias[w] - log_q[w] - math.log(k)
        total = torch.log(torch.sigmoid(delta(int(target[i]))))
        for u in noise:
            total = total + torch.log(1 - torch.sigmoid(delta(int(u))))
        rows.append(total)
    return torch.stack(rows)


def negative_sampling_output(weight, hidden, target, noise, offset: float = 0.0) -> Tensor:
    """Per-row NEG objective (Melamud et al. 2017, Eq. 4), one row at a time; ``offset`` is added to every score."""
    rows = []
    for i in range(hidden.size(0)):
        total = torch.log(torch.sigmoid(hidden[i] @ weight[int(target[i])] + offset))
        for u in noise:
            total = total + torch.log(torch.sigmoid(-(hidden[i] @ weight[int(u)] + offset)))
        rows.append(total)
    return torch.stack(rows)
