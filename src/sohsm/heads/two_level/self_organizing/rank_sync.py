"""Several processes, one set of clusters: the self-organized head's statistics and assignment across ranks.

With several ranks (DistributedDataParallel, or gradients all-reduced by hand), every
rank keeps its batches' targets and cluster log-probabilities; after each optimizer
step they are folded into ``q`` on every rank in one order, and a re-assignment
runs Algorithm 1 on rank 0 and broadcasts the result, so every rank moves its
words, weights and optimizer state the same way. :class:`RankGroup` does the collectives; the head's methods over
it (``set_process_group``, ``merge_statistics``, ``broadcast_assignment``) are its statistics' own
(:class:`~sohsm.heads.two_level.self_organizing.head_statistics.HeadStatistics`).
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


class RankGroup:
    """Which ranks share the statistics and clusters, and the observations not yet merged across them.

    Args:
        option: ``"auto"`` (the process group of the DistributedDataParallel module the head runs in, found at
            the first training forward), ``None`` (this process alone) or a process group.
    """

    def __init__(self, option="auto") -> None:
        self.option = option
        #: the process group found (``None``: one process)
        self.group = None if option == "auto" else option
        #: ``(targets, cluster log-probabilities)`` of the batches seen since the last merge
        self.pending: list[tuple[Tensor, Tensor]] = []

    def choose(self, option="auto") -> None:
        """Another ``option`` (see the class); the batches kept wait for the next merge as before."""
        self.option, self.group = option, None if option == "auto" else option

    def find(self, module: torch.nn.Module):
        """The process group of the statistics (``None``: one process): with ``"auto"``, that of the active
        DistributedDataParallel module holding ``module``, once one with several ranks runs it."""
        if self.group is not None or self.option != "auto":
            return self.group
        if not (dist.is_available() and dist.is_initialized()):
            return None
        ddp = torch.nn.parallel.DistributedDataParallel._get_active_ddp_module()
        if ddp is not None and any(m is module for m in ddp.module.modules()) and (
                dist.get_world_size(ddp.process_group) > 1):
            self.group = ddp.process_group
        return self.group

    def world(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    def leads(self) -> bool:
        """Whether this process runs Algorithm 1 (one process, or rank 0 of the group)."""
        return self.group is None or dist.get_rank(self.group) == 0

    def keep(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Keep a batch until the next merge."""
        self.pending.append((target.detach().clone(), cluster_log_probs.detach().float()))

    @torch.no_grad()
    def gather(self, n_clusters: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """Every rank's kept batches, in rank order, each rank's in the order it saw them (a collective; ``None``
        in one process, or when no rank kept any)."""
        group = self.group
        if group is None:
            return None
        pending, self.pending = self.pending, []
        target = torch.cat([t for t, _ in pending]) if pending else torch.zeros(0, dtype=torch.long, device=device)
        log_probs = (torch.cat([lp for _, lp in pending]) if pending
                     else torch.zeros(0, n_clusters, dtype=torch.float32, device=device))
        world = dist.get_world_size(group)
        size = torch.tensor([target.numel()], device=device)
        gathered = [torch.zeros_like(size) for _ in range(world)]
        dist.all_gather(gathered, size, group=group)
        sizes = [int(n) for n in gathered]
        width = max(sizes)
        if width == 0:
            return None
        pad = width - target.numel()
        target = torch.cat([target, target.new_zeros(pad)])
        log_probs = torch.cat([log_probs, log_probs.new_zeros(pad, n_clusters)])
        targets = [torch.empty_like(target) for _ in range(world)]
        all_log_probs = [torch.empty_like(log_probs) for _ in range(world)]
        dist.all_gather(targets, target, group=group)
        dist.all_gather(all_log_probs, log_probs, group=group)
        return (torch.cat([t[:n] for t, n in zip(targets, sizes)]),
                torch.cat([lp[:n] for lp, n in zip(all_log_probs, sizes)]))

    @torch.no_grad()
    def broadcast(self, assignment: Tensor | None, fallback_words: int, n_classes: int,
                  device: torch.device) -> tuple[Tensor, int]:
        """Rank 0's ``(assignment, fallback_words)`` on every rank of the group (a collective).

        Rank 0 passes its Algorithm 1 result; the others may pass ``None``. The
        assignment is sent, not recomputed on each rank: on a GPU, ``index_add_``
        is not bit-deterministic, so ranks' ``q`` may differ in the last bits.
        """
        group = self.group
        if group is None:
            assert assignment is not None  # one process: rank 0, which passes its own
            return assignment, fallback_words
        payload = torch.zeros(n_classes + 1, dtype=torch.long, device=device)
        if dist.get_rank(group) == 0:
            assert assignment is not None  # rank 0 passes its Algorithm 1 result
            payload[:-1] = assignment
            payload[-1] = fallback_words
        dist.broadcast(payload, src=dist.get_global_rank(group, 0), group=group)
        return payload[:-1], int(payload[-1])
