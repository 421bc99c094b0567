"""A two-level head's word vectors as a model's input embedding, and as vectors given from outside.

:class:`TiedWords` is mixed into :class:`~sohsm.heads.TwoLevelSoftmax`, whose rows are grouped by cluster and move
at every re-clustering: an input embedding tied to them reads them through :meth:`TiedWords.embed` (by word id,
wherever the word's row is now), and vectors given in word-id order (a pretrained output layer) are written to the
rows of their words' slots. What it reads of its host beyond a
:class:`~sohsm.heads.base.ClusteredHead` is declared in the class body, under ``TYPE_CHECKING``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from sohsm.heads.two_level.ops import BackendInfo, ClusterLayout
from sohsm.heads.two_level.word_vectors import WordVectors
from sohsm.heads.tying import HeadEmbedding

if TYPE_CHECKING:  # for the checker the mixin is the kind of head it is mixed into; at run time a plain class
    from sohsm.heads.base import ClusteredHead as _Head
else:
    _Head = object


class TiedWords(_Head):
    """Mixin of :class:`~sohsm.heads.TwoLevelSoftmax`: its word vectors read by id and written by id (see the
    module). ``tests/heads/two_level/test_host_protocols.py`` checks that it reads only what a ClusteredHead has
    and its ``TYPE_CHECKING`` block declares."""

    if TYPE_CHECKING:  # what it reads of the head beyond a ClusteredHead's (the host test reads this block)
        word_dim: int
        word_projection: nn.Linear | None
        band_projections: nn.ModuleList | None
        words: WordVectors
        _layout: ClusterLayout

        def backend_for(self, device: torch.device, compute: torch.dtype | None = None) -> BackendInfo: ...

    def word_vectors(self) -> Tensor:
        """``[N, d]`` output vectors ``U^V`` in word-id order (a copy; with bands ``[N, d + d/div + ...]``, each row
        zero outside its band's block)."""
        return self.words.in_word_order(self._layout)

    def embed(self, ids: Tensor) -> Tensor:
        """``[*] -> [*, d]``: the vectors of ``ids``, a tied input embedding that follows the clusters
        (:meth:`WordVectors.embed <sohsm.heads.two_level.word_vectors.WordVectors.embed>`: row-sparse gradient where
        the backend writes the weight's gradient itself, with bands read back up to ``d`` as adaptive input does)."""
        backend = self.backend_for(ids.device)
        return self.words.embed(ids, self._layout, backend.writes_gradient, backend.sync_free)

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        """Tied unless ``word_dim < d`` gives every word vector fewer entries than the embedding's. With ``div_value``
        a rarer word's short vector is read back up to ``d`` through its band's projection, as adaptive input does
        (:meth:`embed`); Eq. 1's ``projection`` keeps ``d``."""
        word_dim = options.get("word_dim")
        if word_dim is not None and word_dim != in_features:
            return f"word_dim={word_dim} gives its word vectors {word_dim} entries, not the embedding's {in_features}"
        return None

    def tied_embedding(self) -> HeadEmbedding:
        """A :class:`~sohsm.heads.tying.HeadEmbedding` reading :meth:`embed`: it follows every re-clustering."""
        if self.word_projection is not None:
            raise ValueError(f"{type(self).__name__} cannot be tied: its word vectors have {self.word_dim} entries "
                             f"where the embedding needs {self.in_features} (word_dim)")
        return HeadEmbedding(self)

    def tied_vectors(self) -> list[Tensor]:
        """The weight, or each band's weight (i.i.d. rows: the layout's order does not matter to a fresh draw)."""
        return list(self.words.weights)

    def set_word_vectors(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """Word ``w``'s in-cluster vector becomes ``weight[w]``, in the row of its slot in the cluster layout (the
        clusters' own vectors are kept; a two-level head has no word bias, so ``bias`` is ignored)."""
        if self.word_dim != self.in_features or self.band_projections is not None:
            raise ValueError(f"{type(self).__name__}'s word vectors have {self.word_dim} entries "
                             f"{'in bands ' if self.band_projections is not None else ''}where [N, {self.in_features}] "
                             "vectors were given (word_dim, div_value and cutoffs change their width)")
        self._check_word_vectors(weight)
        self.words.set_in_word_order(weight, self._layout)
