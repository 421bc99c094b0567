"""One trainer per run directory: an exclusive lock on ``RUN_DIR/.lock`` held while a session trains.

Two trainers on one run directory would append to the same ``metrics.jsonl``
and overwrite each other's checkpoints; the second is refused with a line that
names the first one's process id. The lock is ``fcntl.flock`` on an open file,
so the operating system releases it when the holder exits, even after
``kill -9``: a stale lock file never blocks a later run. The holder removes the
file when it lets go (a finished run directory holds no ``.lock``), while it still
holds the lock; a trainer that locked a file just removed sees that the name no longer
points to it and takes the lock again on the new file, so two trainers never hold
two different files. Where ``fcntl`` does not exist (Windows) the lock does nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # no such module on Windows; every use checks for None

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
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise ValueError(f"cannot lock run directory {self.run_dir}: {error.strerror or error}") from None
            if fcntl is None:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f" (process {holder})" if holder else ""
                raise ValueError(f"{self.run_dir} is in use by another trainer{who}; wait for it to stop, "
                                 "or train in another directory") from None
            if _names(fd, self.path):
                break
            os.close(fd)  # the previous holder removed the file as we opened it: lock the one there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file, still holding it, then let go (closing the descriptor releases the flock)."""
        if self._fd is not None:
            if fcntl is not None:
                try:
                    self.path.unlink(missing_ok=True)
                except OSError:  # a folder made read-only meanwhile: the lock goes with the descriptor all the same
                    pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _names(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
