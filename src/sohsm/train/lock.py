"""One trainer per run directory: an exclusive lock on ``RUN_DIR/.lock`` held while a session trains.

Two trainers on one run directory would append to the same ``metrics.jsonl``
and overwrite each other's checkpoints; the second is refused with a line that
names the first one's process id. The lock is ``fcntl.flock`` on an open file,
so the operating system releases it when the holder exits, even after
``kill -9``: a stale lock file never blocks a later run. The file itself stays
(removing it would let two processes lock two different files). Where
``fcntl`` does not exist (Windows) the lock does nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_FILE = ".lock"


class RunLock:
    """Context manager: hold the lock of ``run_dir`` (which must exist) or raise ValueError.

    Example::

        with RunLock(run_dir):
            ...  # the only trainer writing to run_dir

    Raises:
        ValueError: another process holds the lock (its pid is in the message),
            or the lock file cannot be opened.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise ValueError(f"cannot lock run directory {self.run_dir}: {error.strerror or error}") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f" (process {holder})" if holder else ""
                raise ValueError(f"{self.run_dir} is in use by another trainer{who}; wait for it to stop, "
                                 "or train in another directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
