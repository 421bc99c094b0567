"""Atomic writes: a full disk or a read-only folder is one error naming the file meant and the system's
reason, the file already there survives whole, no temporary file is left; written files follow the umask."""
from __future__ import annotations

import errno
import os
import stat

import pytest
import torch

from disk import fill_disk, read_only
from sohsm.atomic_writes import WriteError, atomic_output, write_atomic_text
from sohsm.clustering.trees import random_tree, save_tree
from sohsm.train.checkpoint import save_checkpoint, write_json


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "notes.txt"
    write_atomic_text(target, "old\n")
    fill_disk(monkeypatch, "notes.txt", room=2)
    with pytest.raises(WriteError) as info:
        write_atomic_text(target, "new text\n")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert str(info.value) == f"{target}: {os.strerror(errno.ENOSPC)}"
    assert target.read_text() == "old\n" and _files(tmp_path) == ["notes.txt"]


@pytest.mark.parametrize("room", [0, 100, 5000])
def test_a_full_disk_under_torch_save_is_the_system_error_not_torchs(tmp_path, monkeypatch, room):
    """torch's writer turns the failed write into a RuntimeError ('enforce fail at inline_container.cc');
    the error raised names the checkpoint and 'No space left on device'."""
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"format": "x", "w": torch.ones(3)})
    before = path.read_bytes()
    fill_disk(monkeypatch, "last.pt", room=room)
    with pytest.raises(OSError) as info:
        save_checkpoint(path, {"format": "x", "w": torch.zeros(10_000)})
    assert isinstance(info.value, WriteError) and info.value.errno == errno.ENOSPC
    assert str(info.value) == f"{path}: {os.strerror(errno.ENOSPC)}"
    assert path.read_bytes() == before and _files(tmp_path) == ["last.pt"]


def test_a_full_disk_while_writing_a_tree_file(tmp_path, monkeypatch):
    fill_disk(monkeypatch, "tree.pt", room=64)
    with pytest.raises(WriteError, match=r"tree\.pt: No space left on device$"):
        save_tree(tmp_path / "tree.pt", random_tree(50))
    assert _files(tmp_path) == []


def test_a_read_only_folder_names_the_file_meant_not_the_temporary_one(tmp_path, monkeypatch):
    read_only(monkeypatch, tmp_path)
    with pytest.raises(WriteError) as info:
        write_json(tmp_path / "config.json", {"a": 1})
    assert info.value.errno == errno.EACCES and info.value.filename == str(tmp_path / "config.json")
    assert ".tmp" not in str(info.value) and _files(tmp_path) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into a folder without write permission: the monkeypatched test above "
                           "covers it there")
def test_a_real_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(WriteError, match=r"ro/out\.txt: Permission denied$"):
            write_atomic_text(folder / "out.txt", "x")
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_atomic_text(tmp_path / "a.txt", "x")
        save_checkpoint(tmp_path / "b.pt", {"w": torch.ones(1)})
        with atomic_output(tmp_path / "c.bin") as handle:
            handle.write(b"x")
    finally:
        os.umask(old)
    for name in ("a.txt", "b.pt", "c.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
