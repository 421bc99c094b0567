"""batchify lays out contiguous columns; BPTT windows have targets = inputs shifted by one."""
from __future__ import annotations

import pytest
import torch

from sohsm.data import batchify, bptt_batches, num_bptt_batches


def test_batchify_columns_are_contiguous_text():
    data = batchify(torch.arange(26), 4)
    assert data.shape == (6, 4)
    assert data[:, 1].tolist() == list(range(6, 12))
    assert data.is_contiguous()
    with pytest.raises(ValueError, match="batch_size 30 is larger"):
        batchify(torch.arange(26), 30)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        batchify(torch.arange(26), 0)


def test_windows_shapes_and_shift():
    data = batchify(torch.arange(1000), 7)  # [142, 7]
    windows = list(bptt_batches(data, 35))
    assert len(windows) == num_bptt_batches(data, 35) == 5  # 141 rows to predict
    for inp, tgt in windows[:-1]:
        assert inp.shape == tgt.shape == (35, 7)
    assert windows[-1][0].shape == (141 - 4 * 35, 7)
    for inp, tgt in windows:
        assert torch.equal(tgt, inp + 1)  # columns are consecutive ids: next token = id + 1
    # consecutive windows tile the rows: last target row = next window's first input row
    assert torch.equal(windows[0][1][-1], windows[1][0][0])


def test_resume_from_a_position():
    data = batchify(torch.arange(1000), 7)
    full = list(bptt_batches(data, 35))
    resumed = list(bptt_batches(data, 35, start=70))
    assert len(resumed) == num_bptt_batches(data, 35, start=70) == 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[2:], resumed))


def test_drop_last():
    data = batchify(torch.arange(1000), 7)
    windows = list(bptt_batches(data, 35, drop_last=True))
    assert len(windows) == num_bptt_batches(data, 35, drop_last=True) == 4
    assert all(inp.shape[0] == 35 for inp, _ in windows)


def test_bad_window_arguments():
    data = batchify(torch.arange(100), 4)
    with pytest.raises(ValueError, match="bptt must be a positive integer, got 0"):
        bptt_batches(data, 0)  # raised at the call, not at the first window
    with pytest.raises(ValueError, match="start must be a non-negative integer, got -1"):
        list(bptt_batches(data, 5, start=-1))
    with pytest.raises(ValueError, match=r"data must be \[T, B\]"):
        list(bptt_batches(torch.arange(10), 5))
    assert list(bptt_batches(data, 5, start=1000)) == []
