"""Simulated disk faults for tests: a full disk (ENOSPC) at a chosen file, a read-only folder (EACCES).

Both work as root too (where ``chmod`` does not stop a write): they patch the one place every atomic
write of the package opens its temporary file (:func:`sohsm.atomic_writes.atomic_output`).
"""
from __future__ import annotations

import errno
import fnmatch
import os
import tempfile
from pathlib import Path


class _FullFile:
    """A file that takes ``room`` bytes, then fails every write as a full disk does."""

    def __init__(self, handle, room: int) -> None:
        self._handle, self._room = handle, room

    def write(self, data):
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def fill_disk(monkeypatch, pattern: str = "*", room: int = 0) -> None:
    """Atomic writes of files whose name matches ``pattern`` fail with ENOSPC after ``room`` bytes."""
    real_mkstemp, real_fdopen, names = tempfile.mkstemp, os.fdopen, {}

    def mkstemp(*args, **kwargs):
        fd, tmp = real_mkstemp(*args, **kwargs)
        names[fd] = tmp
        return fd, tmp

    def fdopen(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        tmp = names.pop(fd, None)
        # the temporary file of target NAME is .NAME.<random><suffix>
        if tmp is not None and fnmatch.fnmatch(Path(tmp).name, f".{pattern}.*"):
            return _FullFile(handle, room)
        return handle

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "fdopen", fdopen)


def read_only(monkeypatch, folder: Path) -> None:
    """Creating a file in ``folder`` fails with EACCES, as in a folder without write permission."""
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # noqa: A002 - tempfile's name
        if dir is not None and Path(dir).resolve() == Path(folder).resolve():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, ".x.tmp"))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
