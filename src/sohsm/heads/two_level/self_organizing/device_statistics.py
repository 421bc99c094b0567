"""The statistics ``q`` folded in without host synchronisation (the sync-free path), and the batches that wait.

:meth:`ClusterStatistics.fold <sohsm.heads.two_level.self_organizing.cluster_statistics.ClusterStatistics.fold>`
folds a batch into ``q`` with ``torch.unique`` and a host-side check for non-finite rows. Here the same update is
written with static shapes (a sort and ``searchsorted`` in place of ``unique``; non-finite rows masked, not
removed), so a training step reads nothing back (:func:`fold`).

The fold itself is some sixty small ops, a kernel launch each, and a small model's step on a GPU is bound by its
launches (``benchmarks/step_ops.py``). So with the corpus counts given (the language models' case) the batches
wait (:class:`Waiting`), up to :data:`FOLD_EVERY` of them (fewer where they would hold more than
:data:`WAITING_ENTRIES` entries), and are folded in one go: the same ``q`` (a batch sequence folded at
once is folded token by token in the same order), with the ops paid once for several steps. Whatever reads ``q``
(the head's property, Algorithm 1, the state dict, ``.to()``) folds what waits first.

Functions over tensors and objects that own their state: none sees the head.
"""
from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from sohsm.heads.two_level.self_organizing.reclustering import smoothing_factor

_LN2 = math.log(2.0)
#: batches that wait to be folded into ``q`` together (with the corpus counts given), and the most entries
#: (rows x clusters) their log-probabilities may hold while they wait
FOLD_EVERY = 16
WAITING_ENTRIES = 1 << 24


@torch.no_grad()
def fold(q: Tensor, counts: Tensor, counts_given: bool, smoothing: str, shortlist: int, target: Tensor,
         cluster_log_probs: Tensor) -> None:
    """Fold one batch into ``q`` (Eq. 9) in place with static shapes: the eager fold's result.

    Token ``t`` of word ``w`` enters ``q[w]`` with weight ``(1 - lambda_t) * prod_{s after t} lambda_s``
    and the old row keeps ``prod_t lambda_t`` (products over the batch's occurrences of ``w``, in
    batch order). A row with a NaN or ``+inf`` log-probability counts as absent: smoothing 1, weight 0.

    Args:
        q: ``[N, C_learned]`` the dense statistics (log2).
        counts: ``[N]`` the words' counts; where not ``counts_given`` the batch's targets are added to them.
        counts_given: the counts are the corpus's (else the head counts the targets it sees).
        smoothing: the rule of ``lambda`` (:func:`~.reclustering.smoothing_factor`).
        shortlist: the leading columns of ``cluster_log_probs`` that ``q`` does not keep (the shortlist's clusters).
        target: ``[B]`` word ids.
        cluster_log_probs: ``[B, n_clusters]`` natural-log ``log P(c | h)`` of each row.
    """
    target = target.reshape(-1)
    n = target.numel()
    if n == 0:
        return
    cluster_log_probs = cluster_log_probs[:, shortlist:]  # q keeps the learned clusters' columns only
    good = ~(cluster_log_probs.isnan() | (cluster_log_probs == math.inf)).any(dim=1)  # [B]
    word_sorted, by_word = torch.sort(target, stable=True)  # batch order kept within a word
    good_sorted = good[by_word]
    # each token's group of equal words: [first, last] positions in the sorted order
    first = torch.searchsorted(word_sorted, word_sorted, right=False)
    last = torch.searchsorted(word_sorted, word_sorted, right=True) - 1
    counts_f = counts.to(torch.float64)
    if counts_given:
        seen = counts_f[word_sorted]
    else:
        # occurrence number among the good rows of the word, counting this one
        good_before = good_sorted.long().cumsum(0)
        group_base = torch.where(first > 0, good_before[(first - 1).clamp(min=0)], torch.zeros_like(first))
        seen = counts_f[word_sorted] + (good_before - group_base).to(torch.float64)
        counts.index_add_(0, target, good.to(counts.dtype))
    lam = smoothing_factor(seen, smoothing)
    lam = torch.where(good_sorted, lam, torch.ones_like(lam))  # an absent row changes nothing
    log_lam = lam.log().clamp(min=-1e4).cumsum(0)  # lambda = 0 (a first occurrence ever): exp(-1e4) = 0
    before_group = torch.where(first > 0, log_lam[(first - 1).clamp(min=0)], torch.zeros_like(log_lam))
    decay = (log_lam[last] - before_group).exp()  # [n]: the group's decay, at every token of the group
    weight = torch.where(good_sorted, (1.0 - lam) * (log_lam[last] - log_lam).exp(), torch.zeros_like(lam))
    samples = (cluster_log_probs[by_word] / _LN2).clamp(min=-1e4)
    samples = torch.where(good_sorted[:, None], samples, torch.zeros_like(samples))  # NaN * 0 would stay NaN
    # one addition: q[w] += (decay - 1) q[w] (at the word's first token only) + its tokens' weighted samples
    keep = torch.where(first == torch.arange(n, device=target.device), decay - 1.0, torch.zeros_like(decay))
    update = q[word_sorted] * keep.to(q.dtype)[:, None] + samples.to(q.dtype) * weight.to(q.dtype)[:, None]
    q.index_add_(0, word_sorted, update)


