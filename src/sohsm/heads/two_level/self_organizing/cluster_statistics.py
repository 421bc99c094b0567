"""The self-organized head's cluster statistics ``q`` (Eq. 9-10 of the paper).

For every word ``w`` a row ``q[w]`` estimates ``E[log2 P(c | context) | next word = w]``
for every learned cluster ``c``. After each training batch the cluster
log-probabilities of the forward pass update the rows of the batch's target words::

    q[w] <- lambda(w) * q[w] + (1 - lambda(w)) * log2 P(. | h)

Algorithm 1 (:meth:`SelfOrganizedSoftmax.reassign`) reads ``q`` to re-assign the
words. This is the eager update, which reads back to the host;
:mod:`sohsm.heads.two_level.self_organizing.device_statistics` is the same update with static shapes (the
sync-free path). With several processes a batch's statistics wait for
:meth:`~sohsm.heads.rank_sync.RankSync.merge_statistics`.
"""
from __future__ import annotations

import inspect
import math
import os
import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from sohsm.heads.two_level.self_organizing import compact_statistics, device_statistics

_LN2 = math.log(2.0)

#: smoothing rules of the cluster statistics q (Eq. 10)
SMOOTHING = ("epoch", "paper_literal")


def _user_stacklevel() -> int:
    """``stacklevel`` that makes a warning point at the first frame outside torch and these heads."""
    inside = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    frame, level = inspect.currentframe().f_back, 1  # level 1: the function that warns (the public frame API)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class ClusterStatistics:
    """Mixin of :class:`~sohsm.heads.SelfOrganizedSoftmax`: folds training batches into ``q``.

    ``q`` (``[N, C_learned]`` floats, log2) is saved in the state dict like a buffer but not
    registered as one (DDP would broadcast all of it every forward). With ``q_clusters`` set, ``q`` is
    ``None`` and ``q_index``, ``q_values`` and ``q_rest`` hold it compact
    (:mod:`sohsm.heads.two_level.self_organizing.compact_statistics`); :meth:`statistics_rows` reads either. The head's ``counts``,
    ``counts_given``, ``smoothing``, ``shortlist``, ``tokens_seen`` and ``frozen`` say how a
    batch is folded in.
    """

    def _smoothing_factor(self, counts: Tensor) -> Tensor:
        """``lambda(w)`` for the given counts (float64)."""
        f = counts.to(torch.float64).clamp(min=1.0)
        return 1.0 / f if self.smoothing == "paper_literal" else 1.0 - 1.0 / f

    @torch.no_grad()
    def _observe(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        # torch has no public way to ask whether this forward runs inside a backward pass (activation
        # checkpointing recomputes it there); its graph task id is -1 outside one
        if self.frozen or torch._C._current_graph_task_id() != -1:
            return  # a forward recomputed during backward (activation checkpointing) was already seen
        group = self._find_group()
        world = 1 if group is None else dist.get_world_size(group)
        if self.update_every is None:
            self._resolve_update_every(target.numel() * world)  # ranks are taken to get equal shares
        if self.update_every and not self._optimizers and not self._warned_unattached:
            warnings.warn(
                "SelfOrganizedSoftmax is training without an attached optimizer, so its clusters "
                "are not re-learned; call head.attach(optimizer) once, or head.reassign() yourself",
                stacklevel=_user_stacklevel(),
            )
            self._warned_unattached = True
        if group is None:
            self.tokens_seen += target.numel()
            self.update_statistics(target, cluster_log_probs)
        else:
            self._pending.append((target.detach().clone(), cluster_log_probs.detach().float()))

    def _observe_sync_free(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        if self.q_clusters is not None:
            raise ValueError(f"the sync-free path keeps the dense statistics only: q_clusters must be None there, "
                             f"got q_clusters={self.q_clusters}")
        device_statistics.observe(self, target, cluster_log_probs)

    @torch.no_grad()
    def update_statistics(self, target: Tensor, cluster_log_probs: Tensor) -> None:
        """Fold one batch into ``q`` (Eq. 9), exactly as one update per token in batch order would.

        Token ``t`` (word ``w``) sees the smoothing ``lambda_t = lambda(f_t)``, where ``f_t`` is
        ``counts[w]``, or, when the head counts targets itself, the count including ``t``. Then
        ``q[w]`` keeps ``prod_t lambda_t`` of its old row and token ``t`` enters with weight
        ``(1 - lambda_t) * prod_{s after t} lambda_s`` (products over the occurrences of ``w``).

        Rows with a NaN or ``+inf`` log-probability (a non-finite hidden state) are
        skipped: folded in, they would poison their word's row of ``q`` for good.

        Args:
            target: ``[B]`` word ids.
            cluster_log_probs: ``[B, n_clusters]`` natural-log ``log P(c | h)`` of each row (the shortlist
                words' columns are not kept).
        """
        target = target.reshape(-1)
        cluster_log_probs = cluster_log_probs[:, self.shortlist:]  # the learned clusters' columns
        bad = (cluster_log_probs.isnan() | (cluster_log_probs == math.inf)).any(dim=1)
        if bool(bad.any()):
            target, cluster_log_probs = target[~bad], cluster_log_probs[~bad]
            if target.numel() == 0:
                return
        n = target.numel()
        words, inverse, repeats = torch.unique(target, return_inverse=True, return_counts=True)
        # order the tokens by word, keeping batch order within a word; rank = occurrence number
        by_word = torch.sort(inverse, stable=True).indices
        first = repeats.cumsum(0) - repeats
        rank_sorted = torch.arange(n, device=target.device) - first[inverse[by_word]]
        counts = self.counts.to(torch.float64)
        if self.counts_given:
            seen = counts[target[by_word]]
        else:
            seen = counts[target[by_word]] + rank_sorted + 1
            self.counts.index_add_(0, target, torch.ones_like(target, dtype=self.counts.dtype))
        lam = self._smoothing_factor(seen)  # [n], sorted by word
        # log-products of lambda; lambda = 0 (a word's first occurrence ever) becomes exp(-1e4) = 0
        log_lam = lam.log().clamp(min=-1e4).cumsum(0)
        last = first + repeats - 1
        before_group = torch.where(first > 0, log_lam[(first - 1).clamp(min=0)], torch.zeros_like(log_lam[first]))
        decay = (log_lam[last] - before_group).exp()  # [U]
        weight = (1.0 - lam) * (log_lam[last][inverse[by_word]] - log_lam).exp()  # [n]
        # log P(c | h) of an empty cluster is -inf: floor it so that q stays finite
        samples = (cluster_log_probs[by_word] / _LN2).clamp(min=-1e4)
        if self.q_clusters is not None:  # the compact form: the same update of the rows it stands for
            dtype = self.q_values.dtype  # the products in q's dtype, as below: M == C is the dense q bit for bit
            compact_statistics.fold(self.q_index, self.q_values, self.q_rest, words, decay, inverse[by_word],
                                    samples.to(dtype) * weight.to(dtype)[:, None])
            return
        self.q[words] *= decay.to(self.q.dtype)[:, None]
        self.q.index_add_(0, target[by_word], samples.to(self.q.dtype) * weight.to(self.q.dtype)[:, None])
    # -- q is kept in the state dict, moved by .to() and the like, but not a buffer ------------
    @property
    def q(self) -> Tensor | None:
        """``[N, C_learned]`` statistics (log2), dense; ``None`` when kept compact. Batches the sync-free path keeps
        waiting (:mod:`~sohsm.heads.two_level.self_organizing.device_statistics`) are folded in before it is read."""
        device_statistics.fold_waiting(self)
        return self.__dict__["_q"]

    @q.setter
    def q(self, value: Tensor | None) -> None:
        self.__dict__["_q"] = value

    def _statistics(self) -> dict[str, Tensor]:
        """The tensors of ``q`` by state-dict name: ``q`` (dense), or ``q_index``, ``q_values``, ``q_rest``."""
        if self.q_clusters is None:
            return {"q": self.q}
        return {"q_index": self.q_index, "q_values": self.q_values, "q_rest": self.q_rest}

    def statistics_rows(self):
        """``q`` as Algorithm 1 reads it: the dense tensor, or a :class:`CompactRows` view of the compact one."""
        if self.q_clusters is None:
            return self.q
        return compact_statistics.CompactRows(self.q_index, self.q_values, self.q_rest,
                                              self.n_clusters - self.shortlist)

    def q_device(self) -> torch.device:
        """The device ``q`` lives on (the head's, after ``.to()``)."""
        return next(iter(self._statistics().values())).device

    def statistics_bytes(self) -> int:
        """Bytes ``q`` holds: ``N * C_learned * 4`` dense, ``N * (2M + 1) * 4`` compact (float32)."""
        return sum(t.numel() * t.element_size() for t in self._statistics().values())

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        for name, tensor in self._statistics().items():  # reading q folded what waited
            setattr(self, name, fn(tensor))
        self._waiting_ring = None  # empty now; the next static step makes one where the head now is
        return result

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, tensor in self._statistics().items():
            destination[prefix + name] = tensor

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for name, tensor in self._statistics().items():
            key = prefix + name
            if key in unexpected_keys:
                unexpected_keys.remove(key)
            if key not in state_dict:
                missing_keys.append(key)
            elif state_dict[key].shape != tensor.shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{tuple(state_dict[key].shape)} from checkpoint, the shape in current model is "
                                  f"{tuple(tensor.shape)}.")
            else:
                with torch.no_grad():
                    tensor.copy_(state_dict[key])
