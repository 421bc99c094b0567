"""The checks of what a head is given (sizes, corpus counts, hidden states' precision), shared by every head."""
from __future__ import annotations

import torch
from torch import Tensor


class HeadInputError(ValueError, RuntimeError):
    """Input a head refuses (hidden states or targets of the wrong shape, dtype or range).

    Both the project's error for a bad value (``ValueError``, what sohsm has always raised) and torch's
    (``RuntimeError``, what :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` raises for the same input), so code
    written against either catches it.
    """


def check_size(name: str, value, low: int) -> int:
    """``value`` as an int of at least ``low``; refuses floats (``10.5``), strings (``'10'``) and bools.

    Python ints, NumPy integers and 0-dim integer tensors are accepted.

    Raises:
        ValueError: naming the argument, the rule and the value seen.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__") or (
            isinstance(value, Tensor) and (value.dim() or value.is_floating_point())):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r} ({type(value).__name__})")
    if int(value) < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {int(value)}")
    return int(value)


def check_counts(counts, n_classes: int) -> Tensor:
    """Training-corpus word counts as a float64 ``[N]`` tensor, refused when they cannot be counts.

    Every head that takes ``counts`` checks them here (:func:`sohsm.build_head` does so
    for every head, even those that ignore them), so one bad value is refused alike everywhere.

    Raises:
        ValueError: ``counts`` is not numeric, has not one entry per word, or holds a
            negative, NaN or infinite value (the message names the first such word).
    """
    try:
        values = torch.as_tensor(counts)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"counts must be a tensor of numbers, got {type(counts).__name__}") from None
    if values.dtype == torch.bool or values.is_complex():
        raise ValueError(f"counts must hold real numbers, got {values.dtype}")
    if values.numel() != n_classes:
        raise ValueError(f"counts must have one entry per word, shape [{n_classes}], got {tuple(values.shape)}")
    values = values.reshape(-1).to(torch.float64)
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        word = int(bad.nonzero()[0])
        raise ValueError(f"counts must be finite, got {float(values[word])} for word {word}")
    if bool((values < 0).any()):
        word = int((values < 0).nonzero()[0])
        raise ValueError(f"counts must be non-negative, got {float(values[word]):g} for word {word}")
    return values


def upcast(scores: Tensor) -> Tensor:
    """``scores`` in float32 if they are float16 or bfloat16 (as ``torch.autocast`` makes them), else unchanged.

    Heads normalise (log-softmax, log-sigmoid, log-sum-exp) in at least float32: in half
    precision a log-probability near -10 keeps only 2-3 significant digits.
    """
    return scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores


def autocast_on(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` (across the torch versions supported)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4 takes no argument and answers for CUDA
        return bool(torch.is_autocast_enabled()) if device_type == "cuda" else bool(torch.is_autocast_cpu_enabled())
