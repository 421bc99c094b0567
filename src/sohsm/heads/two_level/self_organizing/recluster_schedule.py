"""When the self-organized head re-clusters: every ``K`` optimizer steps, growing, until it freezes.

The head hooks the optimizer it is attached to (:meth:`SelfOrganizedSoftmax.attach`); after each step it
asks its :class:`ReclusterSchedule` what is due (:meth:`ReclusterSchedule.due`): Algorithm 1 when the step is
due (``first_update``, then every ``update_every`` = K, ``update_growth``), or one last re-assignment and
freezing once ``freeze_after_tokens`` tokens are seen. Without a given K, K follows from the epoch length
(about ``reclusters_per_epoch`` re-clusterings an epoch), fixed at the first training batch.

The schedule owns its state (K as resolved, the tokens seen, whether the clusters are frozen, the host's
count of optimizer steps) and reads its options from the head's :class:`Reclustering`, whole.
"""
from __future__ import annotations

from torch import Tensor

from sohsm.heads.two_level.self_organizing.reclustering import Reclustering

#: K where it cannot follow from the epoch length (no corpus counts): the paper's
PAPER_K = 1000


class ReclusterSchedule:
    """When the head re-clusters and when it stops.

    Args:
        options: the head's re-clustering options (``update_every``, ``first_update``, ``update_growth``,
            ``reclusters_per_epoch``, ``freeze_after_tokens``).

    The methods that choose K take ``counts``, the corpus counts (an epoch is their sum), or ``None`` where the
    head has none (it counts the targets it sees).
    """

    def __init__(self, options: Reclustering) -> None:
        self.options = options
        #: K: optimizer steps between re-clusterings (0: never; ``None`` until the first batch chooses it)
        self.update_every: int | None = options.update_every
        #: training tokens the statistics have seen
        self.tokens_seen = 0
        #: the clusters no longer change
        self.frozen = False
        #: tokens of the batches the sync-free path folded since the last optimizer step (counted at the step)
        self.unsettled: list[int] = []
        self._steps_mirror: tuple[Tensor, int, int] | None = None

    # -- tokens and K ---------------------------------------------------------------------------------
    def saw(self, tokens: int, counts: Tensor | None) -> None:
        """A training batch of ``tokens`` tokens was folded in (K chosen from it if not yet)."""
        if self.update_every is None:
            self.resolve(tokens, counts)
        self.tokens_seen += tokens

    def saw_later(self, tokens: int) -> None:
        """The same, counted at the next optimizer step (:meth:`settle`): the sync-free path reads nothing back."""
        self.unsettled.append(tokens)

    def settle(self, counts: Tensor | None) -> None:
        """Count the batches :meth:`saw_later` kept since the last optimizer step."""
        if not self.unsettled:
            return
        if self.update_every is None:
            self.resolve(self.unsettled[0], counts)
        self.tokens_seen += sum(self.unsettled)
        self.unsettled.clear()

    def resolve(self, batch_tokens: int, counts: Tensor | None) -> None:
        """``K`` for ``update_every=None``: about ``reclusters_per_epoch`` re-clusterings per epoch.

        A step is taken to read as many tokens as the first training batch. Without corpus counts the
        paper's K = 1000 is used.
        """
        self.update_every = self.choose(batch_tokens, counts) or PAPER_K

    def choose(self, tokens_per_step: int | None, counts: Tensor | None) -> int | None:
        """The K that epochs of ``tokens_per_step``-token steps give, or ``None`` without counts or tokens."""
        if counts is None or not tokens_per_step or tokens_per_step <= 0:
            return None
        steps_per_epoch = float(counts.sum()) / tokens_per_step
        return max(1, round(steps_per_epoch / self.options.reclusters_per_epoch))

    # -- steps ----------------------------------------------------------------------------------------
    def count_step(self, steps: Tensor) -> int:
        """Add one to ``steps`` (the head's step counter, on its device) and return the new count from a host-side
        mirror, trusted while ``steps`` is the same tensor at the version the last call left it (a
        ``load_state_dict`` or any write bumps the version); otherwise the count is read once from the device."""
        value = self.step_count(steps) + 1
        steps += 1
        self._steps_mirror = (steps, steps._version, value)
        return value

    def step_count(self, steps: Tensor) -> int:
        """``steps`` as an int, from the mirror of :meth:`count_step` while it holds (else one read)."""
        mirror = self._steps_mirror
        if mirror is not None and mirror[0] is steps and mirror[1] == steps._version:
            return mirror[2]
        return int(steps)

    def is_reassign_step(self, step: int) -> bool:
        """Whether Algorithm 1 runs after optimizer step ``step`` (``first_update``, then ``update_every``, growing).

        A function of the step alone, so a resumed run re-clusters where the uninterrupted one would.
        """
        k = self.update_every
        if not k or step <= 0:
            return False
        first = self.options.first_update or k
        if step <= first:
            return step == first
        growth = self.options.update_growth
        if growth == 1.0:
            return (step - first) % k == 0
        interval, due = float(k), first
        while due < step:
            interval *= growth
            due += max(1, round(interval))
        return due == step

    def due(self, step: int) -> str | None:
        """What follows optimizer step ``step``: ``"freeze"`` (a last re-assignment, then freezing),
        ``"reassign"``, or ``None``."""
        if self.frozen:
            return None
        limit = self.options.freeze_after_tokens
        if limit is not None and self.tokens_seen >= limit:
            return "freeze"
        if self.update_every and self.is_reassign_step(step):
            return "reassign"
        return None

    def describe(self, tokens_per_step: int | None, counts: Tensor | None) -> str:
        """K as the head will use it, for a run's start-up lines: ``"K 43 (auto, ≈8 per epoch)"``, and
        ``", the first after step 228"`` where ``first_update`` says.

        Without a given K the head chooses it at its first batch from the epoch length
        (``sum(counts) / tokens_per_step`` steps) and ``reclusters_per_epoch``;
        this computes the same number in advance.
        """
        k = self.update_every
        if k == 0:
            return "K 0 (never re-clusters)"
        first_update = self.options.first_update
        first = "" if first_update is None else f", the first after step {first_update}"
        if k is not None:
            return f"K {k}{first}"
        k = self.choose(tokens_per_step, counts)
        if k is None:
            return f"K auto{first}"
        return f"K {k} (auto, ≈{self.options.reclusters_per_epoch:g} per epoch){first}"

    # -- what a checkpoint keeps ----------------------------------------------------------------------------
    def state(self) -> dict:
        return {"update_every": self.update_every, "tokens_seen": self.tokens_seen, "frozen": self.frozen}

    def load_state(self, state: dict) -> None:
        if "update_every" in state:
            self.update_every = state["update_every"]
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.frozen = bool(state.get("frozen", False))
