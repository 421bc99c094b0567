"""DifferentiatedSoftmax against a full softmax whose weight matrix is block diagonal (float64)."""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import DifferentiatedSoftmax, build_head
from sohsm.heads.dsoftmax import default_dims

D, N, B = 12, 50, 30
CUTOFFS, DIMS = [6, 20], [6, 4, 2]


def _counts() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    return (700.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()[torch.randperm(N, generator=g)]


def _head(seed: int = 0, bias: bool = False) -> DifferentiatedSoftmax:
    torch.manual_seed(seed)
    head = DifferentiatedSoftmax(D, N, cutoffs=CUTOFFS, dims=DIMS, bias=bias, counts=_counts()).double()
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    return head


def _batch(seed: int, batch: int = B):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, D, generator=g, dtype=torch.float64), torch.randint(0, N, (batch,), generator=g)


def _block_diagonal(head: DifferentiatedSoftmax) -> torch.Tensor:
    """``[N, d]`` word-order weight matrix, zero outside each band's block (float64 leaf)."""
    full = torch.zeros(N, D, dtype=torch.float64)
    counts = _counts()
    order = torch.sort(counts, descending=True, stable=True).indices  # rank -> word, written independently
    row, col = 0, 0
    for weight, dim in zip(head.weights, DIMS):
        n = weight.size(0)
        full[order[row : row + n], col : col + dim] = weight.detach()
        row, col = row + n, col + dim
    return full.requires_grad_(True)


@pytest.mark.parametrize("bias", [False, True])
def test_loss_log_prob_and_gradients_match_block_diagonal_full_softmax(bias):
    head = _head(1, bias)
    hidden, target = _batch(1)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()

    weight = _block_diagonal(head)
    order = torch.sort(_counts(), descending=True, stable=True).indices
    word_bias = torch.zeros(N, dtype=torch.float64)
    if bias:
        word_bias[order] = head.bias.detach()
    h = hidden.detach().clone().requires_grad_(True)
    log_prob = torch.log_softmax(h @ weight.t() + word_bias, dim=1)
    expected = log_prob.gather(1, target[:, None]).squeeze(1)
    (-expected.mean()).backward()
    torch.testing.assert_close(out.output, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-12)
    row, col = 0, 0
    for w, dim in zip(head.weights, DIMS):  # each block's gradient is the reference's block
        n = w.size(0)
        torch.testing.assert_close(w.grad, weight.grad[order[row : row + n], col : col + dim], rtol=0, atol=1e-12)
        row, col = row + n, col + dim
    torch.testing.assert_close(head.log_prob(hidden), log_prob.detach(), rtol=0, atol=1e-12)
    assert head.log_prob(hidden).logsumexp(1).abs().max() < 1e-12


@pytest.mark.parametrize("k", [1, 5])
def test_topk_and_predict_equal_log_prob_topk(k):
    head = _head(2)
    hidden, _ = _batch(2, batch=40)
    ref_values, ref_indices = head.log_prob(hidden).topk(k, dim=1)
    values, indices = head.topk(hidden, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-12)
    assert torch.equal(indices, ref_indices)
    if k == 1:
        assert torch.equal(head.predict(hidden), ref_indices[:, 0])


def test_defaults_and_build_head():
    assert default_dims(512, 3) == [256, 128, 128] and default_dims(7, 2) == [3, 4] and sum(default_dims(10, 4)) == 10
    head = build_head("dsoftmax", 64, 1000, counts=torch.arange(1000, 0, -1))  # draws nothing at random: no seed option
    assert head.cutoffs == [45, 227] and head.dims == [32, 16, 16] and head.objective == "nll"
    custom = build_head("dsoftmax", D, N, cutoffs=CUTOFFS, dims=DIMS, bias=True)
    assert custom.band_sizes == [6, 14, 30] and custom.bias is not None


@pytest.mark.parametrize("dims", [[6, 4], [6, 4, 3], [12, 0, 0], [6.5, 3.5, 2]])
def test_bad_dims_name_the_value(dims):
    with pytest.raises(ValueError, match=r"dims must be 3 positive integers .* in_features=12, got"):
        DifferentiatedSoftmax(D, N, cutoffs=CUTOFFS, dims=dims)


def test_bad_cutoffs():
    with pytest.raises(ValueError, match=r"cutoffs must be increasing integers in \[1, 49\]"):
        DifferentiatedSoftmax(D, N, cutoffs=[20, 6])
