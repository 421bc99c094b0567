"""Checks of a training command that need neither torch nor the data, made before either is loaded.

Importing torch takes seconds (more on a loaded machine), loading a corpus more: a mistake these checks can see (a
device the machine lacks, a run directory with no run to resume) is refused at once, in the words the loop itself
would use later (:func:`sohsm.train.builders.resolve_device`, :func:`sohsm.train.loop.resume_training` call the
same functions). What they cannot know cheaply passes, and the loop's own checks, with torch, still run.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

#: a run's settings, in its directory (:mod:`sohsm.train.checkpoint` names its files from here)
CONFIG_FILE = "config.json"

#: the build of torch's ``version.py``: ``cuda = '12.4'`` or ``cuda: Optional[str] = None``
_BUILT_WITH = re.compile(r"^(cuda|hip)\b[^=\n]*=\s*(\S+)", re.MULTILINE)


def check_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``run_dir`` as a path, refusing an empty name (which would train into the current folder)."""
    if not str(run_dir).strip():
        raise ValueError(f"the run directory must be named, got {str(run_dir)!r} (it would be the current folder)")
    return Path(run_dir)


def check_resumable(run_dir: str | os.PathLike[str]) -> Path:
    """``run_dir`` as a path, refusing one that holds no run's ``config.json`` (nothing to resume).

    Raises:
        ValueError: one line naming the directory.
    """
    path = check_run_dir(run_dir)
    if not (path / CONFIG_FILE).is_file():
        raise ValueError(f"{path} holds no training run to resume (no {CONFIG_FILE})")
    return path


def unavailable(name: str, kind: str) -> str:
    """The refusal of device ``name`` whose ``kind`` (``CUDA``, ``MPS``) this machine lacks."""
    return f"device {name!r} was requested but {kind} is not available on this machine"


def torch_build() -> dict[str, bool] | None:
    """``{"cuda": ..., "hip": ...}``: whether the installed torch was built for NVIDIA (CUDA) or AMD (ROCm) GPUs,
    read from its ``version.py`` without importing it; ``None`` where that file cannot be read."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        text = Path(spec.origin).with_name("version.py").read_text(encoding="utf-8")
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return None
    found = {key: value != "None" for key, value in _BUILT_WITH.findall(text)}
    return found if {"cuda", "hip"} <= found.keys() else None


def device_refusal(name: str) -> str | None:
    """Why device ``name`` cannot be used here, where that is certain without importing torch: a GPU device and a
    torch built without GPU support, or a machine without the device nodes its driver makes (Linux); MPS anywhere
    but macOS. ``None``: no reason found (torch, once imported, has the last word)."""
    kind = str(name).strip().partition(":")[0].lower()
    if kind == "mps":
        return None if sys.platform == "darwin" else unavailable(name, "MPS")
    if kind != "cuda":
        return None
    build = torch_build()
    if build is None:
        return None
    if not (build["cuda"] or build["hip"]):
        return unavailable(name, "CUDA")
    if sys.platform.startswith("linux"):
        nodes = ["/dev/kfd"] if build["hip"] else ["/dev/nvidiactl", "/dev/dxg"]  # dxg: a GPU under WSL
        if not any(os.path.exists(node) for node in nodes):
            return unavailable(name, "CUDA")
    return None


def check_device(name: str) -> None:
    """Raise ValueError with :func:`device_refusal`'s reason, if it has one."""
    refusal = device_refusal(name)
    if refusal is not None:
        raise ValueError(refusal)
