"""DeviceAdagrad: torch's Adagrad step, sync-free, with the rate on the device and the fused steps' flags."""
from __future__ import annotations

import pytest
import torch

from sohsm.train.device_adagrad import DeviceAdagrad


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64, generator=g)),
            torch.nn.Parameter(torch.randn(4, dtype=torch.float64, generator=g))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_it_steps_as_torch_adagrad_does(seed):
    """float64, random gradients, two groups (one with weight decay), the rate as a number and as a tensor."""
    ours, theirs = _params(seed), _params(seed)
    reference = torch.optim.Adagrad([{"params": theirs[:1], "weight_decay": 0.1}, {"params": theirs[1:]}], lr=0.3,
                                    initial_accumulator_value=0.05)
    device = DeviceAdagrad([{"params": ours[:1], "weight_decay": 0.1}, {"params": ours[1:]}],
                           lr=torch.tensor(0.3, dtype=torch.float64), initial_accumulator_value=0.05)
    g = torch.Generator().manual_seed(seed + 10)
    for _ in range(6):
        for a, b in zip(ours, theirs):
            b.grad = torch.randn(b.shape, dtype=torch.float64, generator=g)
            a.grad = b.grad.clone()
        reference.step()
        device.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(device.state[a]["sum"], reference.state[b]["sum"], rtol=1e-12, atol=1e-12)
    assert float(device.state[ours[0]]["step"]) == 6.0


def test_grad_scale_clips_and_found_inf_skips_inside_the_step():
    ours, theirs = _params(3), _params(3)
    reference = torch.optim.Adagrad(theirs, lr=0.2)
    device = DeviceAdagrad(ours, lr=0.2)
    for a, b in zip(ours, theirs):
        b.grad = torch.full_like(b, 3.0)
        a.grad = b.grad.clone()
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    scale = torch.nn.utils.get_total_norm([a.grad for a in ours]) / 1.0
    device.grad_scale = scale
    reference.step()
    device.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    before = [a.detach().clone() for a in ours]
    sums = [device.state[a]["sum"].clone() for a in ours]
    device.found_inf = torch.tensor(1.0)
    for a in ours:
        a.grad = torch.full_like(a, float("nan"))
    device.step()  # a bad step: nothing moves, the step is not counted
    assert all(torch.equal(a, b) for a, b in zip(ours, before))
    assert all(torch.equal(device.state[a]["sum"], s) for a, s in zip(ours, sums))
    assert float(device.state[ours[0]]["step"]) == 1.0


def test_it_loads_torch_adagrad_checkpoints_and_refuses_lr_decay():
    params = _params(4)
    reference = torch.optim.Adagrad(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    reference.step()
    device = DeviceAdagrad(params, lr=0.1)
    device.load_state_dict(reference.state_dict())
    assert torch.equal(device.state[params[0]]["sum"], reference.state[params[0]]["sum"])
    with pytest.raises(ValueError, match="lr_decay"):
        DeviceAdagrad(params, lr=0.1, lr_decay=0.01)
