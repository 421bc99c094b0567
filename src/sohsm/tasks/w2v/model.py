"""word2vec's model: input word vectors -> a hidden state that any sohsm head scores; and its SGD.

    CBOW       h = mean of the context words' vectors     -> head(h, centre word)
    skip-gram  h = the vector of one context word         -> head(h, centre word)

The head plays word2vec's output layer: ``tree_huffman`` is its hierarchical
softmax, ``pmi`` (with ``n_samples=5, noise_power=0.75, shift=False``, noise
drawn per row) its negative sampling, and every other head works the same way.

Two choices follow word2vec (and gensim) rather than autograd's defaults:

* the CBOW mean passes its gradient to every context word undivided
  (word2vec's ``cbow_mean=1`` update: ``neu1e`` is added to each context vector);
* :class:`LinearDecaySGD` sums the rows' gradients (the loop averages them) and lets
  the rate fall linearly to ``min_ratio`` of its start over the run, as word2vec's
  ``alpha`` does, so a batch of rows moves the vectors as word2vec's per-word
  updates do, in one step.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.tasks.w2v.data import ARCHITECTURES, W2VBatch


class _MeanUndividedGradient(torch.autograd.Function):
    """``summed / counts`` forward; the gradient passes to ``summed`` unchanged (word2vec's CBOW update)."""

    @staticmethod
    def forward(ctx, summed: Tensor, counts: Tensor) -> Tensor:
        return summed / counts.to(summed.dtype).unsqueeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class Word2Vec(nn.Module):
    """Input word vectors and how a batch becomes hidden states (CBOW or skip-gram).

    Args:
        n_words: vocabulary size ``N``.
        dim: vector size ``d`` (= the head's ``in_features``).
        architecture: ``"cbow"`` or ``"skipgram"``.
        exact_mean_gradient: CBOW only: back-propagate the mean exactly (each context word
            gets ``1/|context|`` of the gradient) instead of word2vec's undivided update.
            Default: ``False``.
        init_range: the vectors start uniform in ``[-init_range/d, init_range/d]``. Default: 1,
            gensim's start (``word2vec.c`` starts at 0.5: half as wide).

    The vectors have row-sparse gradients (only the rows a batch touches).

    Shape:
        - forward: a :class:`~sohsm.tasks.w2v.data.W2VBatch` of ``B`` rows -> ``[B, d]``

    Example::

        >>> model = Word2Vec(10, 4, "cbow")
        >>> batch = W2VBatch(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 3]), torch.tensor([3, 2]),
        ...                  torch.tensor([0, 9]), 5)
        >>> model(batch).shape
        torch.Size([2, 4])
    """

    def __init__(self, n_words: int, dim: int, architecture: str = "cbow", exact_mean_gradient: bool = False,
                 init_range: float = 1.0) -> None:
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
        if not init_range > 0:
            raise ValueError(f"init_range must be positive, got {init_range}")
        self.architecture = architecture
        self.exact_mean_gradient = bool(exact_mean_gradient)
        self.init_range = float(init_range)
        self.embedding = nn.Embedding(n_words, dim, sparse=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = self.init_range / self.embedding.embedding_dim
        nn.init.uniform_(self.embedding.weight, -bound, bound)

    @property
    def vectors(self) -> Tensor:
        """``[N, d]`` the word vectors (what word2vec exports)."""
        return self.embedding.weight

    def forward(self, batch: W2VBatch) -> Tensor:
        weight = self.embedding.weight
        if self.architecture == "skipgram":
            return F.embedding(batch.inputs, weight, sparse=True)  # [B, d]
        if self.exact_mean_gradient:
            return F.embedding_bag(batch.inputs, weight, batch.offsets, mode="mean", sparse=True)  # [B, d]
        summed = F.embedding_bag(batch.inputs, weight, batch.offsets, mode="sum", sparse=True)  # [B, d]
        return _MeanUndividedGradient.apply(summed, batch.counts)


class LinearDecaySGD(torch.optim.Optimizer):
    """Plain SGD on summed row gradients with word2vec's linearly falling rate.

    At step ``t`` of ``total_steps`` the per-row rate is
    ``start_lr * max(1 - t / total_steps, min_ratio)``. The loop's loss is the *mean*
    over the batch's ``rows()`` rows, so the gradient is multiplied back by ``rows()``:
    each row moves the parameters as one of word2vec's per-word updates would.

    A parameter row that many rows of one batch touch (the Huffman tree's root is on
    every path, a frequent word is in many contexts) would get all their updates at
    once, computed at the same point, where word2vec takes them one after another;
    summed, they overshoot and training diverges. So a row touched ``n`` times moves by
    at most ``row_cap`` rows' worth: its summed gradient is scaled by
    ``min(1, row_cap / n)``. ``n`` is counted from a row-sparse gradient's entries; every
    row of a dense gradient counts as touched by all ``rows()`` rows.
    ``param_groups[i]["lr"]`` holds the rate of the last step (for the records); the
    step count is saved in the state dict, so a resumed run continues the schedule exactly.

    Args:
        params: parameters (dense or row-sparse gradients).
        lr: the starting per-row rate (word2vec: 0.05 CBOW, 0.025 skip-gram).
        total_steps: steps over which the rate falls.
        rows: returns the number of rows of the batch being stepped.
        min_ratio: the rate's floor as a share of ``lr`` (word2vec: 1e-4).
        row_cap: the most rows' worth of update a parameter row takes in one step;
            ``None``: no cap (plain summed gradients).

    Example::

        >>> w = nn.Parameter(torch.zeros(2))
        >>> opt = LinearDecaySGD([w], lr=0.1, total_steps=4, rows=lambda: 1)
        >>> for _ in range(4):
        ...     w.grad = torch.ones(2); opt.step()
        >>> round(-float(w.detach()[0]), 4)  # 0.1 + 0.075 + 0.05 + 0.025
        0.25
    """

    def __init__(self, params, lr: float, total_steps: int, rows: Callable[[], int], min_ratio: float = 1e-4,
                 row_cap: float | None = None) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if not 0 <= min_ratio <= 1:
            raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
        if row_cap is not None and not row_cap > 0:
            raise ValueError(f"row_cap must be positive or None, got {row_cap}")
        super().__init__(params, dict(lr=lr, start_lr=lr, total_steps=int(total_steps), min_ratio=float(min_ratio),
                                      row_cap=row_cap, steps_done=0))
        self.rows = rows

    def rate(self, group: dict) -> float:
        """The per-row rate of ``group``'s next step."""
        left = 1.0 - group["steps_done"] / group["total_steps"]
        return group["start_lr"] * max(left, group["min_ratio"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rows = self.rows()
        for group in self.param_groups:
            rate, cap = self.rate(group), group["row_cap"]
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if cap is None or rows <= cap:
                    p.add_(grad, alpha=-rate * rows)
                elif not grad.is_sparse:
                    p.add_(grad, alpha=-rate * cap)  # every row counts as touched by all rows: cap / rows of the sum
                else:
                    p.add_(capped_rows(grad, cap), alpha=-rate * rows)
            group["steps_done"] += 1
            group["lr"] = rate
        return loss


def capped_rows(grad: Tensor, cap: float) -> Tensor:
    """A row-sparse gradient whose row touched ``n`` times (entries with a non-zero value) is scaled
    by ``min(1, cap / n)``; the entries stay as they are, uncoalesced (adding them sums each row's).

    >>> g = torch.sparse_coo_tensor(torch.tensor([[0, 0, 0, 1]]), torch.ones(4, 2), (3, 2), check_invariants=True)
    >>> capped_rows(g, 2.0).to_dense()[:, 0].tolist()
    [2.0, 1.0, 0.0]
    """
    index, values = grad._indices()[0], grad._values()
    touched = values.ne(0).any(dim=1)  # [nnz]: padding entries (a tree's short paths) carry zeros
    counts = torch.bincount(index[touched], minlength=grad.size(0)).to(values.dtype)  # [N]
    scale = cap / counts.clamp(min=cap)  # [N]
    return torch.sparse_coo_tensor(grad._indices(), values * scale[index].unsqueeze(1), grad.shape,
                                   check_invariants=False)
