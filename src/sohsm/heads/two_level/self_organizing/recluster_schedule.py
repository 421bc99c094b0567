"""When the self-organized head re-clusters: every ``K`` optimizer steps, growing, until it freezes.

The head hooks the optimizer it is attached to (:meth:`ReclusterSchedule.attach`);
after each step it merges the ranks' statistics, counts the step, and runs
Algorithm 1 when the step is due (``first_update``, then every ``update_every`` = K, ``update_growth``), or
re-assigns one last time and freezes once ``freeze_after_tokens`` tokens are seen.
Without a given K, K follows from the epoch length (about ``reclusters_per_epoch``
re-clusterings an epoch), fixed at the first training batch.
"""
from __future__ import annotations

import torch

from sohsm.heads.two_level.self_organizing import device_statistics
from sohsm.heads.two_level.self_organizing.rank_sync import is_zero_redundancy


class ReclusterSchedule:
    """Mixin of :class:`~sohsm.heads.SelfOrganizedSoftmax`: attaches to an optimizer and re-clusters on schedule.

    Reads the head's ``update_every``, ``first_update``, ``update_growth``, ``reclusters_per_epoch``,
    ``freeze_after_tokens``, ``counts`` and ``steps``; calls its ``reassign`` and ``freeze``.
    """

    def attach(self, optimizer: torch.optim.Optimizer):
        """Re-cluster automatically every ``update_every`` steps of ``optimizer``.

        Registers a post-step hook on the optimizer; the optimizer's state for
        :attr:`weight` then follows the words when they move. Call once after
        building the optimizer (again after re-building it). Attaching the same
        optimizer again changes nothing (its steps are counted once) and returns
        the same handle. The head holds its optimizers weakly: one its owner drops
        is not kept alive. Returns the hook handle.
        """
        self._check_optimizer(optimizer, needs_parameters=False)
        if is_zero_redundancy(optimizer):
            raise ValueError(
                "SelfOrganizedSoftmax cannot follow a ZeroRedundancyOptimizer: its state for the head's "
                "weight lives on one rank only, so a re-assignment could not move it with the words. "
                "Use a plain optimizer under DistributedDataParallel."
            )
        self._check_optimizer(optimizer)
        handle = self._optimizers.get(optimizer)
        if handle is None:
            handle = optimizer.register_step_post_hook(self._after_optimizer_step)
            self._optimizers[optimizer] = handle
        return handle

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not self.training:
            return
        self.merge_statistics()
        device_statistics.after_step(self)  # the sync-free path's host-side bookkeeping
        device_statistics.fold_if_full(self)  # a static step's ring of waiting batches, once full
        step = device_statistics.count_step(self)  # self.steps += 1, counted on the host
        if self.frozen:
            return
        if self.freeze_after_tokens is not None and self.tokens_seen >= self.freeze_after_tokens:
            self._drop_spent_gradient()
            self.reassign(optimizer)
            self.freeze(optimizer)
            return
        if self.update_every and self.is_reassign_step(step):
            self._drop_spent_gradient()
            self.reassign(optimizer)

    def _drop_spent_gradient(self) -> None:
        """Before a re-clustering that follows ``optimizer.step()``: the step has used the weight's gradient, so it
        is dropped (``weight.grad = None``, as ``zero_grad()`` does) instead of moved with the words, an ``N x d``
        gather no one reads. The head's reused buffer stays allocated; its next step zeroes it whole."""
        for weight in self._word_params():
            weight.grad = None

    def is_reassign_step(self, step: int) -> bool:
        """Whether Algorithm 1 runs after optimizer step ``step`` (``first_update``, then ``update_every``, growing).

        A function of the step alone, so a resumed run re-clusters where the uninterrupted one would.
        """
        k = self.update_every
        if not k or step <= 0:
            return False
        first = self.first_update or k
        if step <= first:
            return step == first
        if self.update_growth == 1.0:
            return (step - first) % k == 0
        interval, due = float(k), first
        while due < step:
            interval *= self.update_growth
            due += max(1, round(interval))
        return due == step

    def _resolve_update_every(self, batch_tokens: int) -> None:
        """``K`` for ``update_every=None``: about ``reclusters_per_epoch`` re-clusterings per epoch.

        An epoch is ``sum(counts)`` tokens; a step is taken to read as many tokens as
        the first training batch. Without corpus counts the paper's K = 1000 is used.
        """
        if not self.counts_given or batch_tokens <= 0:
            self.update_every = 1000
            return
        steps_per_epoch = float(self.counts.sum()) / batch_tokens
        self.update_every = max(1, round(steps_per_epoch / self.reclusters_per_epoch))

    def describe_schedule(self, tokens_per_step: int | None = None) -> str:
        """K as the head will use it, for a run's start-up lines: ``"K 43 (auto, ≈8 per epoch)"``, and
        ``", the first after step 228"`` where ``first_update`` says.

        Without a given K the head chooses it at its first batch from the epoch length
        (``sum(counts) / tokens_per_step`` steps) and :attr:`reclusters_per_epoch`;
        this computes the same number in advance.
        """
        k = self.update_every
        if k == 0:
            return "K 0 (never re-clusters)"
        first = "" if self.first_update is None else f", the first after step {self.first_update}"
        if k is not None:
            return f"K {k}{first}"
        if not self.counts_given or not tokens_per_step:
            return f"K auto{first}"
        steps_per_epoch = float(self.counts.sum()) / tokens_per_step
        k = max(1, round(steps_per_epoch / self.reclusters_per_epoch))
        return f"K {k} (auto, ≈{self.reclusters_per_epoch:g} per epoch){first}"
