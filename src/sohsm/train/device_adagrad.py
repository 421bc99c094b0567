"""Adagrad whose step reads nothing back to the host, for a step captured as a CUDA graph.

torch's foreach Adagrad step (what runs without a fused step: ``--no-fused``, or a torch whose Adagrad has no fused
CUDA step; 2.13's has one, which a captured step takes instead) takes the learning rate as a Python number and
each step count from the host: captured once, a graph would replay the rate of its capture (no warm-up, no
schedule) forever. :class:`DeviceAdagrad` is torch's Adagrad (the same state, so checkpoints
load either way) with a foreach step over device tensors: the rate may be a 0-dim tensor on the device
(``group["lr"]``, written in place by the loop), and like torch's fused steps it takes ``grad_scale`` (the
gradients are divided by it: clipping inside the step) and ``found_inf`` (a step whose flag is set changes
no weight and no sum) as attributes, set by the caller before ``step()``.
"""
from __future__ import annotations

import torch
from torch import Tensor


class DeviceAdagrad(torch.optim.Adagrad):
    """``torch.optim.Adagrad`` with a sync-free foreach step (see the module docstring); ``lr_decay`` must be 0.

    Example::

        >>> import torch
        >>> p = torch.nn.Parameter(torch.ones(3))
        >>> opt = DeviceAdagrad([p], lr=torch.tensor(0.1))
        >>> p.grad = torch.ones(3)
        >>> opt.step()
        >>> [round(v, 4) for v in p.tolist()]
        [0.9, 0.9, 0.9]
    """

    def __init__(self, params, lr: float | Tensor = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10) -> None:
        if lr_decay != 0:
            raise ValueError(f"DeviceAdagrad takes no lr_decay (the loop's schedule sets the rate), got {lr_decay}")
        super().__init__(params, lr=lr, lr_decay=0.0, weight_decay=weight_decay,
                         initial_accumulator_value=initial_accumulator_value, eps=eps, foreach=True)
        self._step_supports_amp_scaling = True  # it takes grad_scale and found_inf, as the fused steps do
        for param, state in self.state.items():
            state["step"] = state["step"].to(param.device)

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        for param, state in self.state.items():  # a checkpoint of torch's step keeps its counts on the CPU
            if "step" in state:
                state["step"] = state["step"].to(param.device, torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise ValueError("DeviceAdagrad takes dense gradients only (use torch.optim.Adagrad for sparse ones)")
            grads = [p.grad for p in params]
            sums = [self.state[p]["sum"] for p in params]
            steps = [self.state[p]["step"] for p in params]
            if grad_scale is not None:
                grads = torch._foreach_div(grads, grad_scale)
            if group["maximize"]:
                grads = torch._foreach_neg(grads)
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            if found_inf is not None:  # a bad step: zero updates leave every weight and sum as it was
                bad = found_inf != 0
                grads = [g.masked_fill(bad, 0.0) for g in grads]
                torch._foreach_add_(steps, (~bad).to(steps[0].dtype))
            else:
                torch._foreach_add_(steps, 1)
            torch._foreach_addcmul_(sums, grads, grads, value=1)
            std = torch._foreach_sqrt(sums)
            torch._foreach_add_(std, group["eps"])
            lr = group["lr"]
            numerator = torch._foreach_mul(grads, -lr if isinstance(lr, Tensor) else -float(lr))
            torch._foreach_addcdiv_(params, numerator, std)
        return loss
