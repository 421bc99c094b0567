"""Where an op that writes the word vectors' gradient itself puts it: ``weight.grad``, block by block.

Autograd would hand back an ``N x d`` gradient every step and add it into ``weight.grad``.
A step of the per-cluster op touches only the blocks of the clusters its batch holds, so it
writes those blocks straight into ``weight.grad``, a buffer that lives across steps
(:class:`~sohsm.heads.reused_gradient.ReusedGradient`) and whose other rows are known to be zero.
The head builds the sink (it owns the parameter and the buffer); the op only calls
:meth:`GradientSink.add_blocks`.
"""
from __future__ import annotations

from torch import Tensor

from sohsm.heads.reused_gradient import ReusedGradient


class GradientSink:
    """The destination of a weight gradient written in row blocks: ``weight.grad``, through a reused buffer.

    Args:
        weight: the leaf tensor (the head's parameter) whose ``.grad`` receives the gradient.
        buffer: the buffer handed over as ``weight.grad`` when it is ``None``, with its record of written rows.
        band_of_slot: differentiated dimensions (``div_value``): ``[N]`` band of each row of ``weight``;
            a row's gradient is kept only in the columns of its band. ``None``: no bands.
        band_columns: ``[d]`` band of each column (with ``band_of_slot``).
    """

    def __init__(self, weight: Tensor, buffer: ReusedGradient, band_of_slot: Tensor | None = None,
                 band_columns: Tensor | None = None) -> None:
        self.weight = weight
        self.buffer = buffer
        self.band_of_slot = band_of_slot
        self.band_columns = band_columns

    def add_blocks(self, blocks: list[tuple[int, int, Tensor, Tensor]]) -> None:
        """``weight.grad[start:stop] += a.t() @ b`` for each ``(start, stop, a, b)`` (``a``: ``[m, stop - start]``,
        ``b``: ``[m, d]``); other rows keep their value, zero where ``weight.grad`` was ``None``."""
        weight, buffer = self.weight, self.buffer
        grad = weight.grad
        fresh = grad is None
        regions = [(start, stop) for start, stop, _, _ in blocks]
        if fresh:
            grad = buffer.fresh(weight, keep=frozenset(regions))
        elif grad.is_sparse or grad.shape != weight.shape:
            raise RuntimeError(f"weight.grad must be a dense tensor shaped like the weight {tuple(weight.shape)}, "
                               f"got {'a sparse tensor' if grad.is_sparse else tuple(grad.shape)}")
        beta = 0.0 if fresh else 1.0  # a fresh buffer's blocks are overwritten, not added to
        known = grad is buffer.tensor and buffer.known()
        for start, stop, a, b in blocks:
            rows = grad[start:stop]
            rows.addmm_(a.t(), b, beta=beta)
            if self.band_of_slot is not None:  # keep each row inside its band
                rows.mul_(self.band_of_slot[start:stop, None] == self.band_columns)
        if fresh:
            weight.grad = grad
        if grad is buffer.tensor:
            buffer.written(regions, known)
