"""The self-organized hierarchical softmax (Shen, Tan, Pal and Courville 2017).

A two-level softmax whose clusters are re-learned during training: an EM in which the M-step is ordinary gradient
descent with the clusters fixed, and the E-step (every ``update_every`` optimizer steps) re-assigns words to
clusters with the greedy Algorithm 1 from running statistics of the model's own cluster predictions.

This file holds the module: its options, its state, the E-step
(:meth:`SelfOrganizedSoftmax.reassign`), the optimizer hook that runs it on schedule, freezing, and what a
checkpoint keeps. Its parts live beside it, one idea a file; each owns its state, and the head holds one of each:

* :mod:`~sohsm.heads.two_level.self_organizing.reclustering`: the options, one frozen group (:attr:`reclustering`);
* :mod:`~sohsm.heads.two_level.self_organizing.cluster_statistics`: the statistics ``q`` (Eq. 9-10) and the
  batches waiting to be folded in (:attr:`statistics`; :mod:`.device_statistics`: the fold with static shapes of
  the sync-free path; :mod:`.compact_statistics`: ``q`` kept as each word's top ``q_clusters`` clusters);
* :mod:`~sohsm.heads.two_level.self_organizing.recluster_schedule`: when it re-clusters (every ``K`` steps,
  growing) and when it stops (:attr:`schedule`);
* :mod:`~sohsm.heads.two_level.self_organizing.rank_sync`: several processes, one set of statistics and clusters
  (:attr:`ranks`);
* :mod:`~sohsm.heads.two_level.self_organizing.moved_words`: what a moved word's vector becomes.

One mixin remains, declaring what it reads of the head (a ``typing.Protocol``):
:class:`~.head_statistics.HeadStatistics` (what a training forward hands the statistics; ``q`` read, moved and
saved through the head; the statistics and clusters shared by several processes).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from sohsm.clustering import (
    default_max_cluster_size,
    default_n_clusters,
    greedy_assignment,
)
from sohsm.clustering.deferred_acceptance import greedy_assignment_deferred
from sohsm.heads.base import HeadMemory, SelfOrganizingHead, check_counts
from sohsm.heads.registry import register_head
from sohsm.heads.two_level import run_defaults
from sohsm.heads.two_level.self_organizing.cluster_statistics import ClusterStatistics
from sohsm.heads.two_level.self_organizing.head_statistics import HeadStatistics
from sohsm.heads.two_level.self_organizing.moved_words import give_cluster_means
from sohsm.heads.two_level.self_organizing.rank_sync import RankGroup, is_zero_redundancy
from sohsm.heads.two_level.self_organizing.recluster_schedule import ReclusterSchedule
from sohsm.heads.two_level.self_organizing.reclustering import Reclustering
from sohsm.heads.two_level.self_organizing.starting_clusters import starting_assignment
from sohsm.heads.two_level.softmax import TwoLevelSoftmax


class SelfOrganizedSoftmax(HeadStatistics, TwoLevelSoftmax, SelfOrganizingHead):
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
        counts: ``[N]`` training-corpus counts ``f_w``. They order the words in Algorithm 1 and set the smoothing
            ``lambda``. If ``None``, the head counts the targets it sees while training and uses those counts.
        n_clusters: number of clusters. Default: ``ceil(sqrt(N))``.
        init: starting clusters, ``"random"`` (the paper) or ``"frequency"``.
        projection: the ReLU projections of Eq. 1. Default: ``False``: with them the
            head trained to a far worse perplexity on PTB (the first Adagrad step moves every entry of the
            two ``d x d`` maps by about the learning rate; docs/results/lm.md, "What the paper prescribes,
            what we measured, what the default is"). ``True`` is the paper's Eq. 1.
        seed: seed of the random initial clusters.
        shortlist: the ``S`` most frequent words (by ``counts``) each get a fixed cluster of their own, scored in
            the root softmax beside the ``n_clusters`` learned clusters, as adaptive softmax's head scores its
            shortlist; the other ``N - S`` words are self-organised. A shortlist word's probability is one softmax,
            not a product of two, and its in-cluster step costs nothing. Default ``None``: ``ceil(sqrt(N))`` words
            when ``counts`` are given (else none), chosen by measurement (a lower dev perplexity on PTB than none,
            and no worse than a shortlist as large as adaptive softmax's: docs/results/lm.md,
            "What was tried in this round").
            ``0`` is the paper's head (every word in a learned cluster).
        word_dim: in-cluster scores in ``word_dim`` dimensions (:class:`TwoLevelSoftmax`).
        div_value, cutoffs: differentiated dimensions: a word of frequency band ``i`` is scored in
            ``d // div_value**i`` dimensions (:mod:`sohsm.heads.two_level.word_bands`; :class:`TwoLevelSoftmax`).
        backend: how the in-cluster softmax is computed (:class:`TwoLevelSoftmax`): ``"auto"`` (default)
            the sync-free Triton kernels on CUDA, the per-cluster kernel on the CPU.
        cluster_bias: a bias per cluster in the cluster softmax (:class:`TwoLevelSoftmax`; off by default).
        unseen_words: where the words of count 0 go (:mod:`.starting_clusters`): ``"spread"`` (default) as any
            word, ``"apart"`` in clusters of their own, beyond ``n_clusters``, that Algorithm 1 leaves to them
            (needs ``counts``).
        reclustering: when and how the words are re-assigned (Algorithm 1's limits ``gamma`` and ``freq_budget``,
            the schedule ``update_every``, ``reclusters_per_epoch``, ``first_update``, ``update_growth``, the
            statistics' ``smoothing`` and ``q_clusters``, the ``solver``, freezing and moved words' vectors): a
            :class:`Reclustering`, one validated group. Default: ``Reclustering()``. By name
            (:func:`sohsm.build_head`, ``--head-option``) the same options are given flat:
            ``build_head("self_organized", d, N, counts=c, gamma=2.0)``.

    Example::

        >>> import torch
        >>> counts = torch.randint(1, 100, (1000,))
        >>> head = SelfOrganizedSoftmax(64, 1000, counts=counts, reclustering=Reclustering(update_every=2))
        >>> optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
        >>> handle = head.attach(optimizer)     # re-clusters every update_every steps
        >>> for _ in range(2):
        ...     output, loss = head(torch.randn(32, 64), torch.randint(0, 1000, (32,)))
        ...     loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> sorted(head.history[0])
        ['change_rate', 'empty_clusters', 'fallback_words', 'moved_tf_mass', 'step']

    .. note::
        When no cluster meets both constraints (possible when ``n_clusters * freq_budget < 1``, i.e. for small
        vocabularies), a word goes to the lightest cluster that still has room; :attr:`history` counts such words as
        ``fallback_words``.
    """

    # its buffers (register_buffer), declared for the checker (``counts`` by HeadStatistics)
    steps: Tensor
    tail_words: Tensor
    seen_words: Tensor | None

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        *,
        counts: Tensor | None = None,
        n_clusters: int | None = None,
        init: str = "random",
        shortlist: int | None = None,
        projection: bool = False,
        seed: int = 0,
        word_dim: int | None = None,
        div_value: float | None = None,
        cutoffs: Sequence[int] | None = None,
        backend: str = "auto",
        cluster_bias: bool = False,
        unseen_words: str = "spread",
        reclustering: Reclustering | None = None,
    ) -> None:
        if reclustering is None:
            reclustering = Reclustering()
        if not isinstance(reclustering, Reclustering):
            raise ValueError(f"reclustering must be a Reclustering, got {type(reclustering).__name__}")
        if init not in ("random", "frequency"):
            raise ValueError(f"init must be 'random' or 'frequency', got {init!r}")
        if n_clusters is not None and (isinstance(n_clusters, bool) or not isinstance(n_clusters, int)
                                       or not 1 <= n_clusters <= n_classes):
            raise ValueError(f"n_clusters must be an integer in [1, {n_classes}], got {n_clusters!r}")
        n_clusters = default_n_clusters(n_classes) if n_clusters is None else int(n_clusters)
        if shortlist is None:  # the measured default: ceil(sqrt(N)) words, when the counts say which
            shortlist = min(default_n_clusters(n_classes), n_classes - 1) if counts is not None else 0
        if isinstance(shortlist, bool) or int(shortlist) != shortlist or not 0 <= int(shortlist) < n_classes:
            raise ValueError(f"shortlist must be an integer in [0, {n_classes - 1}], got {shortlist!r}")
        shortlist = int(shortlist)
        gamma = reclustering.gamma
        max_size = default_max_cluster_size(n_classes, gamma)
        if max_size * n_clusters < n_classes - shortlist:
            raise ValueError(f"gamma={gamma} allows {max_size} words per cluster, too few for {n_classes - shortlist} "
                             f"words in {n_clusters} clusters")
        if counts is not None:
            counts = check_counts(counts, n_classes)
        if init == "frequency" and counts is None:
            raise ValueError("init='frequency' needs the word counts (counts=...)")
        if shortlist and counts is None:
            raise ValueError("shortlist needs the word counts (counts=...): they say which words are most frequent")
        assignment, tail, apart = starting_assignment(counts, n_classes, n_clusters, shortlist, init, seed,
                                                      unseen_words, max_size)
        n_clusters += apart.reserved if apart else 0
        super().__init__(in_features, n_classes, assignment=assignment, n_clusters=shortlist + n_clusters,
                         counts=counts, projection=projection, seed=seed, word_dim=word_dim, div_value=div_value,
                         cutoffs=cutoffs, backend=backend, cluster_bias=cluster_bias)
        self.shortlist, self.unseen_words = shortlist, unseen_words
        if tail is not None:
            #: ``[N - S]`` the words Algorithm 1 places (every word but the shortlist)
            self.register_buffer("tail_words", tail, persistent=False)
        #: ``unseen_words="apart"``: the last ``reserved_clusters`` (beyond ``n_clusters``) hold the words of count 0
        #: alone; Algorithm 1 places the ``seen_words`` (``[S]`` ids) over the others
        self.reserved_clusters = apart.reserved if apart else 0
        self.register_buffer("seen_words", apart.seen if apart else None, persistent=False)
        #: the re-clustering options, one group, read whole by the E-step, the statistics and the schedule
        self.reclustering = reclustering
        #: Algorithm 1's limit on a cluster's words (``gamma * sqrt(N)``)
        self.max_cluster_size = max_size
        # integer counts: module.float()/.double() never round them
        self.register_buffer(
            "counts", counts.round().long() if counts is not None else torch.zeros(n_classes, dtype=torch.long)
        )
        learned = self.n_clusters - self.shortlist
        q_clusters = reclustering.q_clusters
        if q_clusters is not None and (isinstance(q_clusters, bool) or not isinstance(q_clusters, int)
                                       or not 1 <= q_clusters <= learned):
            raise ValueError(f"q_clusters must be None or an integer in [1, {learned}] (the learned clusters), "
                             f"got {q_clusters!r}")
        #: ``q`` and the batches waiting to be folded in. Saved in the state dict like a buffer, but not
        #: registered as one: DDP would broadcast all N x C of it every forward
        self.statistics = ClusterStatistics(n_classes, learned, shortlist, -math.log2(self.n_clusters),
                                            reclustering.smoothing, q_clusters, counts_given=counts is not None)
        #: when it re-clusters and when it stops (K, the tokens seen, frozen)
        self.schedule = ReclusterSchedule(reclustering)
        #: which ranks share the statistics and clusters (one process until the head runs under DDP)
        self.ranks = RankGroup()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        #: one dict per re-assignment: step, change_rate, moved_tf_mass, empty_clusters, fallback_words
        self.history: list[dict] = []
        self._warned_unattached = False
        assert self._layout_cache is not None  # derived by the constructor above
        self._width = max(self.max_cluster_size, self._layout_cache.max_size)  # see _sync_free_width

    # -- what the parts own, read through the head ---------------------------------------------------------
    @property
    def counts_given(self) -> bool:
        """Whether :attr:`counts` are the corpus's (else the head counts the targets it sees)."""
        return self.statistics.counts_given

    @property
    def update_every(self) -> int | None:
        """K, optimizer steps between re-clusterings (0: never; ``None`` until the first batch chooses it)."""
        return self.schedule.update_every

    @update_every.setter
    def update_every(self, value: int | None) -> None:
        self.schedule.update_every = value

    @property
    def tokens_seen(self) -> int:
        """Training tokens the statistics have seen."""
        return self.schedule.tokens_seen

    @property
    def frozen(self) -> bool:
        """The clusters no longer change (:meth:`freeze`)."""
        return self.schedule.frozen

    def _corpus_counts(self) -> Tensor | None:
        """The counts an epoch is the sum of, or ``None`` where the head counts its targets (K cannot follow)."""
        return self.counts if self.counts_given else None

    def _observes_on_host(self) -> bool:
        """Compact statistics (``q_clusters``) are folded in by the per-cluster backend only."""
        return self.reclustering.q_clusters is not None

    def _sync_free_width(self) -> int:
        """Static width of the sync-free path's logits: the largest cluster Algorithm 1 may make.

        Wider while the clusters are (initial frequency bins); kept as an attribute, updated by eager
        calls and re-assignments, so that ``torch.compile`` does not recompile at every re-assignment; in a static
        step it never narrows (its ops keep their shapes across re-clusterings).
        """
        if not torch.compiler.is_compiling():
            assert self._layout_cache is not None  # derived at construction
            width = max(self.max_cluster_size, self._layout_cache.max_size)
            # a static step keeps its shapes: the widest it has been (a captured step is captured once)
            self._width = max(self._width, width) if self._static else width
        return self._width

    # -- the schedule: attached to an optimizer, Algorithm 1 after the steps it is due -------------------------
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
        self.schedule.settle(self._corpus_counts())  # the sync-free path's host-side bookkeeping
        if self.statistics.waiting.full():  # a static step's ring of waiting batches, folded outside any graph
            self.statistics.fold_waiting(self.counts)
        due = self.schedule.due(self.schedule.count_step(self.steps))  # self.steps += 1, counted on the host
        if due is None:
            return
        # the step has used the gradient: dropped (as zero_grad() does), not moved with the words for no one; a
        # static step keeps its storage (a captured step writes it), moved with the words and zeroed by the next step
        if not self._static:
            self.words.drop_gradients()
        self.reassign(optimizer)
        if due == "freeze":
            self.freeze(optimizer)

    def is_reassign_step(self, step: int) -> bool:
        """Whether Algorithm 1 runs after optimizer step ``step`` (:meth:`ReclusterSchedule.is_reassign_step`)."""
        return self.schedule.is_reassign_step(step)

    def describe_schedule(self, tokens_per_step: int | None = None) -> str:
        """K as the head will use it, for a run's start-up lines (:meth:`ReclusterSchedule.describe`)."""
        return self.schedule.describe(tokens_per_step, self._corpus_counts())

    @torch.no_grad()
    def freeze(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Stop re-clustering; with ``reset_on_freeze`` re-initialise the head's weights on the final clusters:
        ``"head"`` zeroes their optimizer state too, ``"head_keep_state"`` keeps it."""
        self.schedule.frozen = True
        reset = self.reclustering.reset_on_freeze
        if reset == "none":
            return
        self.reset_parameters()
        if reset == "head_keep_state":
            return
        for p in self.parameters():
            for value in self._optimizer_state(p, optimizer):
                value.zero_()

    # -- the E-step -------------------------------------------------------------------------------------------
    def _with_stay_margin(self, q, current: Tensor):
        """``q`` with ``stay_margin`` added to each word's current cluster (a copy; ``q`` itself without a margin)."""
        margin = self.reclustering.stay_margin
        if not margin:
            return q
        q = q.clone()
        q[torch.arange(q.size(0), device=q.device), current.to(q.device)] += margin
        return q

    @torch.no_grad()
    def reassign(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Run Algorithm 1 now and move the words (the E-step); returns the record added to :attr:`history`.

        The record holds ``step``, ``change_rate`` (share of words that moved),
        ``moved_tf_mass`` (token mass of the words that moved), ``empty_clusters``
        and ``fallback_words``.
        """
        self.merge_statistics()  # with several ranks: the batches seen since the last step
        self.statistics.fold_waiting(self.counts)  # the sync-free path's batches still waiting
        options, compact = self.reclustering, self.reclustering.q_clusters is not None
        counts = self.counts.to(torch.float64)
        total = counts.sum()  # no counts yet: every word the same share (on the device: no read-back)
        tf = torch.where(total > 0, counts / total, 1.0 / self.n_classes)
        sequential = options.solver == "sequential" or (options.solver == "auto" and self.q_device().type == "cpu")
        solve = greedy_assignment if sequential else greedy_assignment_deferred
        if self.ranks.leads():
            q = self.statistics.rows()  # compact: read a block of dense rows at a time
            if self.seen_words is not None and not self.seen_words.numel():  # every seen word in the shortlist
                assignment, result = self.assignment, None
            elif self.shortlist or self.reserved_clusters:  # the shortlist and unseen words keep their clusters
                s, tail = self.shortlist, (self.seen_words if self.seen_words is not None else self.tail_words)
                q = q.take(tail) if compact else q[tail]
                if not sequential and compact:
                    q = q.dense()  # the deferred solver reads whole columns: the rows are built at once
                if self.reserved_clusters:  # the seen words over the clusters the unseen ones leave
                    q = (q if isinstance(q, Tensor) else q.dense())[:, :q.shape[1] - self.reserved_clusters]
                q = self._with_stay_margin(q, self.assignment[tail] - s)
                result = solve(q, tf[tail.to(tf.device)], self.max_cluster_size, options.freq_budget)
                assignment = self.assignment.clone()
                assignment[tail] = result.assignment.to(assignment.device) + s
            else:
                if not sequential and compact:
                    q = q.dense()
                q = self._with_stay_margin(q, self.assignment)
                result = solve(q, tf, self.max_cluster_size, options.freq_budget)
                assignment = result.assignment
            fallback_words = int(result.fallback_words) if result is not None else 0
        else:
            assignment, fallback_words = None, 0
        assignment, fallback_words = self.broadcast_assignment(assignment, fallback_words)
        new = assignment.to(self.assignment.device, torch.long)  # Algorithm 1's: valid by construction, unchecked
        moved = self._move_words(new, new != self.assignment, optimizer)  # reads nothing back
        self._sync_free_width()  # the sync-free path's width follows the new clusters
        if options.moved_vectors == "cluster_mean" and bool(moved.any()):
            self._give_cluster_means(moved, optimizer)
        # the record's numbers, summed on the device and read back at once (a GPU waits once, not four times)
        change_rate, moved_tf_mass, empty_clusters = torch.stack([
            moved.double().mean(), torch.where(moved, tf.to(moved.device), 0.0).sum(),
            (self._layout.sizes_t == 0).sum().double()]).tolist()
        record = {
            "step": self.schedule.step_count(self.steps),
            "change_rate": change_rate,
            "moved_tf_mass": moved_tf_mass,
            "empty_clusters": int(empty_clusters),
            "fallback_words": fallback_words,
        }
        self.history.append(record)
        return record

    @torch.no_grad()
    def _give_cluster_means(self, moved: Tensor, optimizer: torch.optim.Optimizer | None = None) -> None:
        """``moved_vectors="cluster_mean"``: each moved word takes the mean vector and optimizer state of its new
        cluster's stayers (of its own band's weight; :func:`~.moved_words.give_cluster_means`)."""
        rows = [([weight.data, *self._optimizer_state(weight, optimizer, rows=True)], words)
                for weight, words in self.words.by_weight(self._layout)]
        give_cluster_means(rows, self.assignment, moved, self.n_clusters)

    # -- persistence ---------------------------------------------------------------------
    @classmethod
    def memory_estimate(cls, in_features: int, n_classes: int, options: dict, rows: int) -> HeadMemory:
        """The two-level head's, and its statistics ``q``: ``N x`` learned clusters, float32; compact
        (``q_clusters=M``) ``N x (2M + 1)`` 4-byte numbers."""
        clusters = options.get("n_clusters") or default_n_clusters(n_classes)
        memory = super().memory_estimate(in_features, n_classes, options, rows)
        kept = options.get("q_clusters")
        per_word = clusters if kept is None else 2 * int(kept) + 1
        return memory._replace(extra_bytes=n_classes * per_word * 4, extra="statistics q")

    def get_extra_state(self) -> dict:
        return {"history": list(self.history), "counts_given": self.counts_given, **self.schedule.state()}

    def set_extra_state(self, state: dict) -> None:
        self.history = list(state.get("history", []))
        self.statistics.counts_given = bool(state.get("counts_given", self.counts_given))
        self.schedule.load_state(state)

    def extra_repr(self) -> str:
        options = self.reclustering
        return (
            super().extra_repr()
            + f", gamma={options.gamma}, freq_budget={options.freq_budget}, update_every={self.update_every}, "
            f"smoothing={options.smoothing!r}"
            + (f", update_growth={options.update_growth}" if options.update_growth != 1.0 else "")
            + (f", first_update={options.first_update}" if options.first_update is not None else "")
            + (f", shortlist={self.shortlist}" if self.shortlist else "")
            + (f", unseen_words=apart ({self.reserved_clusters} clusters)" if self.unseen_words == "apart" else "")
            + (f", q_clusters={options.q_clusters}" if options.q_clusters is not None else "")
        )


@register_head("self_organized", builds=SelfOrganizedSoftmax, defaults=run_defaults.self_organized_defaults,
               legacy_options=run_defaults.without_shortlist, resume_refusal=run_defaults.widened_weight_refusal,
               update_every=run_defaults.reclusterings_per_epoch)
def _self_organized(in_features: int, n_classes: int, counts=None, **options) -> SelfOrganizedSoftmax:
    """Flat options (``gamma=2``, ``update_every=100``): the :class:`Reclustering` ones make its group."""
    options = dict(options)
    reclustering = Reclustering.take(options)
    return SelfOrganizedSoftmax(in_features, n_classes, counts=counts, reclustering=reclustering, **options)
