"""Weight tying (Press & Wolf 2017): the model's input embedding is the head's output word vectors.

A :class:`~sohsm.heads.FullSoftmax` keeps its ``[N, d]`` vectors in word-id order, so the
two modules share one parameter. A two-level head (fixed or self-organized) keeps them
grouped by cluster and moves rows when the clusters change; the model then reads each
word's row through the head's layout (:meth:`~sohsm.heads.TwoLevelSoftmax.embed`), so the
embedding follows every re-clustering and both gradients land in the one weight.
"""
from __future__ import annotations

from torch import Tensor, nn

from sohsm.heads.base import Head
from sohsm.heads.full import FullSoftmax


class HeadEmbedding(nn.Module):
    """An input embedding that looks words up in a two-level head's word vectors.

    The head is held outside the module tree (it is the run's head, saved and moved
    with it), so the model owns no copy of the vectors.
    """

    def __init__(self, head: Head) -> None:
        super().__init__()
        self._head = (head,)  # a tuple: not registered as a submodule

    @property
    def head(self) -> Head:
        return self._head[0]

    def forward(self, ids: Tensor) -> Tensor:
        return self.head.embed(ids)

    def extra_repr(self) -> str:
        return f"tied to {type(self.head).__name__}"


def tie_embedding(embedding: nn.Module, head: Head) -> nn.Module:
    """The model's embedding after tying it to ``head``: ``embedding`` itself (full softmax) or a
    :class:`HeadEmbedding` (two-level heads).

    Raises:
        ValueError: the head has no word vectors an embedding can share, or their size is not the embedding's.
    """
    if not isinstance(embedding, nn.Embedding):
        raise ValueError("the model's embedding is tied already")
    shape = tuple(embedding.weight.shape)
    if not isinstance(head, FullSoftmax) and not callable(getattr(head, "embed", None)):
        raise ValueError(f"weight tying needs a full softmax or a two-level head (its N x d word vectors); "
                         f"{type(head).__name__} has none to share")
    if tuple(head.weight.shape) != shape:
        raise ValueError(f"weight tying needs the head's word vectors {tuple(head.weight.shape)} shaped like the "
                         f"embedding {shape} (word_dim, div_value and cutoffs change their width)")
    if isinstance(head, FullSoftmax):
        head.weight = embedding.weight
        return embedding
    return HeadEmbedding(head)
