"""The CPU threads a run trains with: chosen from the cores free when it starts, unless the user says.

Torch takes every core by default. Beside other jobs its threads wait on each other: the language model's first
command ran at 773-1,051 tokens/s with torch's default two threads on a shared 2-core machine and at 6,306-6,782
with one (same load, back to back). A run on the CPU therefore takes the cores that are free at its start (the
cores it may use less the system's one-minute load, at least one; with several processes, each its share), unless
``--threads`` (``threads``) or ``OMP_NUM_THREADS`` names a number. The start line says which and why.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def busy_cores() -> int:
    """The cores other work keeps busy: the one-minute load average, rounded (0 where the system gives none)."""
    try:
        return round(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def choose_threads(requested: int | None, processes: int = 1) -> tuple[int, str]:
    """The threads of one process of a run and why: ``requested``, else ``OMP_NUM_THREADS``, else this process's
    share (one of ``processes``) of the cores free now.

    >>> choose_threads(3)
    (3, '--threads')
    """
    if requested is not None:
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores, busy = usable_cores(), busy_cores()
    free = max(1, cores - min(busy, cores))
    return max(1, free // max(1, processes)), f"{cores} cores, {min(busy, cores)} busy; --threads N to choose"


@contextmanager
def cpu_threads(requested: int | None, device: torch.device, processes: int = 1) -> Iterator[str | None]:
    """Train with the chosen threads (:func:`choose_threads`) on the CPU, then give the process its own back;
    yields what the start line says of them (``None`` on a GPU, where they do not run the steps)."""
    if torch.device(device).type != "cpu":
        yield None
        return
    threads, why = choose_threads(requested, processes)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield f"{threads} CPU thread{'s' if threads > 1 else ''} ({why})"
    finally:
        torch.set_num_threads(before)
