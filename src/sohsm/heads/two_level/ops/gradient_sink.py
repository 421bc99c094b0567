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

#: ``(rows, columns, a, b)``: ``block[rows, columns] += a.t() @ b``; ``rows`` a slice or an index tensor
Piece = tuple[slice | Tensor, slice, Tensor, Tensor]


def write_pieces(block: Tensor, pieces: list[Piece], overwrite: bool) -> None:
    """``block[rows, columns] (+)= a.t() @ b`` for each piece; ``overwrite`` replaces the entries instead."""
    beta = 0.0 if overwrite else 1.0
    for rows, columns, a, b in pieces:
        if isinstance(rows, slice):
            block[rows, columns].addmm_(a.t(), b, beta=beta)
        else:
            target = block[:, columns]
            product = a.t() @ b
            (target.index_copy_ if overwrite else target.index_add_)(0, rows, product)


class GradientSink:
    """The destination of a weight gradient written in row blocks: ``weight.grad``, through a reused buffer.

    Args:
        weight: the leaf tensor (the head's parameter) whose ``.grad`` receives the gradient.
        buffer: the buffer handed over as ``weight.grad`` when it is ``None``, with its record of written rows.

    With differentiated dimensions (``div_value``) a block's pieces cover each row in its band's columns only.
    The other entries of the buffer stay zero: it starts zero, the head writes only inside bands, and every
    other writer of ``weight.grad`` keeps to them too (the tied embedding's gradient is masked to each row's
    band, clipping and ``zero_grad`` only scale); so a fresh buffer's written rows are whole after the write.
    """

    def __init__(self, weight: Tensor, buffer: ReusedGradient) -> None:
        self.weight = weight
        self.buffer = buffer

    def add_blocks(self, blocks: list[tuple[int, int, list[Piece]]]) -> None:
        """``weight.grad[start:stop][rows, columns] += a.t() @ b`` for each block ``(start, stop, pieces)`` and
        each of its pieces ``(rows, columns, a, b)`` (``a``: ``[m, n_rows]``, ``b``: ``[m, n_columns]``); other
        rows keep their value, zero where ``weight.grad`` was ``None``."""
        weight, buffer = self.weight, self.buffer
        grad = weight.grad
        fresh = grad is None
        regions = [(start, stop) for start, stop, _ in blocks]
        if grad is None:  # (fresh)
            grad = buffer.fresh(weight, keep=frozenset(regions))
        elif grad.is_sparse or grad.shape != weight.shape:
            raise RuntimeError(f"weight.grad must be a dense tensor shaped like the weight {tuple(weight.shape)}, "
                               f"got {'a sparse tensor' if grad.is_sparse else tuple(grad.shape)}")
        known = grad is buffer.tensor and buffer.known()
        for start, stop, pieces in blocks:  # a fresh buffer's blocks are overwritten, not added to
            write_pieces(grad[start:stop], pieces, overwrite=fresh)
        if fresh:
            weight.grad = grad
        if grad is buffer.tensor:
            buffer.written(regions, known)
