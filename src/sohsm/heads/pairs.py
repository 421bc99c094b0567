"""A head's training loss as independent logistic decisions, one per (row, vector) pair: what word2vec's
hand-written loop trains without autograd, asking the head, never its class.

A head says whether its loss splits so (:attr:`~sohsm.heads.Head.binary_pairs`: ``"paths"`` for a binary tree,
``"noise"`` for negative sampling with noise words of each row's own and no bias); :func:`binary_pairs` then gives
the :class:`BinaryPairs` of a head: the output vectors the pairs index, the shift of every pair's score, and each
row's pairs with their labels. The loss is ``-log sigma(+-(u_n . h_r - offset))`` summed over the pairs.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from sohsm.heads.base import Head

if TYPE_CHECKING:
    from sohsm.heads.binary_tree import BinaryTreeSoftmax
    from sohsm.heads.sampled import PMISoftmax


class BinaryPairs(Protocol):
    """The pairs of a head's loss.

    Attributes:
        vectors: ``[V, d]`` the output vectors the pairs' nodes index (the head's own weight: a hand-written step
            updates it in place).
        offset: subtracted from every pair's score ``u_n . h_r``.
        by_word: where a row's pairs follow from its target alone (a tree's paths), ``(nodes, labels, start,
            length)``: word ``w``'s pairs are ``nodes[start[w]: start[w] + length[w]]``; else ``None``.

    Calling it with targets ``[R]`` gives ``(nodes [P], labels [P], pairs per row [R])``, row after row, labels 1
    for the decision towards the target.
    """

    vectors: Tensor
    offset: float
    by_word: tuple[Tensor, Tensor, Tensor, Tensor] | None

    def __call__(self, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...  # pragma: no cover


class PathPairs:
    """A binary tree's: the nodes on each target's path, label 1 towards child 0 (word2vec: 1 - code)."""

    offset = 0.0

    def __init__(self, head: BinaryTreeSoftmax) -> None:
        nodes, signs = head.paths()  # [N, D] each, signs 0 past a path's end
        on_path = signs != 0
        self.vectors: Tensor = head.weight
        self.length = on_path.sum(dim=1)  # [N]
        self.start = torch.cumsum(self.length, 0) - self.length  # [N]
        self.nodes = nodes[on_path].contiguous()  # [sum L], row-major: each word's path, root first
        self.labels = (signs[on_path] > 0).to(head.weight.dtype)  # [sum L]
        self.by_word: tuple[Tensor, Tensor, Tensor, Tensor] | None = (self.nodes, self.labels, self.start, self.length)

    def __call__(self, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lengths = self.length.index_select(0, targets)  # [R]
        ends = torch.cumsum(lengths, 0)  # [R] where each row's pairs end
        total = int(ends[-1]) if targets.numel() else 0
        # position of pair p in the flat table: start[target of its row] + (p - where its row's pairs start)
        shift = torch.repeat_interleave(self.start.index_select(0, targets) - ends + lengths, lengths,
                                        output_size=total)  # [P]
        flat = shift.add_(torch.arange(total))
        return self.nodes.index_select(0, flat), self.labels.index_select(0, flat), lengths


class NoisePairs:
    """Negative sampling's: the target (label 1) and ``k`` noise words (label 0) of every row, drawn by the head
    itself (its generator, so a resumed run draws the same); scores shifted by ``log k`` where the head shifts."""

    by_word: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def __init__(self, head: PMISoftmax) -> None:
        self.head = head
        self.vectors: Tensor = head.weight
        self.k = head.n_samples
        self.offset = math.log(head.n_samples) if head.shift else 0.0
        self.labels = torch.zeros(self.k + 1, dtype=head.weight.dtype)
        self.labels[0] = 1

    def __call__(self, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        rows = targets.numel()
        noise = self.head.noise_samples(rows * self.k).view(rows, self.k)
        nodes = torch.cat([targets.unsqueeze(1), noise], dim=1).reshape(-1)  # [R (k + 1)]
        return nodes, self.labels.repeat(rows), torch.full((rows,), self.k + 1, dtype=torch.long)


#: each kind's pairs, made of a head whose :attr:`~sohsm.heads.Head.binary_pairs` names it
_KINDS: dict[str, Callable[[Any], BinaryPairs]] = {"paths": PathPairs, "noise": NoisePairs}


def binary_pairs(head: Head) -> BinaryPairs | None:
    """The :class:`BinaryPairs` of ``head``'s loss, or ``None`` where it does not split into logistic decisions."""
    kind = head.binary_pairs
    return None if kind is None else _KINDS[kind](head)
