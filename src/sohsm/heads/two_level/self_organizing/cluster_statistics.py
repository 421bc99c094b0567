"""The self-organized head's cluster statistics ``q`` (Eq. 9-10 of the paper), as an object that owns them.

For every word ``w`` a row ``q[w]`` estimates ``E[log2 P(c | context) | next word = w]``
for every learned cluster ``c``. After each training batch the cluster
log-probabilities of the forward pass update the rows of the batch's target words::

    q[w] <- lambda(w) * q[w] + (1 - lambda(w)) * log2 P(. | h)

Algorithm 1 (:meth:`SelfOrganizedSoftmax.reassign`) reads ``q`` to re-assign the
words. :class:`ClusterStatistics` holds ``q`` (dense, or compact:
:mod:`~sohsm.heads.two_level.self_organizing.compact_statistics`), the batches the sync-free path keeps
waiting (:mod:`~sohsm.heads.two_level.self_organizing.device_statistics`), and how a batch is folded in;
its methods take tensors (a batch, the head's ``counts``), never the head.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from sohsm.heads.two_level.self_organizing import compact_statistics, device_statistics
from sohsm.heads.two_level.self_organizing.reclustering import smoothing_factor

_LN2 = math.log(2.0)


class ClusterStatistics:
    """The statistics ``q`` of a self-organized head, and the batches waiting to be folded into them.

    Args:
        n_classes: ``N``, the words (rows).
        learned: the learned clusters (columns): a shortlist word never moves, and no word moves to a
            shortlist word's cluster, so only the learned clusters need statistics.
        shortlist: ``S``, the leading columns of a batch's cluster log-probabilities that ``q`` does not keep.
        start: every entry's first value (log2 of the uniform cluster distribution: "no information").
        smoothing: the rule of ``lambda`` (:func:`~.reclustering.smoothing_factor`).
        q_clusters: ``M``, keep each word's top ``M`` clusters only (``None``: the dense ``q``).
        counts_given: the counts handed to the folds are the corpus's (else the targets seen are counted into them).
    """

    def __init__(self, n_classes: int, learned: int, shortlist: int, start: float, smoothing: str,
                 q_clusters: int | None, counts_given: bool) -> None:
        self.learned, self.shortlist, self.smoothing = learned, shortlist, smoothing
        self.q_clusters = q_clusters
        self.counts_given = counts_given
        #: ``[N, C_learned]`` dense statistics (log2), or ``None`` when kept compact in the three below
        self.dense: Tensor | None = None
        self.index: Tensor | None = None  # [N, M] int32 kept cluster ids
        self.values: Tensor | None = None  # [N, M] their values
        self.rest: Tensor | None = None  # [N] the value of every cluster not kept
        if q_clusters is None:
            self.dense = torch.full((n_classes, learned), start)
        else:  # every cluster starts at the uniform value; the first M are the ones kept
            self.index = torch.arange(q_clusters, dtype=torch.int32).repeat(n_classes, 1)
            self.values = torch.full((n_classes, q_clusters), start)
            self.rest = torch.full((n_classes,), start)
        #: the sync-free path's batches not yet folded in
        self.waiting = device_statistics.Waiting()

    # -- folding batches in ---------------------------------------------------------------------------
    @torch.no_grad()
    def fold(self, target: Tensor, cluster_log_probs: Tensor, counts: Tensor) -> None:
        """Fold one batch into ``q`` (Eq. 9), exactly as one update per token in batch order would.

        Token ``t`` (word ``w``) sees the smoothing ``lambda_t = lambda(f_t)``, where ``f_t`` is
        ``counts[w]``, or, when the head counts targets itself, the count including ``t`` (the batch's targets
        are then added to ``counts``). Then ``q[w]`` keeps ``prod_t lambda_t`` of its old row and token ``t``
        enters with weight ``(1 - lambda_t) * prod_{s after t} lambda_s`` (products over the occurrences of ``w``).

        Rows with a NaN or ``+inf`` log-probability (a non-finite hidden state) are
        skipped: folded in, they would poison their word's row of ``q`` for good.

        Args:
            target: ``[B]`` word ids.
            cluster_log_probs: ``[B, n_clusters]`` natural-log ``log P(c | h)`` of each row (the shortlist
                words' columns are not kept).
            counts: ``[N]`` the words' counts.
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
        counts_f = counts.to(torch.float64)
        if self.counts_given:
            seen = counts_f[target[by_word]]
        else:
            seen = counts_f[target[by_word]] + rank_sorted + 1
            counts.index_add_(0, target, torch.ones_like(target, dtype=counts.dtype))
        lam = smoothing_factor(seen, self.smoothing)  # [n], sorted by word
        # log-products of lambda; lambda = 0 (a word's first occurrence ever) becomes exp(-1e4) = 0
        log_lam = lam.log().clamp(min=-1e4).cumsum(0)
        last = first + repeats - 1
        before_group = torch.where(first > 0, log_lam[(first - 1).clamp(min=0)], torch.zeros_like(log_lam[first]))
        decay = (log_lam[last] - before_group).exp()  # [U]
        weight = (1.0 - lam) * (log_lam[last][inverse[by_word]] - log_lam).exp()  # [n]
        # log P(c | h) of an empty cluster is -inf: floor it so that q stays finite
        samples = (cluster_log_probs[by_word] / _LN2).clamp(min=-1e4)
        if self.q_clusters is not None:  # the compact form: the same update of the rows it stands for
            assert self.index is not None and self.values is not None and self.rest is not None
            dtype = self.values.dtype  # the products in q's dtype, as below: M == C is the dense q bit for bit
            compact_statistics.fold(self.index, self.values, self.rest, words, decay, inverse[by_word],
                                    samples.to(dtype) * weight.to(dtype)[:, None])
            return
        q = self.dense
        assert q is not None  # the dense form (no q_clusters)
        q[words] *= decay.to(q.dtype)[:, None]
        q.index_add_(0, target[by_word], samples.to(q.dtype) * weight.to(q.dtype)[:, None])

    def require_dense(self) -> None:
        """Refuse the compact form where only the dense ``q`` is folded (the sync-free path)."""
        if self.q_clusters is not None:
            raise ValueError(f"the sync-free path keeps the dense statistics only: q_clusters must be None there, "
                             f"got q_clusters={self.q_clusters}")

    def fold_on_device(self, target: Tensor, cluster_log_probs: Tensor, counts: Tensor) -> None:
        """:meth:`fold` with static shapes, reading nothing back (the dense ``q`` only): the sync-free path's."""
        self.require_dense()
        assert self.dense is not None
        device_statistics.fold(self.dense, counts, self.counts_given, self.smoothing, self.shortlist, target,
                               cluster_log_probs)

    def wait(self, target: Tensor, cluster_log_probs: Tensor, counts: Tensor) -> None:
        """Fold a batch of the sync-free path, or keep it waiting to be folded with the next ones (with the corpus
        counts given: counting targets, the counts must not wait)."""
        if not self.counts_given:
            self.fold_on_device(target, cluster_log_probs, counts)
            return
        for batch in self.waiting.add(target, cluster_log_probs):
            self.fold_on_device(*batch, counts)

    def fold_waiting(self, counts: Tensor) -> None:
        """Fold the batches kept waiting into ``q``, in the order seen."""
        for batch in self.waiting.take():
            self.fold_on_device(*batch, counts)

    def set_static(self, static: bool, counts: Tensor) -> None:
        """In a static step the waiting batches go to a fixed ring on the device (:class:`device_statistics.Waiting`);
        leaving it folds them and drops the ring."""
        if not static:
            self.fold_waiting(counts)
            self.waiting.ring = None
        self.waiting.static = bool(static)

    @torch.no_grad()
    def seed(self, q: Tensor) -> None:
        """Start from ``q`` (``[N, C_learned]``, log2), known before training, in place of "no information": a
        head that takes over a trained layer knows each word's clusters from it, and a re-clustering from the
        uniform start would move every word its first steps did not show (compact: each word's top
        ``q_clusters`` kept, the rest at their mean)."""
        kept = self.dense if self.q_clusters is None else self.values
        assert kept is not None  # the form q_clusters says
        q = q.to(self.device, kept.dtype)
        if tuple(q.shape) != (q.size(0), self.learned) or (self.dense is not None and q.shape != self.dense.shape):
            raise ValueError(f"q must be [N, {self.learned}], got {tuple(q.shape)}")
        if self.q_clusters is None:
            assert self.dense is not None
            self.dense.copy_(q)
            return
        assert self.index is not None and self.values is not None and self.rest is not None
        values, index = q.topk(self.q_clusters, dim=1)
        self.index.copy_(index.to(self.index.dtype))
        self.values.copy_(values)
        self.rest.copy_((q.sum(1) - values.sum(1)) / max(self.learned - self.q_clusters, 1))

    # -- reading q ----------------------------------------------------------------------------------------
    def tensors(self) -> dict[str, Tensor]:
        """The tensors of ``q`` by state-dict name: ``q`` (dense), or ``q_index``, ``q_values``, ``q_rest``; what
        waits is not folded in (the caller folds it first)."""
        if self.q_clusters is None:
            assert self.dense is not None
            return {"q": self.dense}
        assert self.index is not None and self.values is not None and self.rest is not None
        return {"q_index": self.index, "q_values": self.values, "q_rest": self.rest}

    def rows(self):
        """``q`` as Algorithm 1 reads it: the dense tensor, or a :class:`CompactRows` view of the compact one."""
        if self.q_clusters is None:
            return self.dense
        return compact_statistics.CompactRows(self.index, self.values, self.rest, self.learned)

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors().values())).device

    def nbytes(self) -> int:
        """Bytes ``q`` holds: ``N * C_learned * 4`` dense, ``N * (2M + 1) * 4`` compact (float32)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    # -- what a module does to its tensors -----------------------------------------------------------------
    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """``fn`` (``.to()``, ``.double()``, ...) applied to every tensor of ``q``; the ring is dropped (the caller
        folded it), the next static step makes one where ``q`` now is."""
        for name, tensor in self.tensors().items():
            self._set(name, fn(tensor))
        self.waiting.ring = None

    def _set(self, name: str, tensor: Tensor) -> None:
        attribute = {"q": "dense", "q_index": "index", "q_values": "values", "q_rest": "rest"}[name]
        setattr(self, attribute, tensor)

    def load(self, state_dict: dict, prefix: str, missing_keys: list, unexpected_keys: list,
             error_msgs: list) -> None:
        """Copy ``q`` from a state dict in place, reporting as ``load_state_dict`` reports a buffer."""
        for name, tensor in self.tensors().items():
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
