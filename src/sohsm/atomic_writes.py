"""Atomic writes: a file of the package appears whole or not at all, and a failed write names its file.

Run directories (checkpoints, metrics), vocabularies, tokenizers, cache entries and exported vectors are
all written through :func:`atomic_output`: a temporary file next to the target, flushed and then moved
over it, so a full disk or a killed process never leaves a half-written file where a reader expects a whole one.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

#: the suffix of the temporary file an atomic write goes through (``.<name>.<random>.tmp`` next to the target)
ATOMIC_SUFFIX = ".tmp"


class WriteError(OSError):
    """A file could not be written: the file meant (never a temporary one) and the system's reason.

    ``str(error)`` is one line, ``runs/x/last.pt: No space left on device``; ``errno``,
    ``strerror`` and ``filename`` are those of the :class:`OSError` it stands for.
    """

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def os_error_in(error: BaseException) -> OSError | None:
    """The :class:`OSError` with an ``errno`` behind ``error``: itself, or one it was raised from or during.

    torch's writer turns a failed ``write`` (a full disk) into a ``RuntimeError`` whose context is
    the ``OSError``; this finds it.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux)."""
    with suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(target: str | os.PathLike[str], mode: str = "wb", make_parents: bool = True, *,
                  durable: bool = True) -> Iterator[IO]:
    """Open a temporary file next to ``target`` that replaces it (``os.replace``) only on success.

    Every atomic write of the package goes through here. ``target`` is either left as it was or
    replaced whole, never half-written: on an exception the temporary file is deleted; a process
    killed mid-write leaves it behind (:func:`sohsm.train.checkpoint.remove_orphans` deletes those
    of a run directory). The file gets the mode a plain ``open`` would give it (``0o666`` less the
    umask), not the ``0o600`` of a temporary file, so a group that may read the folder may read
    what is written there.

    Args:
        target: the file to write.
        mode: ``"wb"`` or ``"w"`` (utf-8 text).
        make_parents: create ``target``'s folder if it is missing (else a missing folder is an error).
        durable: flush the data to the disk (``fsync``) before the replace; ``False`` for files
            whose loss in a power cut costs only time (cache stamps).

    Raises:
        WriteError: the folder or the file could not be written (a full disk, a read-only
            folder), naming ``target`` and the system's reason, also where the writer (torch's,
            for instance) wrapped the system's error in another.
    """
    target = Path(target)
    try:
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=ATOMIC_SUFFIX, dir=target.parent)
    except OSError as error:
        raise WriteError(error.errno, error.strerror, str(target)) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8") as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as error:
        with suppress(OSError):
            os.unlink(tmp)
        cause = os_error_in(error) if isinstance(error, (OSError, RuntimeError)) else None
        if cause is not None and not isinstance(error, WriteError):
            raise WriteError(cause.errno, cause.strerror, str(target)) from None
        raise


def write_atomic(target: str | os.PathLike[str], write) -> None:
    """Call ``write(binary_file)`` on a temporary file next to ``target``, then replace ``target`` with it
    (:func:`atomic_output`, durably); the folder must exist (a run directory's files are written here).

    Raises:
        WriteError: the write failed (a full disk, a read-only folder); it names ``target``, not the
            temporary file, and the system's reason, also where torch's writer turned that reason
            into a ``RuntimeError``.
    """
    with atomic_output(target, "wb", make_parents=False) as handle:
        write(handle)


def write_atomic_text(target: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write ``text`` (utf-8) to ``target`` atomically (:func:`atomic_output`)."""
    with atomic_output(target, "w", durable=durable) as handle:
        handle.write(text)
