"""Words moved between clusters: every word's vector, its gradient and its optimizer state go together.

Mixed into :class:`~sohsm.heads.two_level.softmax.TwoLevelSoftmax` (whose re-clustering subclass calls
:meth:`ClusterMoves._move_words` with assignments it made itself), apart from the module's parameters and scoring.
It reads the head's ``assignment``, ``words``, ``_layout``, ``_static`` and ``_optimizers``.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from sohsm.clustering import check_assignment
from sohsm.heads.two_level.ops import ClusterLayout

if TYPE_CHECKING:
    from sohsm.heads.two_level.word_vectors import WordVectors


class ClusterMoves:
    """:meth:`set_assignment` and the moves under it (a mixin of the two-level head)."""

    if TYPE_CHECKING:  # for the checker: what it reads of the head (module docstring), as the head defines it
        n_classes: int
        n_clusters: int
        assignment: Tensor
        words: WordVectors
        _layout: ClusterLayout
        _static: bool
        _optimizers: weakref.WeakKeyDictionary

    def set_assignment(self, assignment: Tensor, optimizer: torch.optim.Optimizer | None = None) -> Tensor:
        """Move words to new clusters, keeping every word's vector, gradient and optimizer state.

        The rows of :attr:`weight` are re-laid out for the new clusters; the same
        permutation is applied to ``weight.grad`` and to every weight-shaped
        tensor in the state of ``optimizer`` and of the optimizers given to
        :meth:`attach` (Adagrad sums, Adam moments, momentum buffers, ...).
        An unchanged assignment changes nothing at all.

        Returns:
            ``[N]`` bool tensor: which words changed cluster.
        """
        new = check_assignment(assignment, self.n_classes, self.n_clusters).to(self.assignment.device)
        moved = new != self.assignment
        if not bool(moved.any()):
            return moved
        return self._move_words(new, moved, optimizer)

    def _move_words(self, new: Tensor, moved: Tensor, optimizer: torch.optim.Optimizer | None) -> Tensor:
        """:meth:`set_assignment` of a checked ``new`` assignment on the head's device, reading nothing back but what
        a new layout reads (its largest cluster; with bands, where each band's rows are): a re-clustering's own
        assignment is valid by construction, and moving none is a plain copy."""
        old_layout = self._layout
        new_layout = ClusterLayout(new, self.n_clusters)
        # new slot s holds word new.word_of_slot[s], which sat at old.slot_of_word[...]
        permutation = old_layout.slot_of_word[new_layout.word_of_slot]
        self.words.move(old_layout, new_layout, permutation,
                        lambda weight: self._optimizer_state(weight, optimizer, rows=True))
        self.assignment.copy_(new)
        new_layout.version = self.assignment._version
        if not self._static:
            self._layout = new_layout
        else:  # a captured step reads the layout's storage: the new clusters go there
            old_layout.update_from(new_layout)
        return moved

    def _optimizer_state(self, param: Tensor, optimizer: torch.optim.Optimizer | None = None,
                         rows: bool = False) -> list[Tensor]:
        """The tensors in the state of ``param`` of every attached optimizer and of ``optimizer``: with
        ``rows``, those shaped like ``param`` (one row per word: Adagrad sums, Adam moments, momentum)."""
        optimizers = list(self._optimizers)
        if optimizer is not None and all(optimizer is not o for o in optimizers):
            optimizers.append(optimizer)
        return [value for opt in optimizers for value in opt.state.get(param, {}).values()
                if isinstance(value, Tensor) and (not rows or value.shape == param.shape)]
