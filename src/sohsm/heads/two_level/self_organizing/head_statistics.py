"""What the self-organized head does with its statistics: each training batch handed to them, ``q`` read, moved by
``.to()`` and kept in the state dict, and shared by several processes (over the head's
:class:`~sohsm.heads.two_level.self_organizing.rank_sync.RankGroup`).

:class:`HeadStatistics` is mixed into :class:`~sohsm.heads.SelfOrganizedSoftmax`, so that these stay the head's
methods (``head.q``, ``head.update_statistics``, the training forward's hooks); the state is the head's
:class:`~sohsm.heads.two_level.self_organizing.cluster_statistics.ClusterStatistics` (``q``, the waiting batches)
and :class:`~sohsm.heads.two_level.self_organizing.recluster_schedule.ReclusterSchedule` (the tokens seen). What it
reads of the head beyond a :class:`~sohsm.heads.base.SelfOrganizingHead` is declared in the class body, under
``TYPE_CHECKING``.
"""
from __future__ import annotations

import inspect
import os
import warnings
import weakref
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from sohsm.heads.two_level.ops import ClusterLayout
from sohsm.heads.two_level.self_organizing.cluster_statistics import ClusterStatistics
from sohsm.heads.two_level.self_organizing.rank_sync import RankGroup
from sohsm.heads.two_level.self_organizing.recluster_schedule import ReclusterSchedule


def _user_stacklevel() -> int:
    """``stacklevel`` that makes a warning point at the first frame outside torch and the heads."""
    heads = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    inside = (os.path.dirname(torch.__file__), heads)
    here = inspect.currentframe()  # the public frame API (``None`` only on a Python without frames)
    frame, level = (here.f_back if here is not None else None), 1  # level 1: the function that warns
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


if TYPE_CHECKING:  # for the checker the mixin is the kind of head it is mixed into; at run time a plain class
    from sohsm.heads.base import SelfOrganizingHead as _Head
else:
    _Head = object


