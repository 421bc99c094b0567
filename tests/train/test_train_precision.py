"""fp16 loss scaling of a training step (the LM runs under bf16 and fp16: tests/cli/test_cli_amp_compile.py)."""
from __future__ import annotations

import torch

from sohsm.heads import build_head
from sohsm.train.precision import Precision

D, N = 16, 50


def _head_and_optimizer():
    torch.manual_seed(0)
    head = build_head("self_organized", D, N, update_every=0)
    projection = torch.nn.Linear(D, D)
    params = list(head.parameters()) + list(projection.parameters())
    return head, projection, torch.optim.Adagrad(params, lr=0.1)


def test_fp16_loss_scaling_trains_and_skips_an_overflowing_step():
    """Scaled backward, unscaled gradients for clipping, a skipped step and a lower scale after an overflow."""
    head, projection, optimizer = _head_and_optimizer()
    precision = Precision("fp16", torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    hidden, target = torch.randn(64, D, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    losses = []
    for _ in range(20):
        with precision.autocast():
            out = head(projection(hidden), target)
        assert projection(hidden).dtype == torch.float32 and out.loss.dtype == torch.float32  # outside / accumulated
        optimizer.zero_grad()
        precision.backward(out.loss)
        precision.unscale_(optimizer)
        grad = projection.weight.grad.clone()
        assert precision.step(optimizer)
        losses.append(float(out.loss.detach()))
    assert losses[-1] < losses[0] - 0.5
    # the unscaled gradient is the true one: the float32 gradient of the same loss
    head32, projection32, _ = _head_and_optimizer()
    head32.load_state_dict(head.state_dict())
    projection32.load_state_dict(projection.state_dict())
    with precision.autocast():
        loss = head(projection(hidden), target).loss
    optimizer.zero_grad()
    precision.backward(loss)
    precision.unscale_(optimizer)
    head32(projection32(hidden), target).loss.backward()
    torch.testing.assert_close(projection.weight.grad, projection32.weight.grad, rtol=0.05, atol=2e-3)

    assert precision.step(optimizer)

    with precision.autocast():
        loss = head(projection(hidden), target).loss
    optimizer.zero_grad()
    precision.backward(loss)
    projection.weight.grad[0, 0] = float("inf")  # an overflow
    precision.unscale_(optimizer)
    scale, before = precision.scaler.get_scale(), projection.weight.detach().clone()
    assert not precision.step(optimizer) and precision.skips_overflow()
    assert precision.scaler.get_scale() == scale / 2 and torch.equal(projection.weight, before)

    state = precision.state_dict()
    again = Precision("fp16", torch.device("cpu"))
    again.load_state_dict(state)
    assert again.scaler.get_scale() == scale / 2 and grad.abs().sum() > 0
    assert Precision(None, torch.device("cpu")).state_dict() is None
    assert Precision("bf16", torch.device("cpu")).scaler is None  # bf16 has float32's range: no scaling
