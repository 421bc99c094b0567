"""Where each word's row of a two-level head's weight sits: the cluster layout every op reads.

The word vectors ``U^V`` are stored *grouped by cluster*: rows ``offsets[c] : offsets[c] + sizes[c]``
of the weight are the words of cluster ``c`` in increasing word id. A cluster's words are then one
contiguous block, so an op scores a cluster by one product on a slice and writes its gradient as
one block. The head owns its layout (derived from its ``assignment``) and passes it to the ops.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from sohsm.heads.two_level.word_bands import BandRows


class ClusterLayout:
    """Where each word's row of the weight sits: a derived, non-persistent view of an assignment.

    Args:
        assignment: ``[N]`` cluster id of every word.
        n_clusters: the number of clusters ``C`` (some may be empty).

    Attributes:
        word_of_slot / slot_of_word: ``[N]`` the word at each row of the weight, and back.
        sizes / offsets: words of each cluster and where its block starts (host lists, read back on first
            use: only the per-cluster kernel needs them; ``sizes_t`` / ``offsets_t`` the same on the device,
            ``offsets`` has ``C + 1`` entries).
        max_size: the largest cluster (the one value a layout reads back when it is built).
        cluster_of_slot: ``[N]`` cluster of each row.
        position_of_word: ``[N]`` position of each word inside its cluster's block.
        empty_clusters: ``[C]`` bool, clusters without words (kept on the device, never read back); ``empty_bias``
            the same as a ``[C]`` bias (0, or ``-inf``).
        retired: set by the owner once another layout replaces this one (the rows moved): a backward
            that saved this layout then refuses to write a gradient for rows that are no longer there.
        serial: a number no other layout of this process has: what a captured step's fingerprint names (an
            ``id()`` may be reused once a layout is freed). :meth:`update_from` keeps it, and its storage.
        rewrites: how many times :meth:`update_from` rewrote this layout in place.
        bands: set by the owner of word vectors with differentiated dimensions (``div_value``), with the version
            of the bands it was derived from (``bands_version``): where each word's row sits in its band's weight
            (:class:`~sohsm.heads.two_level.word_bands.BandRows`); ``None``: one weight, rows in slot order.
    """

    def __init__(self, assignment: Tensor, n_clusters: int) -> None:
        #: version of the ``assignment`` tensor this layout was derived from (see ``TwoLevelSoftmax._layout``)
        self.version = assignment._version
        n_words = assignment.numel()
        device = assignment.device
        # words sorted by (cluster, word id): a stable sort keeps word-id order inside a cluster
        self.word_of_slot = torch.sort(assignment, stable=True).indices
        self.slot_of_word = torch.empty_like(self.word_of_slot)
        self.slot_of_word[self.word_of_slot] = torch.arange(n_words, device=device)
        sizes = torch.bincount(assignment, minlength=n_clusters)
        offsets = torch.zeros(n_clusters + 1, dtype=torch.long, device=device)
        offsets[1:] = sizes.cumsum(0)
        self.sizes_t = sizes
        self.offsets_t = offsets
        self._host: tuple[list[int], list[int]] | None = None
        self.max_size = int(sizes.max()) if n_clusters else 0
        self.cluster_of_slot = assignment[self.word_of_slot]
        #: [C] True for clusters without words (their P(c | h) must be 0)
        self.empty_clusters = sizes == 0
        #: [C] 0, or -inf for a cluster without words: the cluster scores' bias (masks them in the product itself)
        self.empty_bias = torch.zeros(n_clusters, device=device).masked_fill_(self.empty_clusters, float("-inf"))
        #: position of each word inside its cluster's block
        self.position_of_word = self.slot_of_word - offsets[assignment]
        #: ``[2, N]``: each word's cluster and its position there, read for a batch's targets in one gather
        self.cluster_and_position = torch.stack([assignment, self.position_of_word])
        self.retired = False
        self.bands: BandRows | None = None
        self.bands_version = -1
        #: ``(key, ScoredRows)``: where exact evaluation finds each row (:func:`~.log_prob.scored_rows`)
        self.scored_rows: tuple | None = None
        self.serial = next(_SERIALS)
        self.rewrites = 0

    @torch.no_grad()
    def update_from(self, other: ClusterLayout) -> None:
        """Become ``other`` in place: its values copied into this layout's tensors (and band rows), whose storage a
        captured CUDA graph reads, so that a re-clustering does not call for a new capture. Every tensor keeps its
        shape (``[N]``, ``[C]``, ``[C + 1]``, ``[2, N]``; each band's row count is fixed), so only values move."""
        for name in _DEVICE_TENSORS:
            getattr(self, name).copy_(getattr(other, name))
        self.version, self.max_size, self._host = other.version, other.max_size, other._host
        if self.bands is not None and other.bands is not None:
            self.bands.update_from(other.bands)
            self.bands_version = other.bands_version
        else:
            self.bands, self.bands_version = other.bands, other.bands_version
        self.rewrites += 1

    @property
    def sizes(self) -> list[int]:
        return self._host_lists()[0]

    @property
    def offsets(self) -> list[int]:
        return self._host_lists()[1]

    def _host_lists(self) -> tuple[list[int], list[int]]:
        if self._host is None:  # one read of both, on first use
            both = torch.cat([self.sizes_t, self.offsets_t]).tolist()
            self._host = (both[: self.sizes_t.numel()], both[self.sizes_t.numel():])
        return self._host


#: the layout's device tensors, each of a shape the assignment does not change (:meth:`ClusterLayout.update_from`)
_DEVICE_TENSORS = ("word_of_slot", "slot_of_word", "sizes_t", "offsets_t", "cluster_of_slot", "empty_clusters",
                   "empty_bias", "position_of_word", "cluster_and_position")
_SERIALS = itertools.count(1)


@torch.no_grad()
def move_rows(tensors: list[Tensor | None], permutation: Tensor) -> None:
    """``t.copy_(t[permutation])`` for each tensor (``None`` skipped), through one scratch buffer per dtype:
    on the CPU a fresh ``N x d`` tensor per move costs more than the move itself (its pages fault in)."""
    scratch: dict = {}
    for t in tensors:
        if t is None:
            continue
        key = (t.dtype, t.device, t.shape)
        if key not in scratch:
            scratch[key] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        torch.index_select(t, 0, permutation, out=scratch[key])
        t.copy_(scratch[key])
