"""What the benchmarks say about the machine they ran on (shared by the scripts in this folder)."""
from __future__ import annotations

import os
import platform

import torch


def cpu_name() -> str:
    """The CPU's model name (from ``/proc/cpuinfo`` where there is one)."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(threads: bool = True) -> str:
    """``CPU, N threads (or cores), torch X, Python Y`` for a results table's header."""
    count = f"{torch.get_num_threads()} thread(s)" if threads else f"{os.cpu_count()} cores"
    return f"{cpu_name()}, {count}, torch {torch.__version__}, Python {platform.python_version()}"


def write_page(path, lines: list[str]) -> None:
    """Write a results page (markdown ``lines``) to ``path``, making its folder, and say where it went."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def command_line(argv: list[str]) -> str:
    """``argv`` as a page's *Command* line says it: without ``--output``'s value, a folder of the machine that ran it
    (the page is where it was written; the default place is the one the docs link)."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--output":
            skip = True
        elif not arg.startswith("--output="):
            shown.append(arg)
    return " ".join(shown)
