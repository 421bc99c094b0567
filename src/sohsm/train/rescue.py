"""A run directory that stops taking files mid-run: training goes on in memory, then the run is saved elsewhere.

A folder made read-only, or a mount that turned read-only, while a run trains would otherwise end the run at its
next checkpoint with all its training lost. Instead the session keeps the checkpoints it could not write
(:class:`UnsavedCheckpoints`), says so once, writes them there again as soon as the folder takes them, and at the
end saves the whole run (its files and those checkpoints) into a new folder beside it, or in the temporary folder
where that cannot be written either, and says where and how to go on from there. A full disk is not this case: it
ends the run with the checkpoints already there intact (the error names the file).
"""
from __future__ import annotations

import copy
import errno
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from sohsm.train.checkpoint import save_checkpoint
from sohsm.train.lock import LOCK_FILE

#: the errors of a folder that cannot be written (permissions, a read-only file system)
UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class UnsavedCheckpoints:
    """The checkpoints a session could not write into its run directory, by file name, kept in memory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.kept: dict[str, dict[str, Any]] = {}

    def save(self, name: str, contents: dict[str, Any]) -> None:
        """Write ``run_dir/name``, or keep ``contents`` (a copy: training goes on changing the weights) where the
        folder cannot be written; any other error (a full disk) is raised."""
        path = self.run_dir / name
        try:
            save_checkpoint(path, contents)
        except OSError as error:
            if error.errno not in UNWRITABLE:
                raise
            if not self.kept:
                warnings.warn(f"cannot write {path} ({error.strerror}): training goes on in memory, and the run is "
                              f"saved again in {self.run_dir} once it can be written, or beside it when the run "
                              "ends", stacklevel=3)
            self.kept[name] = copy.deepcopy(contents)
            return
        self.kept.pop(name, None)

    def rescue(self) -> Path | None:
        """Save the run elsewhere if checkpoints are still unsaved: its folder copied, then the checkpoints written
        there. The folder it went to, or ``None`` where nothing was left unsaved."""
        if not self.kept:
            return None
        for folder in _places(self.run_dir):
            try:
                _copy_run(self.run_dir, folder)
                for name, contents in self.kept.items():
                    save_checkpoint(folder / name, contents)
            except OSError:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            warnings.warn(f"{self.run_dir} could not be written: the run is saved in {folder} (go on with "
                          f"--run-dir {folder} --resume)", stacklevel=3)
            self.kept.clear()
            return folder
        raise OSError(errno.EACCES, f"{self.run_dir} could not be written, nor a folder beside it or in "
                                    f"{tempfile.gettempdir()}: the run's last steps are lost")


def _places(run_dir: Path) -> list[Path]:
    """New folders to save ``run_dir`` into: beside it, then in the temporary folder."""
    places = []
    for parent in (run_dir.parent, Path(tempfile.gettempdir())):
        stem = parent / f"{run_dir.name}-saved"
        places.append(next(p for p in (stem, *(Path(f"{stem}-{i}") for i in range(2, 1000))) if not p.exists()))
    return places


def _copy_run(run_dir: Path, folder: Path) -> None:
    """Copy the run directory's files (not its lock) into the new ``folder``."""
    folder.mkdir(parents=True)
    for path in run_dir.iterdir():
        if path.name == LOCK_FILE or not path.is_file():
            continue
        shutil.copy2(path, folder / path.name)