_SERIALS = itertools.count(1)


class WaitingRing:
    """The batches waiting to be folded into ``q`` in fixed device buffers, in the order seen (a static step).

    A captured CUDA graph replays a step on the same storage, so in a static step
    (:meth:`ClusterStatistics.set_static`) a batch does not join a Python list: it is copied into the next
    ``rows`` rows of two buffers of :data:`FOLD_EVERY` batches (fewer where they would pass
    :data:`WAITING_ENTRIES`), at a position kept on the device (three ops
    a step). The host counts the batches waiting; the fold runs after the optimizer step that fills the ring
    (:meth:`Waiting.full`), outside any graph.
    """

    def __init__(self, rows: int, columns: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows, self.capacity = rows, max(1, min(FOLD_EVERY, WAITING_ENTRIES // max(rows * columns, 1)))
        self.targets = torch.zeros(self.capacity * rows, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(self.capacity * rows, columns, dtype=dtype, device=device)
        self.start = torch.arange(rows, device=device)
        self.positions = self.start.clone()  # where the next batch goes
        self.waiting = 0  # batches written since the last fold (host count)
        self.serial = next(_SERIALS)  # names this ring in a captured step's fingerprint (an id() may be reused)

    def fits(self, target: Tensor, cluster_log_probs: Tensor) -> bool:
        """Whether a batch has the ring's shape and dtype (a short batch or another dtype is folded on its own)."""
        return (target.numel() == self.rows and cluster_log_probs.shape[1] == self.log_probs.shape[1]
                and cluster_log_probs.dtype == self.log_probs.dtype and cluster_log_probs.device == self.start.device)

    def write(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Copy a batch into the next rows (device ops only); the host's count follows in :meth:`wrote`."""
        self.targets.index_copy_(0, self.positions, target.reshape(-1))
        self.log_probs.index_copy_(0, self.positions, cluster_log_probs)
        self.positions.add_(self.rows)

    def tensors(self) -> list[Tensor]:
        """What a step writes: the two buffers and the position."""
        return [self.targets, self.log_probs, self.positions]

    def wrote(self) -> None:
        self.waiting += 1

    def take(self) -> tuple[Tensor, Tensor] | None:
        """The waiting batches, oldest first, and an empty ring (its position back at the start)."""
        if not self.waiting:
            return None
        used = self.waiting * self.rows
        self.waiting = 0
        self.positions.copy_(self.start)
        return self.targets[:used], self.log_probs[:used]


class Waiting:
    """The batches of the sync-free path waiting to be folded into ``q``, in the order seen.

    Eagerly they join a list, folded once :data:`FOLD_EVERY` wait (or :data:`WAITING_ENTRIES` entries); in a
    static step (:attr:`static`) they are copied into a :class:`WaitingRing` on the device, folded after the
    optimizer step that fills it (a captured graph replays the copy into the ring, never the fold).
    """

    def __init__(self) -> None:
        self.batches: list[tuple[Tensor, Tensor]] = []
        self.ring: WaitingRing | None = None
        self.static = False

    def add(self, target: Tensor, cluster_log_probs: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Keep a batch waiting; returns what must be folded now, in order (a full list, or what no longer fits
        the ring and a batch that does not fit it)."""
        if self.static:
            ring = self.ring
            if ring is None or not ring.fits(target, cluster_log_probs):
                due = self.take()
                if ring is not None or target.numel() == 0:  # a short batch: on its own
                    return [*due, (target, cluster_log_probs)]
                ring = self.ring = WaitingRing(target.numel(), cluster_log_probs.shape[1], cluster_log_probs.dtype,
                                               cluster_log_probs.device)
            else:
                due = []
            ring.write(target, cluster_log_probs)
            ring.wrote()
            return due
        self.batches.append((target.reshape(-1).clone(), cluster_log_probs))
        if len(self.batches) >= FOLD_EVERY or sum(lp.numel() for _, lp in self.batches) > WAITING_ENTRIES:
            return self.take()
        return []

    def replayed(self) -> bool:
        """A replayed graph wrote a batch into the ring: count it (``False`` where there is no ring to count in)."""
        if not self.static or self.ring is None:
            return False
        self.ring.wrote()
        return True

    def full(self) -> bool:
        """Whether the ring holds its :data:`FOLD_EVERY` batches (folded after the optimizer step, outside a graph)."""
        return self.ring is not None and self.ring.waiting >= self.ring.capacity

    def take(self) -> list[tuple[Tensor, Tensor]]:
        """Every batch waiting, oldest first, as at most two batches (the ring's, the list's), and none left."""
        taken = []
        if self.ring is not None:
            from_ring = self.ring.take()
            if from_ring is not None:
                taken.append(from_ring)
        batches, self.batches = self.batches, []
        if len(batches) == 1:
            taken.append(batches[0])
        elif batches:
            taken.append((torch.cat([t for t, _ in batches]), torch.cat([lp for _, lp in batches])))
        return taken
