"""The input embedding a head lends a model when the two are tied (Press & Wolf 2017).

A head whose word vectors can be the model's input embedding returns one from
:meth:`~sohsm.heads.Head.tied_embedding`. The full softmax keeps its ``[N, d]`` vectors
in word-id order and lends the parameter itself (an ``nn.Embedding`` over it). A head
that keeps them in its own layout (a two-level head: grouped by cluster, moved at every
re-clustering; adaptive softmax: ranked by frequency, tail words in fewer dimensions)
lends a :class:`HeadEmbedding`, which reads each word through ``head.embed(ids)``.
"""
from __future__ import annotations

from torch import Tensor, nn

from sohsm.heads.base import Head


class HeadEmbedding(nn.Module):
    """An input embedding that looks words up through ``head.embed(ids)``: ``[*] -> [*, d]``.

    The head is held outside the module tree (it is the run's head, saved and moved
    with it), so the model owns no copy of the vectors and both gradients land in the
    head's parameters.
    """

    def __init__(self, head: Head) -> None:
        super().__init__()
        if not isinstance(head, Head) or type(head).embed is Head.embed:  # the base refuses every word
            raise TypeError(f"{type(head).__name__} has no embed(ids) to read its word vectors through")
        self._head = (head,)  # a tuple: not registered as a submodule

    @property
    def head(self) -> Head:
        return self._head[0]

    def forward(self, ids: Tensor) -> Tensor:
        return self.head.embed(ids)

    def extra_repr(self) -> str:
        return f"tied to {type(self.head).__name__}"
