"""Weight tying (Press & Wolf 2017): the model's input embedding is the head's output word vectors.

The head owns the word vectors and says whether and how it lends them
(:meth:`~sohsm.heads.Head.tied_embedding`): a full softmax lends its parameter itself;
a two-level head reads each word's row through its cluster layout, so the embedding
follows every re-clustering; adaptive softmax reads words as adaptive input does
(Baevski & Auli 2019: shortlist rows, tail vectors projected back up to ``d``). This
module only checks that the model's embedding can be replaced and that the sizes agree.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from sohsm.heads.base import Head
from sohsm.heads.tying import HeadEmbedding

__all__ = ["HeadEmbedding", "tie_embedding"]


def tie_embedding(embedding: nn.Module, head: Head, init: Callable[[Tensor], object] | None = None) -> nn.Module:
    """The model's embedding after tying it to ``head``: the module ``head.tied_embedding()`` lends.

    ``init`` (the model's embedding initialisation) re-draws the head's word vectors that the embedding reads
    (:meth:`~sohsm.heads.Head.tied_vectors`), so that a tied weight starts as the model's embedding would,
    whatever the head: the same rule for every head and model (docs/results/first-steps.md).

    Raises:
        ValueError: the embedding is tied already, the head cannot be tied (its reason), or the head's
            vocabulary or width is not the embedding's.
    """
    if not isinstance(embedding, nn.Embedding):
        raise ValueError("the model's embedding is tied already")
    shape, head_shape = tuple(embedding.weight.shape), (head.n_classes, head.in_features)
    if head_shape != shape:
        raise ValueError(f"weight tying needs the head's {head_shape[0]} words x {head_shape[1]} inputs to match the "
                         f"embedding {shape}")
    tied = head.tied_embedding()
    if init is not None:
        with torch.no_grad():
            head.draw_tied_vectors(init)
    return tied
