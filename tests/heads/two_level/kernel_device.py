"""Where the tests run the Triton kernels: compiled on a CUDA device, else under Triton's interpreter on the CPU.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before Triton is first imported when no GPU is
present, so the kernels then run (slowly, in Python) on CPU tensors. With a GPU the interpreter is
off and the compiled kernels refuse CPU tensors: the tests move their Triton inputs to ``cuda`` and
compare the results, brought back to the CPU, with a *different* backend (the per-cluster kernel or
a dense float64 reference on the CPU), so a GPU run checks the kernels against something else.
"""
from __future__ import annotations

import os

import torch


def triton_device() -> torch.device | None:
    """``cpu`` under the interpreter, ``cuda`` with a GPU, ``None`` where the kernels cannot run at all."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    if torch.cuda.is_available():  # pragma: no cover - a machine with a GPU
        return torch.device("cuda")
    return None  # pragma: no cover - Triton imported before the interpreter was turned on
