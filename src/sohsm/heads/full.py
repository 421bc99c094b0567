"""The full softmax: the reference every other head is compared with."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.base import Head, HeadMemory, HeadOutput, init_word_vectors, upcast
from sohsm.heads.registry import register_head


class FullSoftmax(Head):
    """``log P(w | h) = log_softmax(h U^T + b)_w`` over all ``N`` words.

    Exactly ``nn.Linear`` followed by ``F.cross_entropy``, behind the head
    interface. It materialises ``B x N`` logits (and their gradient), which is
    what the two-level heads avoid.

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        bias: add a learned bias per word. Default: ``False`` (as in the paper's equations).

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]``
        - returns :class:`HeadOutput` with ``output`` ``[B]`` and scalar ``loss``
    """

    logits_are_linear = True

    def __init__(self, in_features: int, n_classes: int, *, bias: bool = False) -> None:
        super().__init__(in_features, n_classes)
        self.weight = nn.Parameter(torch.empty(n_classes, in_features))
        self.bias = nn.Parameter(torch.zeros(n_classes)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_word_vectors(self.weight, self.bias)

    @classmethod
    def memory_estimate(cls, in_features: int, n_classes: int, options: dict, rows: int) -> HeadMemory:
        """Its word vectors, and the ``[rows, N]`` logits and their gradient (float32) a step holds."""
        return HeadMemory(n_classes * in_features, n_classes * in_features, 2 * rows * n_classes * 4, "output logits")

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        """``None``: the ``[N, d]`` word vectors can always be the embedding (a bias stays the head's)."""
        return None

    def tied_embedding(self) -> nn.Embedding:
        """An ``nn.Embedding`` whose weight IS :attr:`weight` (one parameter, saved under the model's
        ``embedding.weight`` as well); the model re-draws it with its embedding's initialisation
        (:meth:`tied_vectors`)."""
        embedding = nn.Embedding(self.n_classes, self.in_features, _weight=self.weight.detach())  # no random draw
        embedding.weight = self.weight
        return embedding

    def tied_vectors(self) -> list[Tensor]:
        return [self.weight]

    def set_word_vectors(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """The logits become ``h weight^T + bias`` exactly (``bias`` ignored by a head built without one)."""
        self._check_word_vectors(weight)
        with torch.no_grad():
            self.weight.copy_(weight)
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias)

    def graph_refusal(self, device: torch.device, compute: torch.dtype | None = None) -> str | None:
        """``None``: one product and a cross-entropy, nothing read back."""
        return None

    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        output = -F.cross_entropy(upcast(F.linear(hidden, self.weight, self.bias)), target, reduction="none")
        return HeadOutput(output, -output.mean())

    def log_prob(self, hidden: Tensor) -> Tensor:
        hidden = self._flatten_hidden(hidden)
        return F.log_softmax(upcast(F.linear(hidden, self.weight, self.bias)), dim=1)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``; the normaliser is computed once, after the top-k."""
        k = self._check_k(k)
        logits = upcast(F.linear(self._flatten_hidden(hidden), self.weight, self.bias))
        values, indices = logits.topk(k, dim=1)
        return values - logits.logsumexp(dim=1, keepdim=True), indices

    def predict(self, hidden: Tensor) -> Tensor:
        """Same as ``log_prob(hidden).argmax(1)``, without normalising."""
        return F.linear(self._flatten_hidden(hidden), self.weight, self.bias).argmax(dim=1)


@register_head("full", builds=FullSoftmax)
def _full(in_features: int, n_classes: int, counts=None, **options) -> FullSoftmax:
    return FullSoftmax(in_features, n_classes, **options)