class HeadStatistics(_Head):
    """Mixin of :class:`~sohsm.heads.SelfOrganizedSoftmax`: its statistics as seen through the head (see the module).

    Its methods read of the head only what a SelfOrganizingHead has and its ``TYPE_CHECKING`` block declares, besides
    each other (``tests/heads/two_level/test_host_protocols.py`` checks it).
    """

    if TYPE_CHECKING:  # what it reads of the head beyond a SelfOrganizingHead's (the host test reads this block)
        counts: Tensor
        statistics: ClusterStatistics
        schedule: ReclusterSchedule
        ranks: RankGroup
        _layout_cache: ClusterLayout | None
        _optimizers: weakref.WeakKeyDictionary
        _warned_unattached: bool

        def _corpus_counts(self) -> Tensor | None: ...

    # -- a training batch ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _observe(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """A training batch's cluster log-probabilities, eagerly: folded in now (one process) or kept for the merge
        of the ranks' batches after the optimizer step."""
        # torch has no public way to ask whether this forward runs inside a backward pass (activation
        # checkpointing recomputes it there); its graph task id is -1 outside one
        if self.frozen or torch._C._current_graph_task_id() != -1:
            return  # a forward recomputed during backward (activation checkpointing) was already seen
        group = self.ranks.find(self)
        if self.update_every is None:  # ranks are taken to get equal shares
            self.schedule.resolve(target.numel() * self.ranks.world(), self._corpus_counts())
        if self.update_every and not self._optimizers and not self._warned_unattached:
            warnings.warn(
                "SelfOrganizedSoftmax is training without an attached optimizer, so its clusters "
                "are not re-learned; call head.attach(optimizer) once, or head.reassign() yourself",
                stacklevel=_user_stacklevel(),
            )
            self._warned_unattached = True
        if group is None:
            self.schedule.saw(target.numel(), self._corpus_counts())
            self.statistics.fold(target, cluster_log_probs, self.counts)
        else:
            self.ranks.keep(target, cluster_log_probs)

    def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """:meth:`_observe` reading nothing back: the batch folded with static shapes, or kept waiting
        (:meth:`ClusterStatistics.wait`); the tokens are counted at the next optimizer step. With several
        processes the statistics go through the eager merge (which reads sizes back); inside ``torch.compile``
        one process is assumed."""
        self.statistics.require_dense()
        compiling = torch.compiler.is_compiling()
        if not compiling:
            if torch._C._current_graph_task_id() != -1:
                return  # a forward recomputed during backward (activation checkpointing) was already seen
            if self.ranks.find(self) is not None:
                self._observe(target, cluster_log_probs)
                return
        if self.frozen:
            return
        self.schedule.saw_later(target.numel())
        if compiling:  # a graph folds at once
            self.statistics.fold_on_device(target, cluster_log_probs, self.counts)
        else:
            self.statistics.wait(target, cluster_log_probs, self.counts)

    # -- a training step replayed from a captured CUDA graph ------------------------------------------------
    def set_static(self, static: bool) -> None:
        """In a static step the sync-free path's waiting batches go to a fixed ring on the device, folded after the
        optimizer step that fills it (a captured graph replays the copy into the ring, never the fold)."""
        self.statistics.set_static(static, self.counts)
        super().set_static(static)

    def replayed(self, rows: int) -> None:
        """The host side of :meth:`_observe_sync_free` for a forward that ran in a replayed graph."""
        if not self.frozen and self.statistics.waiting.replayed():
            self.schedule.saw_later(rows)

    def static_fingerprint(self) -> tuple:
        """The ring's serial, and whether the head is frozen: a frozen head's step writes no ring (a graph captured
        before the freeze would write one every replay, uncounted, until it wrote past the ring's end)."""
        ring = self.statistics.waiting.ring
        return (*super().static_fingerprint(), None if ring is None else ring.serial, self.frozen)

    def step_tensors(self) -> list[Tensor]:
        """The ring of waiting batches, which a static step writes (:meth:`Head.step_tensors`)."""
        ring = self.statistics.waiting.ring
        return [] if ring is None else ring.tensors()

    def host_state(self):
        ring = self.statistics.waiting.ring
        return list(self.schedule.unsettled), ring, None if ring is None else ring.waiting

    def restore_host_state(self, state) -> None:
        tokens, ring, waiting = state
        self.schedule.unsettled[:] = tokens
        self.statistics.waiting.ring = ring
        if ring is not None:
            ring.waiting = waiting

    # -- q read, moved and saved ---------------------------------------------------------------------------
    @property
    def q(self) -> Tensor | None:
        """``[N, C_learned]`` statistics (log2), dense; ``None`` when kept compact. Batches the sync-free path keeps
        waiting are folded in before it is read."""
        self.statistics.fold_waiting(self.counts)
        return self.statistics.dense

    @q.setter
    def q(self, value: Tensor | None) -> None:
        self.statistics.dense = value

    def update_statistics(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Fold one batch into ``q`` (Eq. 9; :meth:`ClusterStatistics.fold`): ``target`` ``[B]``, ``cluster_log_probs``
        ``[B, n_clusters]`` natural-log ``log P(c | h)``."""
        self.statistics.fold(target, cluster_log_probs, self.counts)

    def statistics_rows(self):
        """``q`` as Algorithm 1 reads it: the dense tensor, or a :class:`CompactRows` view of the compact one."""
        self.statistics.fold_waiting(self.counts)
        return self.statistics.rows()

    def q_device(self) -> torch.device:
        """The device ``q`` lives on (the head's, after ``.to()``)."""
        return self.statistics.device

    def statistics_bytes(self) -> int:
        """Bytes ``q`` holds: ``N * C_learned * 4`` dense, ``N * (2M + 1) * 4`` compact (float32)."""
        return self.statistics.nbytes()

    def _apply(self, fn, recurse=True):
        self.statistics.fold_waiting(self.counts)  # on the device the batches wait on
        result = super()._apply(fn, recurse)
        self.statistics.apply(fn)
        return result

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        self.statistics.fold_waiting(self.counts)
        for name, tensor in self.statistics.tensors().items():
            destination[prefix + name] = tensor

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self.statistics.fold_waiting(self.counts)  # what waited belongs to the q the loaded one replaces
        self.statistics.load(state_dict, prefix, missing_keys, unexpected_keys, error_msgs)

    # -- several processes: one set of statistics and clusters over the head's RankGroup (``head.ranks``) ----------
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
        self.ranks.choose(group)

    @torch.no_grad()
    def merge_statistics(self) -> None:
        """Fold the batches every rank observed since the last merge into ``q`` (a collective).

        Every rank of the process group must call it at the same point (the head
        does so itself after each step of an attached optimizer). The union is
        folded in rank order, each rank's batches in the order it saw them, so
        every rank ends with the same ``q`` that one process gets from that batch.
        Nothing to do in one process (each batch is folded at its forward).
        """
        batch = self.ranks.gather(self.n_clusters, self.counts.device)
        if batch is None:
            return
        self.schedule.saw(batch[0].numel(), self._corpus_counts())
        self.update_statistics(*batch)

    def broadcast_assignment(self, assignment: Tensor | None, fallback_words: int = 0) -> tuple[Tensor, int]:
        """Rank 0's ``(assignment, fallback_words)`` on every rank of the process group (a collective;
        :meth:`RankGroup.broadcast`)."""
        return self.ranks.broadcast(assignment, fallback_words, self.n_classes, self.assignment.device)
