"""The bootstrapped tree of Mnih and Hinton (2009): split word vectors recursively with 2-component mixtures.

Each word is represented by a vector (in the paper: the average context vector
that predicted it under a model trained with a random tree). The words of a node
are fitted with a mixture of two spherical Gaussians by EM and split between the
two components, recursively, until every word is a leaf:

* ``balanced``: words sorted by the posterior log-ratio of the two components,
  the first half (rounded up) to child 0, the rest to child 1;
* ``adaptive``: each word to its more probable component (a split that would
  leave one side empty falls back to the balanced one).

All nodes of one depth are fitted together (segmented EM), so the cost is about
``depth * em_steps`` passes over the ``[N, d]`` vectors.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from sohsm.clustering.trees import check_tree

VARIANTS = ("balanced", "adaptive")


def _log_densities(x: Tensor, sq_norm: Tensor, group: Tensor, mean: Tensor, var: Tensor, log_pi: Tensor,
                   chunk: int = 8192) -> Tensor:
    """``[M, 2]`` log(pi_c N(x | mean_c, var_c I)) of each word under its group's two components."""
    d = x.size(1)
    mean_sq = mean.pow(2).sum(-1)  # [G, 2]
    const = log_pi - 0.5 * d * torch.log(2 * math.pi * var)  # [G, 2]
    out = x.new_empty(x.size(0), 2)
    for lo in range(0, x.size(0), chunk):
        xs, gs = x[lo : lo + chunk], group[lo : lo + chunk]
        if mean.size(0) <= 8:  # few groups: one matmul against every mean beats a gather per word
            dot = (xs @ mean.reshape(-1, d).t()).reshape(-1, mean.size(0), 2)[torch.arange(xs.size(0)), gs]
        else:
            dot = torch.bmm(mean[gs], xs[:, :, None]).squeeze(2)  # [m, 2]
        sq = (sq_norm[lo : lo + chunk, None] - 2 * dot + mean_sq[gs]).clamp(min=0)
        out[lo : lo + chunk] = const[gs] - sq / (2 * var[gs])
    return out


def _split_scores(x: Tensor, group: Tensor, n_groups: int, sizes: Tensor, em_steps: int,
                  generator: torch.Generator | None) -> Tensor:
    """Fit two spherical Gaussians to every group by EM; ``[M]`` log P(component 0 | x) - log P(component 1 | x)."""
    d = x.size(1)
    counts = sizes.long()
    starts = torch.cumsum(counts, 0) - counts
    # two distinct members of each group start the two means
    first = torch.minimum((torch.rand(n_groups, generator=generator, dtype=torch.float64) * sizes).long(), counts - 1)
    step = 1 + torch.minimum((torch.rand(n_groups, generator=generator, dtype=torch.float64) * (sizes - 1)).long(),
                             counts - 2)
    second = (first + step) % counts
    mean = torch.stack([x[starts + first], x[starts + second]], dim=1)  # [G, 2, d]
    sq_norm = x.pow(2).sum(1)
    sizes = sizes.to(x.dtype)
    total = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, group, sq_norm)
    centre = torch.zeros(n_groups, d, dtype=x.dtype).index_add_(0, group, x) / sizes[:, None]
    spread = (total / sizes - centre.pow(2).sum(1)) / d
    floor = 1e-6 * spread.mean().clamp(min=1e-12)
    var = spread.clamp(min=floor)[:, None].expand(n_groups, 2).clone()
    log_pi = torch.full((n_groups, 2), -math.log(2.0), dtype=x.dtype)
    for _ in range(em_steps):
        resp = torch.softmax(_log_densities(x, sq_norm, group, mean, var, log_pi), dim=1)  # [M, 2]
        s0 = torch.zeros(n_groups, 2, dtype=x.dtype).index_add_(0, group, resp).clamp(min=1e-12)
        s1 = torch.stack([torch.zeros(n_groups, d, dtype=x.dtype).index_add_(0, group, x * resp[:, c, None])
                          for c in range(2)], dim=1)  # [G, 2, d]
        s2 = torch.zeros(n_groups, 2, dtype=x.dtype).index_add_(0, group, resp * sq_norm[:, None])
        mean = s1 / s0[:, :, None]
        var = ((s2 / s0 - mean.pow(2).sum(-1)) / d).clamp(min=floor)
        log_pi = (s0 / sizes[:, None]).clamp(min=1e-12).log()
    log_p = _log_densities(x, sq_norm, group, mean, var, log_pi)
    return log_p[:, 0] - log_p[:, 1]


