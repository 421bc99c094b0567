"""The one table of the in-cluster softmax's backends: what each is, where it runs, where it is the default.

Every backend computes ``log P(w_i | h_i, C(w_i))`` per row from explicit tensors, with one signature::

    kernel(hidden [B, d], weight [N, d], row_cluster [B], row_position [B], layout, width, sink) -> [B]

``weight`` holds the word vectors grouped by cluster as ``layout``
(:class:`~sohsm.heads.two_level.ops.layout.ClusterLayout`) says; ``row_cluster`` is each row's target
cluster and ``row_position`` the target's position inside that cluster's block; ``width`` is the static
number of columns a sync-free backend scores (the largest cluster the head allows); ``sink``
(:class:`~sohsm.heads.two_level.ops.gradient_sink.GradientSink`) is where a backend that writes the
weight's gradient itself puts it (``None`` for the others: autograd returns it). No backend sees the head.

A head's ``backend`` option names one of :data:`BACKENDS`, or ``"auto"``: the backend whose
``default_devices`` names the device type (else the one marked for any device); where it cannot run
there (its ``problem`` says why), one warning, and its ``fallback`` runs instead. While
``torch.compile`` traces, ``"auto"`` never takes a backend that reads its batch back (its host-side grouping
would break the graph, and ``fullgraph=True`` refuses a break): where the device's default does, the first
sync-free backend that runs there is taken instead (on the CPU the grouped kernel in plain torch), so a head
with its defaults traces whole.
"""
from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sohsm.heads.two_level.ops import grouped, per_cluster

#: a ``devices`` / ``default_devices`` entry meaning every device type
ANY_DEVICE = "*"


@dataclass(frozen=True)
class BackendInfo:
    """One backend of the in-cluster softmax: its op and where it runs.

    Attributes:
        name: the value of a head's ``backend`` option.
        kernel: the op, with the signature of the module docstring.
        devices: device types it runs on (:data:`ANY_DEVICE`: all).
        default_devices: device types where ``"auto"`` takes it (one backend per type; :data:`ANY_DEVICE`: where
            no other is the default).
        sync_free: static shapes, nothing read back to the host: traces whole under ``torch.compile``.
        writes_gradient: writes the weight's gradient into the sink itself (autograd returns it otherwise).
        description: how a warning names it.
        refusal: why an explicit ``backend=name`` cannot run on a device (the ``ValueError``'s text), or ``None``.
        problem: why ``"auto"`` cannot take it on a device with products in a dtype (``None``: it can).
        fallback: the backend ``"auto"`` takes where ``problem`` says this one cannot run.
    """

    name: str
    kernel: Callable
    devices: tuple[str, ...]
    default_devices: tuple[str, ...]
    sync_free: bool
    writes_gradient: bool
    description: str
    refusal: Callable[[torch.device], str | None] | None = None
    problem: Callable[[torch.device, torch.dtype], str | None] | None = None
    fallback: str | None = None


# -- Triton: installed, and able to compile its kernels for this device and dtype ------------------------------------

@functools.cache
def triton_available() -> bool:
    """Whether Triton can be imported (it is needed by the ``"triton"`` backend)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


#: why the Triton kernels cannot run, per (device, compute dtype) an eager ``"auto"`` call has tried; ``None``: they run
_triton_problems: dict[tuple[str, torch.dtype], str | None] = {}


def triton_problem(device: torch.device, compute: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run on ``device`` with products in ``compute`` (``None`` when they can).

    Asked once per device and dtype: Triton missing, a dtype its float32 accumulators cannot hold
    (float64), or a tiny forward and backward that fails to compile or launch (no C compiler for
    Triton's launcher; bf16 ``tl.dot`` on a GPU before sm_80).
    """
    key = (str(device), compute)
    if key not in _triton_problems:
        _triton_problems[key] = _find_triton_problem(device, compute)
    return _triton_problems[key]


def _find_triton_problem(device: torch.device, compute: torch.dtype) -> str | None:
    if not triton_available():
        return "Triton is not installed (pip install triton)"
    if compute not in (torch.float32, torch.float16, torch.bfloat16):
        return f"the Triton kernels accumulate in float32 and do not compute in {compute}"
    try:
        run_triton_once(device, compute)
    except Exception as error:  # noqa: BLE001 - whatever stops the kernels is the reason to fall back
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        return f"the Triton kernels failed to run ({type(error).__name__}: {first_line})"
    return None


def run_triton_once(device: torch.device, compute: torch.dtype) -> None:
    """Every Triton kernel once, as a step launches them, on the smallest problem (two rows, one cluster of two
    words): raises what a step would (a kernel that does not compile, a launcher without a C compiler)."""
    from sohsm.heads.two_level.ops import triton_kernels

    with torch.inference_mode(False), torch.enable_grad():
        hidden = torch.ones(2, 16, device=device, requires_grad=True)
        weight = torch.ones(2, 16, device=device, requires_grad=True)
        zeros = torch.zeros(2, dtype=torch.long, device=device)
        offsets, sizes = torch.tensor([0, 2], device=device), torch.tensor([2], device=device)
        out = triton_kernels.in_cluster_log_prob_triton(hidden, weight, zeros, zeros, offsets, sizes, 2, 64, compute)
        out.sum().backward()


