"""The self-organized head's statistics ``q`` in a compact form: the top ``M`` clusters of each word.

The dense ``q`` is ``[N, C]`` floats (``C`` learned clusters): 3.7 GiB at a million
words. Kept compact, a word's row is its ``M`` highest entries (cluster ids ``index``,
int32 ``[N, M]``, and ``values``, float ``[N, M]``) and one value ``rest`` (``[N]``)
standing for each of the ``C - M`` clusters not kept: ``N (2M + 1)`` 4-byte numbers.

A batch is folded in as the dense update would fold it (Eq. 9, the same smoothing
weights), applied to the row the compact form stands for: every cluster not kept has
the value ``rest``. After the update a word keeps the ``M`` highest of its ``C``
updated values, and ``rest`` becomes the highest updated value of the clusters not
kept (the row's ``(M + 1)``-th value): a cluster dropped is taken to be as good as the
best one dropped, so that one whose samples beat the weakest kept cluster comes back
in about when it would enter the dense row's top ``M``. Their mean, which keeps each row's sum
equal to the dense row's, was
measured worse: a dropped cluster restarts from the row's average at every batch, and a
frequent word (smoothing near 1) climbs back in far later than in the dense ``q``, so the
clusters froze and the dev perplexity fell behind the dense head's, where the maximum kept up
with it (docs/results/lm.md, "q in a compact form", with the figures and the commands).
With ``M == C`` nothing is dropped and the result is the dense ``q``'s, bit for bit.
The ``M`` are chosen once per batch: a word's tokens in one batch are all folded into its
row first (as the dense update folds them), so a word seen once in a batch gets the rule
applied token by token, and a word seen several times loses no cluster between its tokens.

Algorithm 1 reads the compact ``q`` a block of rows at a time (:meth:`CompactRows.rows`).
"""
from __future__ import annotations

import torch
from torch import Tensor


class CompactRows:
    """A read-only view of compact statistics as dense rows: what Algorithm 1 needs of ``q``.

    Args:
        index: ``[N, M]`` cluster ids kept per word.
        values: ``[N, M]`` their values.
        rest: ``[N]`` the value of every cluster not kept.
        n_clusters: ``C``, the number of columns of a dense row.

    Shape:
        ``rows(words)``: ``[len(words), C]``.
    """

    def __init__(self, index: Tensor, values: Tensor, rest: Tensor, n_clusters: int) -> None:
        self.index, self.values, self.rest = index, values, rest
        self.shape = (index.shape[0], int(n_clusters))

    def rows(self, words: Tensor) -> Tensor:
        """Dense rows ``[len(words), C]`` of the given words: ``rest`` with the kept values scattered in."""
        words = words.to(self.index.device)
        return dense_rows(self.index[words], self.values[words], self.rest[words], self.shape[1])

    def take(self, words: Tensor) -> CompactRows:
        """The same view restricted to the given words (compact copies of their rows)."""
        words = words.to(self.index.device)
        return CompactRows(self.index[words], self.values[words], self.rest[words], self.shape[1])

    def dense(self) -> Tensor:
        """Every row at once (``[N, C]``: as large as the dense ``q``)."""
        return self.rows(torch.arange(self.shape[0], device=self.index.device))


def dense_rows(index: Tensor, values: Tensor, rest: Tensor, n_clusters: int) -> Tensor:
    """``[U, C]`` rows holding ``rest`` everywhere but at ``index``, where they hold ``values``."""
    rows = rest[:, None].expand(rest.shape[0], n_clusters).clone()
    return rows.scatter_(1, index.long(), values)


@torch.no_grad()
def fold(index: Tensor, values: Tensor, rest: Tensor, words: Tensor, decay: Tensor, slot: Tensor,
         contributions: Tensor) -> None:
    """Fold one batch into the compact statistics in place.

    Args:
        index: ``[N, M]`` int32 kept cluster ids (updated).
        values: ``[N, M]`` kept values (updated).
        rest: ``[N]`` value of the clusters not kept (updated).
        words: ``[U]`` distinct words of the batch.
        decay: ``[U]`` what each word's old row keeps (``prod_t lambda_t``).
        slot: ``[n]`` each token's position in ``words``, tokens in the order they are summed.
        contributions: ``[n, C]`` each token's weighted sample, same order as ``slot``.
    """
    n_clusters, kept = contributions.shape[1], index.shape[1]
    dtype = values.dtype
    rows = dense_rows(index[words], values[words], rest[words], n_clusters)
    rows *= decay.to(dtype)[:, None]
    rows.index_add_(0, slot, contributions.to(dtype))
    if kept == n_clusters:  # nothing dropped: the dense update, stored by cluster id
        values[words] = rows
        index[words] = torch.arange(n_clusters, dtype=index.dtype, device=index.device).expand(words.numel(), -1)
        return
    top, top_index = torch.topk(rows, kept, dim=1)
    # the best of the clusters not kept: the (M + 1)-th value of the row
    rest[words] = rows.scatter_(1, top_index, float("-inf")).amax(dim=1)
    values[words] = top
    index[words] = top_index.to(index.dtype)
