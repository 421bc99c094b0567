"""Which backend computes a two-level head's in-cluster softmax on a device, and whether a captured step can run it.

:class:`BackendChoice` is mixed into :class:`~sohsm.heads.TwoLevelSoftmax`: the ``backend`` setting, the backend
that runs on a device in a dtype (:func:`~sohsm.heads.two_level.ops.select_backend`, the one registry of
:mod:`sohsm.heads.two_level.ops.backends`), and what a whole-step graph asks of it (nothing read back to the host).
What it reads of its host beyond a :class:`~sohsm.heads.base.ClusteredHead` is declared in the class body, under
``TYPE_CHECKING``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sohsm.heads.two_level.ops import BackendInfo, ClusterLayout, check_backend, select_backend
from sohsm.heads.two_level.word_vectors import WordVectors

if TYPE_CHECKING:  # for the checker the mixin is the kind of head it is mixed into; at run time a plain class
    from sohsm.heads.base import ClusteredHead as _Head
else:
    _Head = object


class BackendChoice(_Head):
    """Mixin of :class:`~sohsm.heads.TwoLevelSoftmax`: its ``backend`` and the backend that runs where (see the
    module). ``tests/heads/two_level/test_host_protocols.py`` checks that it reads only what a ClusteredHead has
    and its ``TYPE_CHECKING`` block declares."""

    if TYPE_CHECKING:  # what it reads of the head beyond a ClusteredHead's (the host test reads this block)
        words: WordVectors
        _backend: str
        _layout_cache: ClusterLayout | None

    @property
    def backend(self) -> str:
        """How the in-cluster softmax is computed (see the head's constructor); settable."""
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_backend(value)

    def check_device(self, device: torch.device) -> None:
        """Refuse a ``backend`` that cannot run on ``device`` (``"triton"`` on the CPU, or without Triton)."""
        self.backend_for(device)

    def backend_for(self, device: torch.device, compute: torch.dtype | None = None) -> BackendInfo:
        """The in-cluster backend that runs on ``device`` with products in ``compute`` (default: the weight's dtype):
        :attr:`backend`, or what ``"auto"`` picks there from the registry (:mod:`sohsm.heads.two_level.ops.backends`),
        fallbacks included. Compact statistics (``q_clusters``) are folded in by the per-cluster backend only."""
        compute = self.words.weights[0].dtype if compute is None else compute
        return select_backend(self.backend, torch.device(device), compute, sync_free=not self._observes_on_host())

    def graph_refusal(self, device: torch.device, compute: torch.dtype | None = None) -> str | None:
        """``None`` with a sync-free backend on ``device`` in ``compute`` (Triton's, probed in bf16 under bf16)."""
        backend = self.backend_for(device, compute)
        if backend.sync_free:
            return None
        return (f"the {type(self).__name__} head's {backend.name!r} backend reads its batch back to the host "
                "(backend='triton' or 'grouped_torch' does not)")

    def _observes_on_host(self) -> bool:
        """Whether the head's ``_observe`` must run on the host (a subclass's statistics that only the per-cluster
        backend folds in): ``"auto"`` then takes no sync-free backend. ``False`` here."""
        return False

    def _sync_free_width(self) -> int:
        """Static width of the sync-free path's logits: the largest cluster (fixed clusters)."""
        assert self._layout_cache is not None  # derived in the head's constructor
        return self._layout_cache.max_size
