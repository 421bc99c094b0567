"""When and how the self-organized head re-learns its clusters: one typed, validated group of options.

The head's E-step (Algorithm 1) and its schedule take eleven settings. They travel together as a
:class:`Reclustering`, checked once when it is made, whether a library user makes it or the registry makes it
from the flat options of ``build_head("self_organized", ..., gamma=2)``, ``--head-option gamma=2`` or a run's
``config.json`` (the options keep their flat names there, so saved runs and settings files read as before).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sohsm.heads.two_level.self_organizing.moved_words import MOVED_VECTORS

#: smoothing rules of the cluster statistics q (Eq. 10; :func:`smoothing_factor`)
SMOOTHING = ("epoch", "paper_literal")
#: how Algorithm 1 is computed (``solver``)
SOLVERS = ("auto", "sequential", "deferred_acceptance")
#: what freezing does to the head's weights (``reset_on_freeze``)
RESETS = ("none", "head", "head_keep_state")


@dataclass(frozen=True)
class Reclustering:
    """The self-organized head's re-clustering: Algorithm 1's limits, its schedule, its statistics, its end.

    Args:
        gamma: a cluster takes a word only while ``|c| < gamma * sqrt(N)``. Default: 1.5.
        freq_budget: ``f_b``; a cluster takes a word only while its token mass is below it. Default: 0.1.
        update_every: ``K``, optimizer steps between re-assignments; 0 disables them.
            Default ``None``: about ``reclusters_per_epoch`` re-assignments per epoch,
            ``K = round(sum(counts) / tokens per batch / reclusters_per_epoch)``, fixed at
            the first training batch (the paper's K = 1000 when the head counts targets
            itself). The paper's K = 1000 never fires on a small corpus such as PTB
            (363 steps an epoch at batch 128 x BPTT 20).
        reclusters_per_epoch: re-assignments per epoch when ``update_every`` is ``None``. Default: 8.
        first_update: optimizer steps before the first re-assignment; after it, one every ``K`` steps
            (growing by ``update_growth``). A head started from frequency bins (``init="frequency"``) can
            train on them this long before it self-organizes. Default ``None``: ``K`` (the paper).
        update_growth: factor by which the interval between re-assignments grows after
            each one: re-assignments at steps ``K``, ``K + K g``, ``K + K g + K g^2``, ...
            ``1.0`` (the paper) re-assigns every ``K`` steps.
        smoothing: ``"epoch"`` (default): ``1 - lambda(w) = 1 / f_w``, an exponential
            average over about one epoch of the word's occurrences, which is what
            the paper's text describes; ``"paper_literal"``: ``lambda(w) = 1 / f_w``
            as Eq. 10 is printed (a word seen once never updates, a frequent word
            keeps only its latest sample).
        solver: how Algorithm 1 is computed; all give the same assignment.
            ``"sequential"``: word by word on the host (``q`` is copied there from a GPU);
            ``"deferred_acceptance"``: in rounds of tensor operations on ``q``'s device
            (:mod:`sohsm.clustering.deferred_acceptance`), with one read-back per round, so
            that ``q`` never leaves the GPU; ``"auto"`` (default): the deferred one when ``q``
            is on a GPU, the sequential one on the CPU. Their times: ``docs/benchmarks/recluster.md``
            (CPU) and ``docs/benchmarks/gpu.md``.
        q_clusters: ``M``, keep ``q`` compact: per word only the ``M`` clusters with the highest
            ``q`` (ids and values) and one value standing for every other cluster, the best of them
            (:mod:`sohsm.heads.two_level.self_organizing.compact_statistics`): ``N (2M + 1)`` 4-byte numbers in
            place of ``N * n_clusters`` floats; from 1 to the head's learned clusters (the head checks it: it
            knows them).
            Algorithm 1 reads each word's kept clusters alone (``O(N M)``, not ``O(N C)``). The sync-free path
            refuses it. Its measured cost in perplexity and memory: docs/results/lm.md, "q in a compact form".
            Default ``None``: the dense ``q``; a new ``sohsm lm train`` run on the CPU whose dense ``q`` would pass
            256 MiB (about 190,000 words) takes 16 (``run_defaults.compact_q_defaults``).
        freeze_after_tokens: stop re-clustering once the head has trained on this many
            tokens (after one last re-assignment). Default: ``None``, never.
        reset_on_freeze: what freezing does to the head's weights: ``"none"`` (default),
            ``"head"`` (re-initialise the head's weights and zero their optimizer state,
            so that they are learned afresh on the final clusters), ``"head_keep_state"``
            (re-initialise the weights, keep the optimizer state).
        moved_vectors: what a word's vector becomes when it moves: ``"keep"`` (default,
            the paper) or ``"cluster_mean"`` (the mean vector and optimizer state of the
            words that stayed in its new cluster).
        stay_margin: a word's own cluster gets this much more ``q`` (nats) when Algorithm 1
            places it, so a word moves only where another cluster is better by more than the
            margin: fewer, surer moves at each re-clustering. Needs the dense ``q``
            (``q_clusters=None``). Default: 0.0 (the paper).

    Raises:
        ValueError: a value out of its range, naming the option.

    Example::

        >>> Reclustering(update_every=100).gamma
        1.5
        >>> Reclustering(gamma=0)
        Traceback (most recent call last):
        ...
        ValueError: gamma must be positive, got 0
    """

    gamma: float = 1.5
    freq_budget: float = 0.1
    update_every: int | None = None
    reclusters_per_epoch: float = 8.0
    first_update: int | None = None
    update_growth: float = 1.0
    smoothing: str = "epoch"
    solver: str = "auto"
    q_clusters: int | None = None
    freeze_after_tokens: int | None = None
    reset_on_freeze: str = "none"
    moved_vectors: str = "keep"
    stay_margin: float = 0.0

    def __post_init__(self) -> None:
        _choice("smoothing", self.smoothing, SMOOTHING)
        _choice("solver", self.solver, SOLVERS)
        _choice("reset_on_freeze", self.reset_on_freeze, RESETS)
        _choice("moved_vectors", self.moved_vectors, MOVED_VECTORS)
        for name in ("gamma", "freq_budget", "reclusters_per_epoch"):
            value = getattr(self, name)
            if not (_is_number(value) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, got {value}")
        if not (_is_number(self.update_growth) and math.isfinite(self.update_growth) and self.update_growth >= 1.0):
            raise ValueError(f"update_growth must be a finite number >= 1, got {self.update_growth!r}")
        if not (_is_number(self.stay_margin) and math.isfinite(self.stay_margin) and self.stay_margin >= 0):
            raise ValueError(f"stay_margin must be a finite number >= 0, got {self.stay_margin!r}")
        if self.stay_margin and self.q_clusters is not None:
            raise ValueError("stay_margin needs the dense q: it cannot be combined with q_clusters")
        # q_clusters: the head knows its bound
        for name, low in (("update_every", 0), ("first_update", 1), ("freeze_after_tokens", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} must be None or an integer >= {low}, got {value!r}")

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The options this group holds, by their flat names (``gamma``, ``update_every``, ...)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def take(cls, options: dict[str, Any]) -> Reclustering:
        """The group made from the entries of flat ``options`` it holds, which are removed from ``options``."""
        return cls(**{name: options.pop(name) for name in cls.option_names() if name in options})


def smoothing_factor(counts: Tensor, smoothing: str) -> Tensor:
    """``lambda(w)`` of Eq. 10 for the given counts (float64): ``1 - 1/f`` (``"epoch"``) or ``1/f``
    (``"paper_literal"``), ``f`` the count floored at 1."""
    f = counts.to(torch.float64).clamp(min=1.0)
    return 1.0 / f if smoothing == "paper_literal" else 1.0 - 1.0 / f


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