def _triton_problem_for_auto(device: torch.device, compute: torch.dtype) -> str | None:
    if torch.compiler.is_compiling():  # no probe while tracing: what an eager call found out, else the kernels
        return _triton_problems.get((str(device), compute))
    return triton_problem(device, compute)


def _triton_refusal(device: torch.device) -> str | None:
    if not triton_available():
        return "backend='triton' needs Triton (pip install triton); backend='auto' runs without it"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"backend='triton' runs on CUDA devices, not on {device.type} (TRITON_INTERPRET=1 runs the kernels "
                "on the CPU, slowly, for tests); backend='auto' picks the per-cluster kernel there")
    return None


# -- the table ---------------------------------------------------------------------------------------------------------

#: every backend, by name, in the order the ``backend`` option lists them
BACKENDS: dict[str, BackendInfo] = {}


def register_backend(info: BackendInfo) -> BackendInfo:
    """Add ``info`` to :data:`BACKENDS`; a name taken (or ``"auto"``) or a second default for a device is refused."""
    if info.name == "auto" or info.name in BACKENDS:
        raise ValueError(f"a backend named {info.name!r} exists already")
    for other in BACKENDS.values():
        shared = set(info.default_devices) & set(other.default_devices)
        if shared:
            raise ValueError(f"{info.name!r} and {other.name!r} would both be the default on {sorted(shared)}")
    BACKENDS[info.name] = info
    return info


register_backend(BackendInfo(
    "per_cluster", per_cluster.in_cluster_log_prob, devices=(ANY_DEVICE,), default_devices=(ANY_DEVICE,),
    sync_free=False, writes_gradient=True, description="the per-cluster kernel (one host read a step)"))
register_backend(BackendInfo(
    "grouped_torch", grouped.grouped_torch_log_prob, devices=(ANY_DEVICE,), default_devices=(),
    sync_free=True, writes_gradient=False, description="the sync-free path in plain torch"))
register_backend(BackendInfo(
    "triton", grouped.triton_log_prob, devices=("cuda",), default_devices=("cuda",),
    sync_free=True, writes_gradient=False, description="the Triton kernels",
    refusal=_triton_refusal, problem=_triton_problem_for_auto, fallback="per_cluster"))


def backend_options() -> tuple[str, ...]:
    """The values of a two-level head's ``backend`` option: ``"auto"`` and every registered backend."""
    return ("auto", *BACKENDS)


def check_backend(value: str) -> str:
    """``value`` if it names a backend or ``"auto"``, else a ``ValueError`` that lists them."""
    if value not in backend_options():
        raise ValueError(f"backend must be one of {', '.join(backend_options())}, got {value!r}")
    return value


def select_backend(option: str, device: torch.device, compute: torch.dtype, sync_free: bool = True) -> BackendInfo:
    """The backend that runs for a head's ``backend`` option on ``device`` with products in ``compute``.

    ``"auto"`` reads the table (see the module docstring); ``sync_free=False`` (a head that can only
    use a backend that reads its batch back) makes it skip sync-free backends, silently.

    Raises:
        ValueError: an explicit backend that cannot run on ``device`` (its ``refusal``).
    """
    if option != "auto":
        info = BACKENDS[check_backend(option)]
        reason = info.refusal(device) if info.refusal is not None else _device_refusal(info, device)
        if reason is not None:
            raise ValueError(reason)
        return info
    info = _default_backend(device.type)
    while True:
        if info.sync_free and not sync_free:
            info = _fallback(info)
            continue
        reason = info.problem(device, compute) if info.problem is not None else None
        if reason is None:
            break
        _warn_once(device, reason, _fallback(info))
        info = _fallback(info)
    if sync_free and not info.sync_free and torch.compiler.is_compiling():
        return _traceable_backend(device, compute) or info
    return info


def _traceable_backend(device: torch.device, compute: torch.dtype) -> BackendInfo | None:
    """The first registered sync-free backend that runs on ``device`` with products in ``compute``: what
    ``"auto"`` takes while ``torch.compile`` traces (see the module docstring)."""
    for info in BACKENDS.values():
        if not info.sync_free or _device_refusal(info, device) is not None:
            continue
        if info.problem is None or info.problem(device, compute) is None:
            return info
    return None


def _device_refusal(info: BackendInfo, device: torch.device) -> str | None:
    if ANY_DEVICE in info.devices or device.type in info.devices:
        return None
    return f"backend={info.name!r} runs on {', '.join(info.devices)} devices, not on {device.type}"


def _fallback(info: BackendInfo) -> BackendInfo:
    if info.fallback is None:
        raise LookupError(f"backend {info.name!r} cannot run here and names no fallback")
    return BACKENDS[info.fallback]


def _default_backend(device_type: str) -> BackendInfo:
    for devices in ((device_type,), (ANY_DEVICE,)):
        for info in BACKENDS.values():
            if devices[0] in info.default_devices:
                return info
    raise LookupError(f"no backend is the default on {device_type}")


_warned: set[tuple[str, str]] = set()


def _warn_once(device: torch.device, reason: str, fallback: BackendInfo) -> None:
    """One warning per device type and reason saying why ``"auto"`` did not take its default."""
    key = (device.type, reason)
    if key not in _warned and not torch.compiler.is_compiling():
        _warned.add(key)
        warnings.warn(f"backend='auto' on {device.type}: {reason}; {fallback.description} runs instead",
                      RuntimeWarning, stacklevel=5)
