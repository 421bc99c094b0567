"""The self-organized head's statistics and schedule without host synchronisation (the sync-free path).

:meth:`SelfOrganizedSoftmax.update_statistics` folds a batch into ``q`` with
``torch.unique`` and a host-side check for non-finite rows, and the optimizer hook
reads the step counter back with ``int(head.steps)``: three waits for the device
a step. Here the same update is written with static shapes (a sort and
``searchsorted`` in place of ``unique``; non-finite rows masked, not removed), and
the step count is mirrored on the host, so a training step reads nothing back.

The fold itself is some sixty small ops, a kernel launch each, and a small model's step on a GPU is bound by its
launches (``benchmarks/step_ops.py``). So with the corpus counts given (the language models' case) the batches
wait, up to :data:`FOLD_EVERY` of them (fewer where they would hold more than :data:`WAITING_ENTRIES` entries), and
are folded in one go: the same ``q`` (a batch sequence folded at
once is folded token by token in the same order), with the ops paid once for several steps. Whatever reads ``q``
(the property, Algorithm 1, the state dict, ``.to()``) folds what waits first.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

_LN2 = math.log(2.0)
#: batches that wait to be folded into ``q`` together (with the corpus counts given), and the most entries
#: (rows x clusters) their log-probabilities may hold while they wait
FOLD_EVERY = 16
WAITING_ENTRIES = 1 << 24


@torch.no_grad()
def update_statistics(head, target: Tensor, cluster_log_probs: Tensor) -> None:
    """Fold one batch into ``head.q`` (Eq. 9) with static shapes: same result as ``head.update_statistics``.

    Token ``t`` of word ``w`` enters ``q[w]`` with weight ``(1 - lambda_t) * prod_{s after t} lambda_s``
    and the old row keeps ``prod_t lambda_t`` (products over the batch's occurrences of ``w``, in
    batch order). A row with a NaN or ``+inf`` log-probability counts as absent: smoothing 1, weight 0.

    Args:
        head: a :class:`~sohsm.heads.SelfOrganizedSoftmax`.
        target: ``[B]`` word ids.
        cluster_log_probs: ``[B, n_clusters]`` natural-log ``log P(c | h)`` of each row.
    """
    target = target.reshape(-1)
    n = target.numel()
    if n == 0:
        return
    cluster_log_probs = cluster_log_probs[:, head.shortlist:]  # q keeps the learned clusters' columns only
    good = ~(cluster_log_probs.isnan() | (cluster_log_probs == math.inf)).any(dim=1)  # [B]
    word_sorted, by_word = torch.sort(target, stable=True)  # batch order kept within a word
    good_sorted = good[by_word]
    # each token's group of equal words: [first, last] positions in the sorted order
    first = torch.searchsorted(word_sorted, word_sorted, right=False)
    last = torch.searchsorted(word_sorted, word_sorted, right=True) - 1
    counts = head.counts.to(torch.float64)
    if head.counts_given:
        seen = counts[word_sorted]
    else:
        # occurrence number among the good rows of the word, counting this one
        good_before = good_sorted.long().cumsum(0)
        group_base = torch.where(first > 0, good_before[(first - 1).clamp(min=0)], torch.zeros_like(first))
        seen = counts[word_sorted] + (good_before - group_base).to(torch.float64)
        head.counts.index_add_(0, target, good.to(head.counts.dtype))
    lam = head._smoothing_factor(seen)
    lam = torch.where(good_sorted, lam, torch.ones_like(lam))  # an absent row changes nothing
    log_lam = lam.log().clamp(min=-1e4).cumsum(0)  # lambda = 0 (a first occurrence ever): exp(-1e4) = 0
    before_group = torch.where(first > 0, log_lam[(first - 1).clamp(min=0)], torch.zeros_like(log_lam))
    decay = (log_lam[last] - before_group).exp()  # [n]: the group's decay, at every token of the group
    weight = torch.where(good_sorted, (1.0 - lam) * (log_lam[last] - log_lam).exp(), torch.zeros_like(lam))
    samples = (cluster_log_probs[by_word] / _LN2).clamp(min=-1e4)
    samples = torch.where(good_sorted[:, None], samples, torch.zeros_like(samples))  # NaN * 0 would stay NaN
    # one addition: q[w] += (decay - 1) q[w] (at the word's first token only) + its tokens' weighted samples
    q = head.q
    keep = torch.where(first == torch.arange(n, device=target.device), decay - 1.0, torch.zeros_like(decay))
    update = q[word_sorted] * keep.to(q.dtype)[:, None] + samples.to(q.dtype) * weight.to(q.dtype)[:, None]
    q.index_add_(0, word_sorted, update)


class WaitingRing:
    """The batches waiting to be folded into ``q`` in fixed device buffers, in the order seen (a static step).

    A captured CUDA graph replays a step on the same storage, so in a static step
    (:meth:`SelfOrganizedSoftmax.set_static`) a batch does not join a Python list: it is copied into the next
    ``rows`` rows of two buffers of :data:`FOLD_EVERY` batches (fewer where they would pass
    :data:`WAITING_ENTRIES`), at a position kept on the device (three ops
    a step). The host counts the batches waiting; the fold runs after the optimizer step that fills the ring
    (:func:`fold_if_full`), outside any graph.
    """

    def __init__(self, rows: int, columns: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows, self.capacity = rows, max(1, min(FOLD_EVERY, WAITING_ENTRIES // max(rows * columns, 1)))
        self.targets = torch.zeros(self.capacity * rows, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(self.capacity * rows, columns, dtype=dtype, device=device)
        self.start = torch.arange(rows, device=device)
        self.positions = self.start.clone()  # where the next batch goes
        self.waiting = 0  # batches written since the last fold (host count)

    def fits(self, target: Tensor, cluster_log_probs: Tensor) -> bool:
        """Whether a batch has the ring's shape and dtype (a short batch or another dtype is folded on its own)."""
        return (target.numel() == self.rows and cluster_log_probs.shape[1] == self.log_probs.shape[1]
                and cluster_log_probs.dtype == self.log_probs.dtype and cluster_log_probs.device == self.start.device)

    def write(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Copy a batch into the next rows (device ops only); the host's count follows in :meth:`wrote`."""
        self.targets.index_copy_(0, self.positions, target.reshape(-1))
        self.log_probs.index_copy_(0, self.positions, cluster_log_probs)
        self.positions.add_(self.rows)

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


def observe(head, target: Tensor, cluster_log_probs: Tensor) -> None:
    """What ``SelfOrganizedSoftmax._observe`` does, read nothing back: fold the batch into ``q``.

    The host-side bookkeeping (tokens seen, the interval ``K`` when it is chosen from
    the batch size) waits for the next optimizer step (:func:`after_step`). With
    several processes the statistics go through the head's own merging (which
    reads sizes back) in eager mode; inside ``torch.compile`` one process is assumed.
    In a static step the batch goes to the head's :class:`WaitingRing`.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        if torch._C._current_graph_task_id() != -1:
            return  # a forward recomputed during backward (activation checkpointing) was already seen
        if head._find_group() is not None:
            head._observe(target, cluster_log_probs)
            return
    if head.frozen:
        return
    head._device_tokens.append(target.numel())
    if compiling or not head.counts_given:  # a graph folds at once; counting targets, the counts must not wait
        update_statistics(head, target, cluster_log_probs)
        return
    if head._static:
        ring = head._waiting_ring
        if ring is None or not ring.fits(target, cluster_log_probs):
            fold_waiting(head)
            if ring is not None or target.numel() == 0:  # a short batch: on its own
                update_statistics(head, target, cluster_log_probs)
                return
            ring = head._waiting_ring = WaitingRing(target.numel(), cluster_log_probs.shape[1],
                                                    cluster_log_probs.dtype, cluster_log_probs.device)
        ring.write(target, cluster_log_probs)
        ring.wrote()
        return
    waiting = head.__dict__.setdefault("_unfolded", [])
    waiting.append((target.reshape(-1).clone(), cluster_log_probs))
    if len(waiting) >= FOLD_EVERY or sum(lp.numel() for _, lp in waiting) > WAITING_ENTRIES:
        fold_waiting(head)


def replayed(head, rows: int) -> None:
    """The host side of :func:`observe` for a forward that ran in a replayed graph (the ring was written there)."""
    if head.frozen or not head._static or head._waiting_ring is None:
        return
    head._device_tokens.append(rows)
    head._waiting_ring.wrote()


def fold_if_full(head) -> None:
    """After an optimizer step: fold the ring once it holds :data:`FOLD_EVERY` batches (outside any graph)."""
    ring = head._waiting_ring
    if ring is not None and ring.waiting >= ring.capacity:
        fold_waiting(head)


def fold_waiting(head) -> None:
    """Fold the batches :func:`observe` kept waiting (in a list, or in the ring) into ``q``, in the order seen."""
    ring = head.__dict__.get("_waiting_ring")
    if ring is not None:
        taken = ring.take()
        if taken is not None:
            update_statistics(head, *taken)
    waiting = head.__dict__.pop("_unfolded", None)
    if not waiting:
        return
    if len(waiting) == 1:
        update_statistics(head, *waiting[0])
    else:
        update_statistics(head, torch.cat([t for t, _ in waiting]), torch.cat([lp for _, lp in waiting]))


def after_step(head) -> None:
    """Host-side bookkeeping of the batches :func:`observe` folded since the last optimizer step."""
    tokens = head.__dict__.get("_device_tokens")
    if not tokens:
        return
    if head.update_every is None:
        head._resolve_update_every(tokens[0])
    head.tokens_seen += sum(tokens)
    tokens.clear()


def count_step(head) -> int:
    """Add one to ``head.steps`` (on its device) and return the new count from a host-side mirror.

    The mirror is trusted while the buffer is the same tensor at the version the last
    call left it (a ``load_state_dict`` or any write bumps the version); otherwise the
    count is read once from the device.
    """
    steps = head.steps
    mirror = head.__dict__.get("_steps_mirror")
    if mirror is not None and mirror[0] is steps and mirror[1] == steps._version:
        value = mirror[2] + 1
    else:
        value = int(steps) + 1
    steps += 1
    head.__dict__["_steps_mirror"] = (steps, steps._version, value)
    return value


def step_count(head) -> int:
    """``head.steps`` as an int, from the host-side mirror of :func:`count_step` while it holds (else one read)."""
    steps = head.steps
    mirror = head.__dict__.get("_steps_mirror")
    if mirror is not None and mirror[0] is steps and mirror[1] == steps._version:
        return mirror[2]
    return int(steps)