def bootstrap_tree(vectors: Tensor, variant: str = "balanced", generator: torch.Generator | None = None,
                   em_steps: int = 10) -> Tensor:
    """A binary tree over ``N`` words from their vectors, split recursively by 2-component mixtures.

    Paper: Mnih and Hinton (2009), "A scalable hierarchical distributed language
    model" (the ``balanced`` and ``adaptive`` trees; their ``adaptive(e)`` DAG
    is not a tree and is not built).

    Args:
        vectors: ``[N, d]`` one vector per word (``N >= 2``).
        variant: ``"balanced"`` (halves: leaf depths differ by at most one) or
            ``"adaptive"`` (each word to its more probable component).
        generator: draws the two starting means of every fit.
        em_steps: EM iterations per depth.

    Returns:
        ``[N - 1, 2]`` children table (see :mod:`sohsm.clustering.trees`), breadth-first numbered.

    >>> x = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
    >>> from sohsm.clustering.trees import tree_paths
    >>> tree_paths(bootstrap_tree(x, generator=torch.Generator().manual_seed(0))).lengths.tolist()
    [2, 2, 2, 2]
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    vectors = torch.as_tensor(vectors)
    if vectors.dim() != 2 or vectors.size(0) < 2:
        raise ValueError(f"vectors must have shape [N, d] with N >= 2, got {tuple(vectors.shape)}")
    if not bool(torch.isfinite(vectors).all()):
        raise ValueError("vectors must be finite")
    if isinstance(em_steps, bool) or not isinstance(em_steps, int) or em_steps < 1:
        raise ValueError(f"em_steps must be a positive integer, got {em_steps!r}")
    x_all = vectors.detach().to(torch.float32).cpu()
    n_words = x_all.size(0)
    n_internal = n_words - 1
    children = torch.empty(n_internal, 2, dtype=torch.long)
    words = torch.arange(n_words)  # words of the current level's groups, group after group
    sizes = [n_words]  # every group of the level has >= 2 words and is an internal node
    next_id = 0
    while sizes:
        size_t = torch.tensor(sizes)
        n_groups = len(sizes)
        group = torch.repeat_interleave(torch.arange(n_groups), size_t)
        score = _split_scores(x_all[words], group, n_groups, size_t, em_steps, generator)
        # within each group: best score for component 0 first (stable: ties keep word order)
        order = torch.sort(score, descending=True, stable=True).indices
        order = order[torch.sort(group[order], stable=True).indices]
        left_size = (size_t + 1) // 2
        if variant == "adaptive":
            to_left = torch.zeros(n_groups, dtype=torch.long).index_add_(0, group, (score > 0).long())
            usable = (to_left > 0) & (to_left < size_t)
            left_size = torch.where(usable, to_left, left_size)
        words = words[order]
        # children of this level's nodes; groups of two or more words become the next level's nodes
        ids = list(range(next_id, next_id + n_groups))
        next_id += n_groups
        next_sizes: list[int] = []
        keep: list[Tensor] = []
        offset = 0
        for node, size, left in zip(ids, sizes, left_size.tolist()):
            for side, (lo, n) in enumerate(((offset, left), (offset + left, size - left))):
                if n == 1:
                    children[node, side] = n_internal + int(words[lo])
                else:
                    children[node, side] = next_id + len(next_sizes)
                    next_sizes.append(n)
                    keep.append(words[lo : lo + n])
            offset += size
        words = torch.cat(keep) if keep else words[:0]
        sizes = next_sizes
    return check_tree(children, n_words)
