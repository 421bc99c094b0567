"""Every head's constructor as torch's modules have theirs: ``device=`` and ``dtype=``, and no option read by position.

torch's modules take ``device`` and ``dtype`` (the factory kwargs) and make their tensors there. A head's
constructor builds its structures on the host (trees, clusters, word orders from ``counts``), so
:func:`factory_init` builds the head as it always has and then moves it: to ``device``, and its floating-point
tensors made in the default dtype to ``dtype`` (parameters, and buffers such as a noise distribution; a statistic
a head keeps in float64 on purpose stays float64). A head whose constructor takes ``device`` itself
(:class:`~sohsm.heads.AdaptiveSoftmax`, torch's own module) is left to it. The heads whose layout is derived from
the values of their buffers (the two-level and tree heads) cannot be made on the meta device, and say so.

Options are read by keyword only: ``FullSoftmax(100, 20, [5, 10, 15])``, torch's adaptive softmax's call, would
otherwise read the cutoffs as ``bias``. A call with more positional arguments than a head takes is refused in one
line (a ``TypeError``, as Python refuses a call it cannot bind).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

#: how deep the constructors of one head's classes are nested (a subclass's ``__init__`` calls its base's)
_DEPTH = "_factory_depth"


def _positional(signature: inspect.Signature) -> list[str]:
    return [p.name for p in list(signature.parameters.values())[1:]
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def place(module: torch.nn.Module, device=None, dtype=None) -> None:
    """Move a built head to ``device``, and its floating-point tensors in the default dtype to ``dtype``."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        default = torch.get_default_dtype()
        if dtype != default:
            module._apply(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype == default else t)
    if device is None:
        return
    device = torch.device(device)
    try:
        module.to(device)
    except (NotImplementedError, RuntimeError) as error:
        if device.type != "meta":
            raise
        raise ValueError(f"{type(module).__name__} cannot be made on the meta device: it derives its layout (clusters, "
                         "tree paths) from the values of its buffers, which meta tensors do not hold; build it on a "
                         "real device") from error


def factory_init(cls: type, init: Callable) -> Callable:
    """``init`` (a head class's ``__init__``) taking ``device=`` and ``dtype=``, refusing extra positional arguments."""
    signature = inspect.signature(init)
    positional = _positional(signature)
    takes_device = "device" in signature.parameters
    parameters = list(signature.parameters.values())
    if not takes_device:
        extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in ("device", "dtype")]
        at = next((i for i, p in enumerate(parameters) if p.kind == inspect.Parameter.VAR_KEYWORD), len(parameters))
        parameters[at:at] = extra

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f"{cls.__name__} takes {len(positional)} arguments by position "
                            f"({', '.join(positional)}) and its options by keyword, got {len(args)}; torch's "
                            "AdaptiveLogSoftmaxWithLoss(in_features, n_classes, cutoffs, ...) is sohsm.AdaptiveSoftmax")
        if takes_device:
            init(self, *args, **kwargs)
            return
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        depth = self.__dict__.get(_DEPTH, 0)
        self.__dict__[_DEPTH] = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            if depth:
                self.__dict__[_DEPTH] = depth
            else:
                del self.__dict__[_DEPTH]
        if not depth:
            place(self, device, dtype)

    __init__.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # what inspect reads
    return __init__
