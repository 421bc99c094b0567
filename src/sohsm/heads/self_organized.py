"""The self-organized hierarchical softmax (Shen, Tan, Pal and Courville 2017).

A two-level softmax whose clusters are re-learned during training: an EM in
which the M-step is ordinary gradient descent with the clusters fixed, and the
E-step (every ``update_every`` optimizer steps) re-assigns words to clusters
with the greedy Algorithm 1 from running statistics of the model's own cluster
predictions.
"""
from __future__ import annotations

import inspect
import math
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from sohsm.clustering import (
    default_max_cluster_size,
    default_n_clusters,
    frequency_binning,
    greedy_assignment,
    random_assignment,
)
from sohsm.heads import device_statistics
from sohsm.heads.base import SelfOrganizingHead, check_counts
from sohsm.heads.registry import register_head
from sohsm.heads.two_level import TwoLevelSoftmax

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


def _is_zero_redundancy(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is torch's ZeroRedundancyOptimizer (which shards its state across ranks).

    An instance of it means its module was imported, so the check imports nothing (importing
    ``torch.distributed.optim`` would compile its TorchScript optimizers on every attach).
    """
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


class SelfOrganizedSoftmax(TwoLevelSoftmax, SelfOrganizingHead):
    """Two-level softmax whose word clusters are learned from the model's predictions.

    For every word ``w`` a row ``q[w]`` estimates ``E[log2 P(c | context) | next word = w]``
    for every cluster ``c``; after each training batch the cluster log-probabilities
    of the forward pass update the rows of the batch's target words (Eq. 9)::

        q[w] <- lambda(w) * q[w] + (1 - lambda(w)) * log2 P(. | h)

    Every ``update_every`` optimizer steps, Algorithm 1 re-assigns the words, most
    frequent first, each to its best cluster by ``q`` that holds fewer than
    ``gamma * sqrt(N)`` words and less than ``freq_budget`` of the token mass.
    Words keep their vectors and optimizer state when they move
    (:meth:`TwoLevelSoftmax.set_assignment`).

    Paper: Shen, Tan, Pal and Courville (2017), "Self-organized Hierarchical Softmax",
    https://arxiv.org/abs/1707.08588 (Eq. 1-10, Algorithm 1).

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        counts: ``[N]`` training-corpus counts ``f_w``. They order the words in
            Algorithm 1 and set the smoothing ``lambda``. If ``None``, the head counts
            the targets it sees while training and uses those counts.
        n_clusters: number of clusters. Default: ``ceil(sqrt(N))``.
        gamma: a cluster takes a word only while ``|c| < gamma * sqrt(N)``. Default: 1.5.
        freq_budget: ``f_b``; a cluster takes a word only while its token mass is
            below it. Default: 0.1.
        update_every: ``K``, optimizer steps between re-assignments; 0 disables them.
            Default ``None``: about ``reclusters_per_epoch`` re-assignments per epoch,
            ``K = round(sum(counts) / tokens per batch / reclusters_per_epoch)``, fixed at
            the first training batch (the paper's K = 1000 when the head counts targets
            itself). The paper's K = 1000 never fires on a small corpus such as PTB
            (363 steps an epoch at batch 128 x BPTT 20).
        init: starting clusters, ``"random"`` (the paper) or ``"frequency"``.
        smoothing: ``"epoch"`` (default): ``1 - lambda(w) = 1 / f_w``, an exponential
            average over about one epoch of the word's occurrences, which is what
            the paper's text describes; ``"paper_literal"``: ``lambda(w) = 1 / f_w``
            as Eq. 10 is printed (a word seen once never updates, a frequent word
            keeps only its latest sample).
        projection: the ReLU projections of Eq. 1. Default: ``False``: with them the
            head trained to a far worse perplexity on PTB (dev ppl 158 vs 123 without,
            full softmax 122, LSTM 256 with dropout 0.2; the first Adagrad step moves every entry of the two
            ``d x d`` maps by about the learning rate). ``True`` is the paper's Eq. 1.
        seed: seed of the random initial clusters.
        reclusters_per_epoch: re-assignments per epoch when ``update_every`` is ``None``. Default: 8.
        freeze_after_tokens: stop re-clustering once the head has trained on this many
            tokens (after one last re-assignment). Default: ``None``, never.
        reset_on_freeze: what freezing does to the head's weights: ``"none"`` (default),
            ``"head"`` (re-initialise the head's weights and zero their optimizer state,
            so that they are learned afresh on the final clusters), ``"head_keep_state"``
            (re-initialise the weights, keep the optimizer state).
        moved_vectors: what a word's vector becomes when it moves: ``"keep"`` (default,
            the paper) or ``"cluster_mean"`` (the mean vector and optimizer state of the
            words that stayed in its new cluster).
        update_growth: factor by which the interval between re-assignments grows after
            each one: re-assignments at steps ``K``, ``K + K g``, ``K + K g + K g^2``, ...
            ``1.0`` (the paper) re-assigns every ``K`` steps.
        shortlist: the ``S`` most frequent words (by ``counts``) each get a fixed
            cluster of their own, scored in the root softmax beside the
            ``n_clusters`` learned clusters, as adaptive softmax's head scores its
            shortlist; the other ``N - S`` words are self-organised. A shortlist
            word's probability is one softmax, not a product of two, and its
            in-cluster step costs nothing. Default ``None``: ``ceil(sqrt(N))`` words
            when ``counts`` are given (else none), by measurement: PTB, LSTM 256, seed 1,
            dev ppl 121.6 against 126.0 without (adaptive softmax 121.0); a shortlist
            of 455 words did no better (121.8). ``0`` is the paper's head (every word
            in a learned cluster); see docs/results/lm.md.
        word_dim: in-cluster scores in ``word_dim`` dimensions (:class:`TwoLevelSoftmax`).

    Example::

        >>> import torch
        >>> counts = torch.randint(1, 100, (1000,))
        >>> head = SelfOrganizedSoftmax(64, 1000, counts=counts, update_every=2)
        >>> optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
        >>> handle = head.attach(optimizer)     # re-clusters every update_every steps
        >>> for _ in range(2):
        ...     output, loss = head(torch.randn(32, 64), torch.randint(0, 1000, (32,)))
        ...     loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> sorted(head.history[0])
        ['change_rate', 'empty_clusters', 'fallback_words', 'moved_tf_mass', 'step']

    .. note::
        When no cluster meets both constraints (possible when
        ``n_clusters * freq_budget < 1``, i.e. for small vocabularies), a word goes
        to the lightest cluster that still has room; :attr:`history` counts such
        words as ``fallback_words``.
    """

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        counts: Tensor | None = None,
        n_clusters: int | None = None,
        gamma: float = 1.5,
        freq_budget: float = 0.1,
        update_every: int | None = None,
        init: str = "random",
        smoothing: str = "epoch",
        projection: bool = False,
        seed: int = 0,
        reclusters_per_epoch: float = 8.0,
        freeze_after_tokens: int | None = None,
        reset_on_freeze: str = "none",
        moved_vectors: str = "keep",
        update_growth: float = 1.0,
        shortlist: int | None = None,
        word_dim: int | None = None,
    ) -> None:
        if smoothing not in SMOOTHING:
            raise ValueError(f"smoothing must be one of {SMOOTHING}, got {smoothing!r}")
        if init not in ("random", "frequency"):
            raise ValueError(f"init must be 'random' or 'frequency', got {init!r}")
        if not gamma > 0:
            raise ValueError(f"gamma must be positive, got {gamma}")
        if not freq_budget > 0:
            raise ValueError(f"freq_budget must be positive, got {freq_budget}")
        if update_every is not None and int(update_every) < 0:
            raise ValueError(f"update_every must be >= 0 or None, got {update_every}")
        if not (isinstance(update_growth, (int, float)) and math.isfinite(update_growth) and update_growth >= 1.0):
            raise ValueError(f"update_growth must be a finite number >= 1, got {update_growth!r}")
        if not reclusters_per_epoch > 0:
            raise ValueError(f"reclusters_per_epoch must be positive, got {reclusters_per_epoch}")
        if reset_on_freeze not in ("none", "head", "head_keep_state"):
            raise ValueError(f"reset_on_freeze must be 'none', 'head' or 'head_keep_state', got {reset_on_freeze!r}")
        if n_clusters is not None and (isinstance(n_clusters, bool) or not isinstance(n_clusters, int)
                                       or not 1 <= n_clusters <= n_classes):
            raise ValueError(f"n_clusters must be an integer in [1, {n_classes}], got {n_clusters!r}")
        n_clusters = default_n_clusters(n_classes) if n_clusters is None else int(n_clusters)
        if shortlist is None:  # the measured default: ceil(sqrt(N)) words, when the counts say which
            shortlist = min(default_n_clusters(n_classes), n_classes - 1) if counts is not None else 0
        if isinstance(shortlist, bool) or int(shortlist) != shortlist or not 0 <= int(shortlist) < n_classes:
            raise ValueError(f"shortlist must be an integer in [0, {n_classes - 1}], got {shortlist!r}")
        shortlist = int(shortlist)
        max_size = default_max_cluster_size(n_classes, gamma)
        if max_size * n_clusters < n_classes - shortlist:
            raise ValueError(
                f"gamma={gamma} allows {max_size} words per cluster, too few for {n_classes - shortlist} words "
                f"in {n_clusters} clusters"
            )
        if counts is not None:
            counts = check_counts(counts, n_classes)
        if init == "frequency" and counts is None:
            raise ValueError("init='frequency' needs the word counts (counts=...)")
        if shortlist and counts is None:
            raise ValueError("shortlist needs the word counts (counts=...): they say which words are most frequent")
        assignment: Tensor | str = init
        if shortlist:
            short, tail = _split_by_frequency(counts, shortlist)
            if init == "random":
                tail_clusters = random_assignment(tail.numel(), n_clusters, torch.Generator().manual_seed(seed))
            else:
                tail_clusters = frequency_binning(counts[tail], n_clusters)
            assignment = torch.empty(n_classes, dtype=torch.long)
            assignment[short] = torch.arange(shortlist)
            assignment[tail] = tail_clusters + shortlist
        super().__init__(
            in_features, n_classes, assignment=assignment, n_clusters=shortlist + n_clusters, counts=counts,
            projection=projection, seed=seed, word_dim=word_dim,
        )
        self.shortlist = shortlist
        if shortlist:
            #: ``[N - S]`` the words Algorithm 1 places (every word but the shortlist)
            self.register_buffer("tail_words", tail, persistent=False)
        self.gamma = float(gamma)
        self.freq_budget = float(freq_budget)
        self.max_cluster_size = max_size
        #: K as given; ``None``: chosen from the epoch length at the first training batch
        self.update_every_option = None if update_every is None else int(update_every)
        self.update_every = self.update_every_option
        self.reclusters_per_epoch = float(reclusters_per_epoch)
        self.update_growth = float(update_growth)
        self.freeze_after_tokens = None if freeze_after_tokens is None else int(freeze_after_tokens)
        self.reset_on_freeze = reset_on_freeze
        if moved_vectors not in ("keep", "cluster_mean"):
            raise ValueError(f"moved_vectors must be 'keep' or 'cluster_mean', got {moved_vectors!r}")
        self.moved_vectors = moved_vectors
        self.tokens_seen = 0
        self.frozen = False
        self.smoothing = smoothing
        self.counts_given = counts is not None
        # integer counts: module.float()/.double() never round them
        self.register_buffer(
            "counts", counts.round().long() if counts is not None else torch.zeros(n_classes, dtype=torch.long)
        )
        # start from "no information": the uniform cluster distribution. Saved in the state dict like
        # a buffer, but not registered as one: DDP would broadcast all N x C of it every forward.
        # Only the learned clusters need statistics: a shortlist word never moves, and no word moves to a
        # shortlist word's cluster, so q has a column per learned cluster (N x (n_clusters - S) floats).
        self.q = torch.full((n_classes, self.n_clusters - self.shortlist), -math.log2(self.n_clusters))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        #: one dict per re-assignment: step, change_rate, moved_tf_mass, empty_clusters, fallback_words
        self.history: list[dict] = []
        self._warned_unattached = False
        #: ranks whose tokens feed ``q``: ``None`` one process; ``"auto"`` the DDP module the head runs in
        self._group_option = "auto"
        self._group = None  # the process group found, once the head has run in one
        self._pending: list[tuple[Tensor, Tensor]] = []  # observations not yet merged across ranks
        self._device_tokens: list[int] = []  # tokens of the batches the sync-free path folded since the last step
        self._width = max(self.max_cluster_size, self._layout_cache.max_size)  # see _sync_free_width

    # -- cluster statistics (Eq. 9-10) ---------------------------------------------
    def _smoothing_factor(self, counts: Tensor) -> Tensor:
        """``lambda(w)`` for the given counts (float64)."""
        f = counts.to(torch.float64).clamp(min=1.0)
        return 1.0 / f if self.smoothing == "paper_literal" else 1.0 - 1.0 / f

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
        """K as the head will use it, for a run's start-up lines: ``"K 43 (auto, ≈8 per epoch)"``.

        Without a given K the head chooses it at its first batch from the epoch length
        (``sum(counts) / tokens_per_step`` steps) and :attr:`reclusters_per_epoch`;
        this computes the same number in advance.
        """
        k = self.update_every
        if k == 0:
            return "K 0 (never re-clusters)"
        if k is not None:
            return f"K {k}"
        if not self.counts_given or not tokens_per_step:
            return "K auto"
        steps_per_epoch = float(self.counts.sum()) / tokens_per_step
        return f"K {max(1, round(steps_per_epoch / self.reclusters_per_epoch))} (auto, ≈{self.reclusters_per_epoch:g} per epoch)"

    # -- q and tensors that are not buffers -------------------------------------------------
    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self.q = fn(self.q)
        return result

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "q"] = self.q

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        key = prefix + "q"
        if key in unexpected_keys:
            unexpected_keys.remove(key)
        if key not in state_dict:
            missing_keys.append(key)
        elif state_dict[key].shape != self.q.shape:
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(state_dict[key].shape)} "
                              f"from checkpoint, the shape in current model is {tuple(self.q.shape)}.")
        else:
            with torch.no_grad():
                self.q.copy_(state_dict[key])

    # -- several processes ----------------------------------------------------------------------
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
        device = self.q.device
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

    # -- cluster statistics (Eq. 9-10) ---------------------------------------------------------
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
        device_statistics.observe(self, target, cluster_log_probs)

    def _sync_free_width(self) -> int:
        """Static width of the sync-free path's logits: the largest cluster Algorithm 1 may make.

        Wider while the clusters are (initial frequency bins); kept as an attribute, updated by eager
        calls and re-assignments, so that ``torch.compile`` does not recompile at every re-assignment.
        """
        if not torch.compiler.is_compiling():
            self._width = max(self.max_cluster_size, self._layout_cache.max_size)
        return self._width

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
        self.q[words] *= decay.to(self.q.dtype)[:, None]
        self.q.index_add_(0, target[by_word], samples.to(self.q.dtype) * weight.to(self.q.dtype)[:, None])

    # -- re-assignment (Algorithm 1) ---------------------------------------------------
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
        if _is_zero_redundancy(optimizer):
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
        step = device_statistics.count_step(self)  # self.steps += 1, counted on the host
        if self.frozen:
            return
        if self.freeze_after_tokens is not None and self.tokens_seen >= self.freeze_after_tokens:
            self.reassign(optimizer)
            self.freeze(optimizer)
            return
        if self.update_every and self.is_reassign_step(step):
            self.reassign(optimizer)

    def is_reassign_step(self, step: int) -> bool:
        """Whether Algorithm 1 runs after optimizer step ``step`` (``update_every`` and ``update_growth``).

        A function of the step alone, so a resumed run re-clusters where the uninterrupted one would.
        """
        k = self.update_every
        if not k or step <= 0:
            return False
        if self.update_growth == 1.0:
            return step % k == 0
        interval, due = float(k), k
        while due < step:
            interval *= self.update_growth
            due += max(1, round(interval))
        return due == step

    @torch.no_grad()
    def _reset_moved(self, moved: Tensor, optimizer) -> None:
        """Give each moved word the mean vector (and optimizer state) of the words that stayed in its new cluster."""
        layout = self._layout
        stay_slots = layout.slot_of_word[~moved]
        stay_clusters = self.assignment[~moved]
        tensors = [self.weight.data, *self._optimizer_state(self.weight, optimizer, rows=True)]
        n_stay = torch.bincount(stay_clusters, minlength=self.n_clusters).to(self.weight.dtype)
        moved_words = moved.nonzero().squeeze(1)
        target_clusters = self.assignment[moved_words]
        has_mates = n_stay[target_clusters] > 0
        moved_words, target_clusters = moved_words[has_mates], target_clusters[has_mates]
        slots = layout.slot_of_word[moved_words]
        for t in tensors:
            sums = t.new_zeros(self.n_clusters, t.size(1)).index_add_(0, stay_clusters, t[stay_slots])
            means = sums / n_stay.clamp(min=1)[:, None]
            t[slots] = means[target_clusters]

    @torch.no_grad()
    def freeze(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Stop re-clustering; with ``reset_on_freeze`` re-initialise the head's weights on the final clusters."""
        self.frozen = True
        if self.reset_on_freeze == "none":
            return
        self.reset_parameters()
        if self.reset_on_freeze == "head_keep_state":
            return
        for p in self.parameters():
            for value in self._optimizer_state(p, optimizer):
                value.zero_()

    @torch.no_grad()
    def reassign(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Run Algorithm 1 now and move the words (the E-step); returns the record added to :attr:`history`.

        The record holds ``step``, ``change_rate`` (share of words that moved),
        ``moved_tf_mass`` (token mass of the words that moved), ``empty_clusters``
        and ``fallback_words``.
        """
        self.merge_statistics()  # with several ranks: the batches seen since the last step
        counts = self.counts.to(torch.float64)
        total = float(counts.sum())
        tf = counts / total if total > 0 else torch.full_like(counts, 1.0 / self.n_classes)
        if self._group is None or dist.get_rank(self._group) == 0:
            if self.shortlist:  # the shortlist words keep their own clusters; the rest share the learned ones
                s, tail = self.shortlist, self.tail_words
                result = greedy_assignment(self.q[tail], tf[tail.to(tf.device)], self.max_cluster_size,
                                           self.freq_budget)
                assignment = self.assignment.clone()
                assignment[tail] = result.assignment.to(assignment.device) + s
            else:
                result = greedy_assignment(self.q, tf, self.max_cluster_size, self.freq_budget)
                assignment = result.assignment
            fallback_words = int(result.fallback_words)
        else:
            assignment, fallback_words = None, 0
        assignment, fallback_words = self.broadcast_assignment(assignment, fallback_words)
        moved = self.set_assignment(assignment, optimizer)
        self._sync_free_width()  # the sync-free path's width follows the new clusters
        if self.moved_vectors == "cluster_mean" and bool(moved.any()):
            self._reset_moved(moved, optimizer)
        moved = moved.cpu()
        record = {
            "step": int(self.steps),
            "change_rate": float(moved.double().mean()),
            "moved_tf_mass": float(tf.cpu()[moved].sum()),
            "empty_clusters": int((self._layout.sizes_t == 0).sum()),
            "fallback_words": fallback_words,
        }
        self.history.append(record)
        return record

    # -- persistence ---------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"history": list(self.history), "counts_given": self.counts_given,
                "update_every": self.update_every, "tokens_seen": self.tokens_seen, "frozen": self.frozen}

    def set_extra_state(self, state: dict) -> None:
        self.history = list(state.get("history", []))
        self.counts_given = bool(state.get("counts_given", self.counts_given))
        if "update_every" in state:
            self.update_every = state["update_every"]
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.frozen = bool(state.get("frozen", False))

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", gamma={self.gamma}, freq_budget={self.freq_budget}, update_every={self.update_every}, "
            f"smoothing={self.smoothing!r}"
            + (f", update_growth={self.update_growth}" if self.update_growth != 1.0 else "")
            + (f", shortlist={self.shortlist}" if self.shortlist else "")
        )


def _split_by_frequency(counts: Tensor, shortlist: int) -> tuple[Tensor, Tensor]:
    """``(the shortlist most frequent words, the rest)``, each in descending count (ties: lower id first)."""
    order = torch.sort(counts.to(torch.float64), descending=True, stable=True).indices
    return order[:shortlist], order[shortlist:]


@register_head("self_organized", builds=SelfOrganizedSoftmax)
def _self_organized(in_features: int, n_classes: int, counts=None, **options) -> SelfOrganizedSoftmax:
    return SelfOrganizedSoftmax(in_features, n_classes, counts=counts, **options)
