"""FullSoftmax: the reference head is itself checked against torch and a dense float64 computation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sohsm.heads import FullSoftmax

D, N, B = 8, 50, 24


def _inputs(seed: int = 0, batch: int = B, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, D, generator=g, dtype=dtype)
    target = torch.randint(0, N, (batch,), generator=g)
    return hidden, target


@pytest.mark.parametrize("bias", [False, True])
def test_matches_linear_plus_cross_entropy(bias):
    torch.manual_seed(1)
    head = FullSoftmax(D, N, bias=bias)
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    hidden, target = _inputs(1)
    hidden.requires_grad_(True)
    out = head(hidden, target)

    h_ref = hidden.detach().clone().requires_grad_(True)
    w_ref = head.weight.detach().clone().requires_grad_(True)
    b_ref = head.bias.detach().clone().requires_grad_(True) if bias else None
    nll = F.cross_entropy(F.linear(h_ref, w_ref, b_ref), target, reduction="none")
    torch.testing.assert_close(out.output, -nll, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.loss, nll.mean(), rtol=0, atol=1e-6)

    out.loss.backward()
    nll.mean().backward()
    torch.testing.assert_close(hidden.grad, h_ref.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, w_ref.grad, rtol=0, atol=1e-6)
    if bias:
        torch.testing.assert_close(head.bias.grad, b_ref.grad, rtol=0, atol=1e-6)


def test_loss_and_gradients_match_dense_float64_reference():
    torch.manual_seed(2)
    head = FullSoftmax(D, N).double()
    hidden, target = _inputs(2, dtype=torch.float64)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()

    h_ref = hidden.detach().clone().requires_grad_(True)
    w_ref = head.weight.detach().clone().requires_grad_(True)
    logits = h_ref @ w_ref.t()
    log_probs = logits - logits.exp().sum(1, keepdim=True).log()  # naive, no stabilisation needed here
    output_ref = log_probs[torch.arange(B), target]
    (-output_ref.mean()).backward()

    assert out.output.dtype == torch.float64
    torch.testing.assert_close(out.output, output_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h_ref.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, w_ref.grad, rtol=0, atol=1e-12)


def test_log_prob_is_normalised_and_output_is_its_gather():
    torch.manual_seed(3)
    head = FullSoftmax(D, N)
    hidden, target = _inputs(3)
    hidden = hidden * 4  # peaked rows too
    log_prob = head.log_prob(hidden)
    assert log_prob.shape == (B, N)
    assert log_prob.logsumexp(1).abs().max() < 1e-5
    output = head(hidden, target).output
    torch.testing.assert_close(output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-5)
    assert head.score_parts(hidden, target) is None  # no clusters


@pytest.mark.parametrize("k", [1, 5])
def test_topk_and_predict_equal_log_prob_topk(k):
    torch.manual_seed(4)
    head = FullSoftmax(D, N)
    hidden, _ = _inputs(4)
    log_prob = head.log_prob(hidden)
    ref_values, ref_indices = log_prob.topk(k, dim=1)
    values, indices = head.topk(hidden, k)
    assert values.shape == indices.shape == (B, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_prob.gather(1, indices), values, rtol=0, atol=1e-5)
    assert torch.equal(indices, ref_indices)  # random gaussian inputs: no ties
    if k == 1:
        assert torch.equal(head.predict(hidden), ref_indices[:, 0])


def test_star_hidden_is_flattened():
    torch.manual_seed(5)
    head = FullSoftmax(D, N)
    hidden, target = _inputs(5, batch=12)
    out_flat = head(hidden, target)
    out_3d = head(hidden.reshape(3, 4, D), target.reshape(3, 4))
    assert out_3d.output.shape == (12,)
    torch.testing.assert_close(out_3d.output, out_flat.output, rtol=0, atol=0)
    torch.testing.assert_close(head.log_prob(hidden.reshape(2, 6, D)), head.log_prob(hidden), rtol=0, atol=0)


def test_batch_loss_is_mean_of_single_row_losses():
    torch.manual_seed(6)
    head = FullSoftmax(D, N)
    hidden, target = _inputs(6, batch=10)
    out = head(hidden, target)
    singles = torch.stack([head(hidden[i : i + 1], target[i : i + 1]).loss for i in range(10)])
    torch.testing.assert_close(out.loss * 10, singles.sum(), rtol=0, atol=1e-5)
    torch.testing.assert_close(-out.output, singles, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "hidden_shape, target, match",
    [
        ((4, D), torch.tensor([0, 1, N, 2]), "target values"),
        ((4, D), torch.tensor([0, -1, 3, 2]), "target values"),
        ((4, D + 1), torch.tensor([0, 1, 2, 3]), "hidden must have shape"),
        ((4, D), torch.tensor([0, 1, 2]), "same number of rows"),
        ((4, D), torch.tensor([0, 1, 2, 3], dtype=torch.int32), "long"),
        ((4, D), torch.tensor([0.0, 1.0, 2.0, 3.0]), "long"),
    ],
)
def test_bad_forward_input_raises_value_error(hidden_shape, target, match):
    head = FullSoftmax(D, N)
    with pytest.raises(ValueError, match=match):
        head(torch.randn(*hidden_shape), target)


def test_bad_hidden_in_log_prob_and_topk():
    head = FullSoftmax(D, N)
    with pytest.raises(ValueError, match="hidden must have shape"):
        head.log_prob(torch.randn(3, D - 1))
    with pytest.raises(ValueError, match="hidden must have shape"):
        head.topk(torch.randn(3, D + 2), 2)
    with pytest.raises(ValueError, match="floating-point"):
        head.log_prob(torch.ones(3, D, dtype=torch.long))


@pytest.mark.parametrize("k", [0, -1, N + 1, 2.0, True])
def test_bad_k_raises_value_error(k):
    head = FullSoftmax(D, N)
    with pytest.raises(ValueError, match="k must be"):
        head.topk(torch.randn(3, D), k)


def test_k_equal_to_vocabulary_is_allowed():
    head = FullSoftmax(D, N)
    values, indices = head.topk(torch.randn(3, D), N)
    assert torch.equal(indices.sort(1).values, torch.arange(N).expand(3, N))


@pytest.mark.parametrize("args", [(0, N), (-3, N), (D, 1), (D, 0)])
def test_bad_constructor_args(args):
    with pytest.raises(ValueError, match="in_features|n_classes"):
        FullSoftmax(*args)


def test_attach_is_harmless():
    head = FullSoftmax(D, N)
    assert head.attach(torch.optim.SGD(head.parameters(), lr=0.1)) is None
