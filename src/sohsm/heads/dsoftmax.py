"""Differentiated softmax (Chen et al. 2016): frequent words get more dimensions than rare ones."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.adaptive import check_cutoffs, frequency_ranks
from sohsm.heads.base import Head, HeadOutput, upcast
from sohsm.heads.registry import register_head


def default_dims(in_features: int, n_bands: int) -> list[int]:
    """Half of ``d`` for the most frequent band, a quarter for the next, ...; the last band takes the rest.

    >>> default_dims(512, 3)
    [256, 128, 128]
    """
    dims, left = [], int(in_features)
    for _ in range(n_bands - 1):
        dims.append(max(1, left // 2))
        left -= dims[-1]
    return dims + [left]


class DifferentiatedSoftmax(Head):
    """Differentiated softmax: a block-diagonal output layer over frequency bands.

    Words ranked by training frequency are cut into bands; the hidden state is
    cut into segments, one per band, of ``dims[i]`` dimensions (they sum to
    ``d``), and a word of band ``i`` is scored only on segment ``i``. The scores
    of all ``N`` words share one softmax, so ``log_prob`` is exact; a step costs
    ``sum_i |band_i| * dims[i]`` multiply-adds per token instead of ``N * d``.

    Paper: Chen, Grangier and Auli (2016), "Strategies for training large
    vocabulary neural language models", https://arxiv.org/abs/1512.04906 (§2.3).

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        cutoffs: increasing frequency ranks in ``[1, N - 1]`` where bands start,
            e.g. ``[2000, 10000]`` for three bands. Default: the adaptive head's
            :func:`~sohsm.heads.adaptive.default_cutoffs`.
        dims: dimensions of the bands, most frequent first, positive and summing
            to ``d``. Default: :func:`default_dims` (``d/2, d/4, ...``).
        bias: learn a bias per word (stored, like :attr:`weights`, in frequency-rank
            order). Default: ``False``.
        counts: ``[N]`` training counts that rank the words. Default: ``None``
            (word ids are frequency ranks, as sohsm's vocabularies are).

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput` with ``output`` ``[B]`` and scalar ``loss``

    Example::

        >>> head = DifferentiatedSoftmax(16, 100, cutoffs=[10, 40], dims=[8, 4, 4])
        >>> [tuple(w.shape) for w in head.weights]
        [(10, 8), (30, 4), (60, 4)]
        >>> output, loss = head(torch.randn(3, 16), torch.tensor([0, 50, 99]))
    """

    # buffers (register_buffer), declared for the checker
    word_of_rank: Tensor
    rank_of_word: Tensor

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        cutoffs: Sequence[int] | None = None,
        *,
        dims: Sequence[int] | None = None,
        bias: bool = False,
        counts: Tensor | None = None,
    ) -> None:
        super().__init__(in_features, n_classes)
        cutoffs = check_cutoffs(cutoffs, n_classes)
        dims = default_dims(in_features, len(cutoffs) + 1) if dims is None else list(dims)
        if (len(dims) != len(cutoffs) + 1 or any(isinstance(x, bool) or int(x) != x or x < 1 for x in dims)
                or sum(dims) != in_features):
            raise ValueError(f"dims must be {len(cutoffs) + 1} positive integers (one per band) summing to "
                             f"in_features={in_features}, got {dims}")
        self.cutoffs = [int(c) for c in cutoffs]
        self.dims = [int(x) for x in dims]
        bounds = [0, *self.cutoffs, n_classes]
        self.band_sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
        #: output vectors of each band's words (frequency-rank order), ``[|band_i|, dims[i]]``
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(n, dim)) for n, dim in zip(self.band_sizes, self.dims))
        self.bias = nn.Parameter(torch.zeros(n_classes)) if bias else None
        word_of_rank = frequency_ranks(counts, n_classes)
        rank_of_word = torch.empty_like(word_of_rank)
        rank_of_word[word_of_rank] = torch.arange(n_classes)
        self.register_buffer("word_of_rank", word_of_rank)
        self.register_buffer("rank_of_word", rank_of_word)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight, dim in zip(self.weights, self.dims):
            bound = dim ** -0.5
            nn.init.uniform_(weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _rank_logits(self, hidden: Tensor) -> Tensor:
        """``[B, N]`` logits in frequency-rank order: band ``i`` scored on its segment of ``hidden``."""
        segments = hidden.split(self.dims, dim=1)
        logits = upcast(torch.cat([F.linear(h, w) for h, w in zip(segments, self.weights)], dim=1))
        return logits if self.bias is None else logits + self.bias

    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        output = -F.cross_entropy(self._rank_logits(hidden), self.rank_of_word[target], reduction="none")
        return HeadOutput(output, -output.mean())

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities in word-id order."""
        return F.log_softmax(self._rank_logits(self._flatten_hidden(hidden)), dim=1)[:, self.rank_of_word]

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``; the normaliser is computed once, after the top-k."""
        k = self._check_k(k)
        logits = self._rank_logits(self._flatten_hidden(hidden))
        values, ranks = logits.topk(k, dim=1)
        return values - logits.logsumexp(dim=1, keepdim=True), self.word_of_rank[ranks]

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        return "each band's word vectors cover only that band's segment of the hidden state, not all d entries"

    def predict(self, hidden: Tensor) -> Tensor:
        """Same as ``log_prob(hidden).argmax(1)``, without normalising."""
        return self.word_of_rank[self._rank_logits(self._flatten_hidden(hidden)).argmax(dim=1)]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, n_classes={self.n_classes}, cutoffs={self.cutoffs}, "
                f"dims={self.dims}, bias={self.bias is not None}")


@register_head("dsoftmax")
def _dsoftmax(in_features: int, n_classes: int, counts=None, cutoffs: Sequence[int] | None = None,
              dims: Sequence[int] | None = None, bias: bool = False) -> DifferentiatedSoftmax:
    return DifferentiatedSoftmax(in_features, n_classes, cutoffs=cutoffs, dims=dims, bias=bias, counts=counts)
