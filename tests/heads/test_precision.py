"""Every head under mixed precision: ``torch.autocast`` (bf16 on the CPU) against float32."""
from __future__ import annotations

import pytest
import torch

from sohsm.clustering.trees import random_tree, save_tree
from sohsm.heads import build_head, head_names

D, N, B = 16, 60, 48

#: loss tolerance under bf16 autocast: bf16 keeps 8 bits of mantissa (relative error ~4e-3 per
#: product), and the log-softmax is accumulated in float32, so the mean NLL moves by a few 1e-2 at most
BF16_LOSS_TOL = 5e-2


def make_head(name: str, tmp_path) -> torch.nn.Module:
    """Head ``name`` at this file's sizes (a tree file for ``tree_file``)."""
    options = {"adaptive": {"div_value": 2.0}, "self_organized": {"update_every": 0}}.get(name, {})
    if name == "tree_file":
        path = tmp_path / "tree.pt"
        save_tree(path, random_tree(N, torch.Generator().manual_seed(0)))
        options = {"path": str(path)}
    torch.manual_seed(0)
    return build_head(name, D, N, counts=torch.arange(N, 0, -1) * 5, **options)


@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("training", [True, False])
def test_bf16_autocast_loss_close_to_float32_and_gradients_finite(name, training, tmp_path):
    torch.manual_seed(1)
    hidden, target = torch.randn(B, D), torch.randint(0, N, (B,))
    losses, grads = [], []
    for amp in (False, True):
        head = make_head(name, tmp_path).train(training)
        h = hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            output, loss = head(h, target)
        assert output.dtype == torch.float32 and loss.dtype == torch.float32  # accumulated in float32
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append([h.grad] + [p.grad for p in head.parameters() if p.grad is not None])
    assert abs(losses[1] - losses[0]) <= BF16_LOSS_TOL, (name, losses)
    assert len(grads[1]) == len(grads[0])
    for g32, g16 in zip(*grads):
        g16 = g16.to_dense() if g16.is_sparse else g16
        g32 = g32.to_dense() if g32.is_sparse else g32
        assert torch.isfinite(g16).all()
        assert g16.dtype == g32.dtype
        assert (g16 - g32).abs().max() <= 0.05 * g32.abs().max() + 1e-3, name


@pytest.mark.parametrize("name", head_names())
def test_bf16_hidden_states_are_accepted(name, tmp_path):
    """A model run under autocast hands the head bf16 hidden states; the gradient goes back in bf16."""
    head = make_head(name, tmp_path)
    hidden = torch.randn(B, D).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, loss = head(hidden, torch.randint(0, N, (B,)))
    loss.backward()
    assert torch.isfinite(loss) and hidden.grad.dtype == torch.bfloat16 and torch.isfinite(hidden.grad).all()


@pytest.mark.parametrize("name", head_names())
def test_evaluation_under_bf16_autocast_is_normalised_in_float32(name, tmp_path):
    head = make_head(name, tmp_path).eval()
    hidden = torch.randn(5, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs = head.log_prob(hidden)
        values, indices = head.topk(hidden, 3)
        predicted = head.predict(hidden)
    assert log_probs.dtype == torch.float32
    assert torch.allclose(log_probs.logsumexp(1), torch.zeros(5), atol=1e-4)
    assert torch.isfinite(values).all() and indices.shape == (5, 3) and predicted.shape == (5,)
