"""Several processes, one set of clusters: the self-organized head's statistics and assignment across ranks.

With several ranks (DistributedDataParallel, or gradients all-reduced by hand), every
rank keeps its batches' targets and cluster log-probabilities; after each optimizer
step they are folded into ``q`` on every rank in one order, and a re-assignment
runs Algorithm 1 on rank 0 and broadcasts the result, so every rank moves its
words, weights and optimizer state the same way.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import Tensor


def is_zero_redundancy(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is torch's ZeroRedundancyOptimizer (which shards its state across ranks).

    An instance of it means its module was imported, so the check imports nothing (importing
    ``torch.distributed.optim`` would compile its TorchScript optimizers on every attach).
    """
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


class RankSync:
    """Mixin of :class:`~sohsm.heads.SelfOrganizedSoftmax`: which ranks share its statistics and clusters.

    Keeps the process group (``_group_option``, ``_group``) and the observations not yet
    merged across ranks (``_pending``); folds them in with the head's ``update_statistics``.
    """

    def set_process_group(self, group="auto") -> None:
        """Which processes' tokens feed the statistics and share one assignment.

        ``"auto"`` (default): the process group of the
        :class:`~torch.nn.parallel.DistributedDataParallel` module the head runs
        inside, found at the first training forward; one process when there is
        none. ``None``: this process alone (every rank keeps its own clusters).
        A process group: those ranks, e.g. when gradients are all-reduced by hand.

        With several ranks, a training forward keeps its targets and cluster
        log-probabilities; after each optimizer step :meth:`merge_statistics` folds
        all ranks' batches into ``q`` as one process would fold them concatenated
        in rank order, and a re-assignment runs Algorithm 1 on rank 0 and
        broadcasts the result (:meth:`broadcast_assignment`): every rank then moves
        its words, weights and optimizer state the same way.
        """
        self._group_option = group
        self._group = None if group == "auto" else group

    def _find_group(self):
        """The process group of the statistics (``None``: one process), found at the first training forward."""
        if self._group is not None or self._group_option != "auto":
            return self._group
        if not (dist.is_available() and dist.is_initialized()):
            return None
        ddp = torch.nn.parallel.DistributedDataParallel._get_active_ddp_module()
        if ddp is not None and any(m is self for m in ddp.module.modules()) and (
                dist.get_world_size(ddp.process_group) > 1):
            self._group = ddp.process_group
        return self._group

    @torch.no_grad()
    def merge_statistics(self) -> None:
        """Fold the batches every rank observed since the last merge into ``q`` (a collective).

        Every rank of the process group must call it at the same point (the head
        does so itself after each step of an attached optimizer). The union is
        folded in rank order, each rank's batches in the order it saw them, so
        every rank ends with the same ``q`` that one process gets from that batch.
        Nothing to do in one process (each batch is folded at its forward).
        """
        group = self._group
        if group is None:
            return
        pending, self._pending = self._pending, []
        device = self.counts.device
        target = torch.cat([t for t, _ in pending]) if pending else torch.zeros(0, dtype=torch.long, device=device)
        log_probs = (torch.cat([lp for _, lp in pending]) if pending
                     else torch.zeros(0, self.n_clusters, dtype=torch.float32, device=device))
        world = dist.get_world_size(group)
        size = torch.tensor([target.numel()], device=device)
        sizes = [torch.zeros_like(size) for _ in range(world)]
        dist.all_gather(sizes, size, group=group)
        sizes = [int(n) for n in sizes]
        width = max(sizes)
        if width == 0:
            return
        pad = width - target.numel()
        target = torch.cat([target, target.new_zeros(pad)])
        log_probs = torch.cat([log_probs, log_probs.new_zeros(pad, self.n_clusters)])
        targets = [torch.empty_like(target) for _ in range(world)]
        all_log_probs = [torch.empty_like(log_probs) for _ in range(world)]
        dist.all_gather(targets, target, group=group)
        dist.all_gather(all_log_probs, log_probs, group=group)
        target = torch.cat([t[:n] for t, n in zip(targets, sizes)])
        log_probs = torch.cat([lp[:n] for lp, n in zip(all_log_probs, sizes)])
        self.tokens_seen += target.numel()
        self.update_statistics(target, log_probs)

    @torch.no_grad()
    def broadcast_assignment(self, assignment: Tensor | None, fallback_words: int = 0) -> tuple[Tensor, int]:
        """Rank 0's ``(assignment, fallback_words)`` on every rank of the process group (a collective).

        Rank 0 passes its Algorithm 1 result; the others may pass ``None``. The
        assignment is sent, not recomputed on each rank: on a GPU, ``index_add_``
        is not bit-deterministic, so ranks' ``q`` may differ in the last bits.
        """
        group = self._group
        if group is None:
            return assignment, fallback_words
        payload = torch.zeros(self.n_classes + 1, dtype=torch.long, device=self.assignment.device)
        if dist.get_rank(group) == 0:
            payload[:-1] = assignment
            payload[-1] = fallback_words
        dist.broadcast(payload, src=dist.get_global_rank(group, 0), group=group)
        return payload[:-1], int(payload[-1])
