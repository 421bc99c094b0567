"""Mixed precision for a training step: ``torch.autocast`` around the forward, a GradScaler for fp16.

``amp="bf16"``: the model and head run under autocast in bfloat16 (matrix
products in bf16, the heads' log-softmax accumulated in float32); bfloat16 has
float32's range, so gradients need no scaling. ``amp="fp16"``: float16 products,
whose small range would flush small gradients to zero, so the loss is scaled up
before backward and the gradients scaled down before clipping
(:class:`torch.amp.GradScaler`); a step whose gradients overflow is skipped and
the scale lowered. Parameters and optimizer state stay float32 in both.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

#: ``amp`` settings: name -> autocast dtype
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: below this loss scale fp16 gradients are taken to be non-finite for good (the run diverged)
MIN_SCALE = 1.0


class Precision:
    """How a step computes: float32, or autocast in ``bf16`` / ``fp16`` (with loss scaling).

    Example::

        >>> import torch
        >>> layer = torch.nn.Linear(8, 100)
        >>> optimizer = torch.optim.Adagrad(layer.parameters(), lr=0.1)
        >>> precision = Precision("bf16", torch.device("cpu"))
        >>> with precision.autocast():
        ...     loss = torch.nn.functional.cross_entropy(layer(torch.randn(4, 8)).float(), torch.tensor([1, 2, 3, 4]))
        >>> precision.backward(loss)        # fp16: the loss scaled first
        >>> precision.unscale_(optimizer)   # fp16: the true gradients again, before clipping
        >>> precision.step(optimizer)       # fp16: False (skipped) when the gradients overflowed
        True

    Args:
        amp: ``None`` (float32), ``"bf16"`` or ``"fp16"``.
        device: where the step runs (its type picks the autocast backend).
    """

    def __init__(self, amp: str | None, device: torch.device) -> None:
        if amp is not None and amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)} or None, got {amp!r}")
        self.amp, self.device_type = amp, torch.device(device).type
        self.dtype = AMP_DTYPES[amp] if amp is not None else None
        self.scaler = torch.amp.GradScaler(self.device_type) if amp == "fp16" else None

    #: keep autocast's cache of low-precision weights within a forward; off for a step captured as a CUDA graph
    #: (as torch's ``make_graphed_callables`` requires: a cached cast must not outlive the capture)
    cache_enabled: bool = True

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward's context: autocast in :attr:`dtype`, or nothing for float32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=self.cache_enabled)

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``, the loss scaled first under fp16."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the gradients back to their true size (fp16), so clipping and checks see them as they are."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer step; under fp16 skipped if the gradients overflowed. Returns whether it ran.

        A skipped step calls no ``optimizer.step()``, so a head's post-step hook
        (re-clustering) does not run either.
        """
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before  # the scale drops exactly when the step was skipped

    def skips_overflow(self) -> bool:
        """Whether a non-finite gradient is an overflow to skip (fp16 with a usable scale), not a divergence."""
        return self.scaler is not None and self.scaler.get_scale() >= MIN_SCALE

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The GradScaler's state (``None`` without one)."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Take up a :meth:`state_dict` again."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def autocast_fails(amp: str, device: torch.device, run: Any) -> str | None:
    """Whether ``run()`` (a tiny forward, and its backward where it has one: training takes other kernels than
    inference on some CPUs) fails under autocast ``amp`` on ``device``; the error's text, or ``None``.

    Some kernels have no low-precision version on some devices (oneDNN has no
    float16 LSTM on the CPU); the run is refused before it starts, not at step 1.
    """
    try:
        with Precision(amp, device).autocast():
            output = run()
        while isinstance(output, (tuple, list)):  # a module's (output, state): the output
            output = output[0]
        if isinstance(output, torch.Tensor) and output.requires_grad:  # the training step's kernels too
            output.float().sum().backward()
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return None
