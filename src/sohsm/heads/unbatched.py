"""One unbatched hidden state, as torch's ``AdaptiveLogSoftmaxWithLoss`` takes it: a ``[d]`` input (and a 0-dim
target) answered without the row dimension. :class:`~sohsm.heads.Head` gives every subclass's per-row methods this
contract (``Head.__init_subclass__``)."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor

#: the methods that take hidden states and answer per row: each takes one unbatched hidden state as torch's
#: ``AdaptiveLogSoftmaxWithLoss`` does (:func:`unbatched`)
UNBATCHED_METHODS = ("forward", "score_parts", "log_prob", "topk", "predict", "sample")


def _squeeze_rows(value: Any) -> Any:
    """``value`` (a tensor, a named or plain tuple of them, ``None``) without its leading row dimension; a scalar
    (the loss) is kept as it is."""
    if isinstance(value, Tensor):
        return value.squeeze(0) if value.dim() else value
    if isinstance(value, tuple) and hasattr(value, "_replace"):  # a NamedTuple: HeadOutput, ClusterScores
        return type(value)(*(_squeeze_rows(v) for v in value))
    if isinstance(value, tuple):  # a plain tuple, or torch's (values, indices) of topk
        return type(value)([_squeeze_rows(v) for v in value])
    return value


def unbatched(method: Callable) -> Callable:
    """``method`` (a head's ``forward``, ``log_prob``, ...) taking one unbatched hidden state ``[d]`` as torch's
    ``AdaptiveLogSoftmaxWithLoss`` does: a batch of one inside, the row dimension dropped from what it returns (a
    0-dim output and prediction, ``[N]`` log-probabilities). A method that also takes targets does so only with a 0-dim
    target (torch refuses ``[d]`` with ``[1]``; a head reads it, as any ``[*]`` target, as one row, and returns
    ``[1]``). Batched input passes through untouched."""
    targets = "target" in inspect.signature(method).parameters

    @functools.wraps(method)
    def call(self, hidden, *args, **kwargs):
        if not (isinstance(hidden, Tensor) and hidden.dim() == 1):
            return method(self, hidden, *args, **kwargs)
        if targets:
            target = args[0] if args else kwargs.get("target")
            if not (isinstance(target, Tensor) and target.dim() == 0):
                return method(self, hidden, *args, **kwargs)
            args, kwargs = ((target.unsqueeze(0), *args[1:]), kwargs) if args else \
                (args, {**kwargs, "target": target.unsqueeze(0)})
        return _squeeze_rows(method(self, hidden.unsqueeze(0), *args, **kwargs))

    call.unbatched = True  # type: ignore[attr-defined]  # a function's own attribute (typeshed's wraps declares none)
    return call
