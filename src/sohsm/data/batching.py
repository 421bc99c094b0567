"""Cutting a token stream into columns and truncated-BPTT windows.

:func:`batchify` lays the stream out as ``B`` columns of contiguous text (the
remainder that does not fill a row is dropped); :func:`bptt_batches` walks down
the rows in windows of ``bptt`` steps, the target being the input shifted by
one row. Each column is its own running text, so a recurrent state carried from
one window to the next continues the same text::

    ids = a b c d e f g h i j k l m n o p q r s t u v w x y z     (26 tokens)

    data = batchify(ids, 4)           bptt_batches(data, bptt=2)
    row   column 0 1 2 3              window  input rows  target rows
     0           a g m s                0       0-1         1-2
     1           b h n t                1       2-3         3-4
     2           c i o u                2       4           5     (shorter)
     3           d j p v
     4           e k q w              window 0: input  [[a g m s], [b h n t]]
     5           f l r x                        target [[b h n t], [c i o u]]
    (y z dropped: 26 = 6 * 4 + 2)

Window ``k`` starts at row ``start + k * bptt``, so training resumes mid-epoch
by passing the row where it stopped as ``start``.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from sohsm.fields import FieldError


def batchify(ids: Tensor, batch_size: int, device: torch.device | str | None = None) -> Tensor:
    """Lay a 1-D token stream out as ``batch_size`` columns of contiguous text.

    Args:
        ids: 1-D LongTensor of token ids.
        batch_size: number of columns ``B``.
        device: where the result goes (default: where ``ids`` is).

    Returns:
        ``[T, B]`` with ``T = len(ids) // B``; column ``j`` is ``ids[j*T:(j+1)*T]``.
        The last ``len(ids) % B`` tokens are dropped.

    Raises:
        ValueError: ``ids`` is not 1-D, ``batch_size`` < 1, or fewer than ``batch_size`` tokens.

    Example::

        >>> batchify(torch.arange(10), 3)
        tensor([[0, 3, 6],
                [1, 4, 7],
                [2, 5, 8]])
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    steps = ids.numel() // batch_size
    if steps == 0:
        raise FieldError.on("batch_size", f"{batch_size} is larger than the number of tokens ({ids.numel()})")
    data = ids[: steps * batch_size].view(batch_size, steps).t().contiguous()
    return data if device is None else data.to(device)


def _check_window(data: Tensor, bptt: int, start: int) -> None:
    if data.dim() != 2:
        raise ValueError(f"data must be [T, B] from batchify, got shape {tuple(data.shape)}")
    if isinstance(bptt, bool) or int(bptt) != bptt or bptt < 1:
        raise ValueError(f"bptt must be a positive integer, got {bptt!r}")
    if isinstance(start, bool) or int(start) != start or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")


def num_bptt_batches(data: Tensor, bptt: int, start: int = 0, drop_last: bool = False) -> int:
    """How many windows :func:`bptt_batches` yields with these arguments."""
    _check_window(data, bptt, start)
    rows = max(0, data.size(0) - 1 - start)  # rows that have a next row to predict
    return rows // bptt if drop_last else -(-rows // bptt)


def bptt_batches(data: Tensor, bptt: int, start: int = 0,
                 drop_last: bool = False) -> Iterator[tuple[Tensor, Tensor]]:
    """Truncated-BPTT windows over ``data``: ``(input, target)``, each ``[bptt, B]``.

    ``target[t] == input[t + 1]`` within a window, and the target of the last row
    is the first input row of the next window. Both are views of ``data``.

    Args:
        data: ``[T, B]`` from :func:`batchify`.
        bptt: rows per window.
        start: row of the first window (resume mid-epoch); windows start at
            ``start, start + bptt, ...``.
        drop_last: skip a final window shorter than ``bptt`` (otherwise it is
            yielded with fewer rows).

    Raises:
        ValueError: ``data`` is not 2-D, or ``bptt``/``start`` are not valid.

    Example::

        >>> data = batchify(torch.arange(10), 2)  # rows [0, 5], [1, 6], ..., [4, 9]
        >>> [(len(inp), tgt[0].tolist()) for inp, tgt in bptt_batches(data, 3)]
        [(3, [1, 6]), (1, [4, 9])]
    """
    _check_window(data, bptt, start)  # here, not on the first next()
    return _windows(data, int(bptt), int(start), drop_last)


def _windows(data: Tensor, bptt: int, start: int, drop_last: bool) -> Iterator[tuple[Tensor, Tensor]]:
    last = data.size(0) - 1  # the last row is only ever a target
    for i in range(start, last, bptt):
        length = min(bptt, last - i)
        if drop_last and length < bptt:
            return
        yield data[i:i + length], data[i + 1:i + 1 + length]
