"""A full disk or a read-only folder during `sohsm lm train` and `sohsm tree build`: one line naming the file
and the system's reason, a non-zero exit, and the checkpoints already there intact."""
from __future__ import annotations

import os

from disk import fill_disk, read_only

STEP = 160  # tokens per step of the small model (batch 16 x BPTT 10)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_full_disk_at_the_first_checkpoint(tmp_path, ptb_slice, small, cli, monkeypatch):
    run_dir = tmp_path / "run"
    fill_disk(monkeypatch, "*.pt", room=1000)
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", run_dir, *small,
                       "--max-tokens", 2 * STEP)
    line = _one_line(err)
    assert code == 1 and line.startswith("sohsm lm: error: ") and line.endswith(": No space left on device")
    assert str(run_dir / "best.pt") in line or str(run_dir / "last.pt") in line
    assert not [p for p in run_dir.iterdir() if p.name.endswith((".tmp", ".part"))]


def test_a_full_disk_mid_run_keeps_the_checkpoints_there(tmp_path, ptb_slice, small, cli, monkeypatch):
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", run_dir, *small,
                       "--max-tokens", 2 * STEP, "--eval-every", 1)
    assert code == 0, err
    before = {name: (run_dir / name).read_bytes() for name in ("last.pt", "best.pt")}
    fill_disk(monkeypatch, "*.pt", room=1000)
    code, _, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 4 * STEP, "--quiet")
    assert code == 1 and _one_line(err).endswith(".pt: No space left on device"), err
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    monkeypatch.undo()  # room again: the run resumes from the checkpoint it kept
    code, _, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 4 * STEP, "--quiet")
    assert code == 0, err


def test_tree_build_into_a_full_disk_or_a_read_only_folder(tmp_path, ptb_slice, small, cli, monkeypatch):
    run_dir, output = tmp_path / "tree-random", tmp_path / "trees" / "bootstrap.pt"
    assert cli("lm", "train", "--corpus", ptb_slice, "--head", "tree_random", "--run-dir", run_dir, *small,
               "--max-tokens", 2 * STEP)[0] == 0
    output.parent.mkdir()
    with monkeypatch.context() as patch:
        fill_disk(patch, "bootstrap.pt", room=100)
        code, _, err = cli("tree", "build", run_dir, "--output", output, "--max-tokens", 2000)
    assert code != 0 and _one_line(err) == f"sohsm tree: error: {output}: {os.strerror(28)}"
    with monkeypatch.context() as patch:
        read_only(patch, output.parent)
        code, _, err = cli("tree", "build", run_dir, "--output", output, "--max-tokens", 2000)
    assert code != 0 and _one_line(err) == f"sohsm tree: error: {output}: {os.strerror(13)}"
    assert list(output.parent.iterdir()) == []


def _checkpoints_refused(monkeypatch, folder) -> None:
    """Checkpoints (``*.pt``) cannot be created in ``folder`` (EACCES), as in a folder made read-only mid-run."""
    import errno
    import tempfile
    from pathlib import Path

    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, prefix=None, **kwargs):  # noqa: A002 - tempfile's name
        if dir is not None and Path(dir).resolve() == Path(folder).resolve() and ".pt." in (prefix or ""):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, f"{prefix}tmp"))
        return real_mkstemp(*args, dir=dir, prefix=prefix, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_a_run_directory_that_stops_taking_checkpoints_keeps_the_training(tmp_path, ptb_slice, small, cli,
                                                                          monkeypatch):
    """Training goes on in memory, one line says so, the run is saved beside its folder at the end (and says
    where), no lock is left, and the saved run resumes."""
    import warnings

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _checkpoints_refused(patch, run_dir)
        code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", run_dir, *small,
                             "--max-tokens", 4 * STEP, "--eval-every", 2)
    assert code == 0, err
    said = [str(w.message) for w in caught if "could not be written" in str(w.message)
            or "cannot write" in str(w.message)]
    saved = tmp_path / "run-saved"
    assert len(said) == 2 and said[0].startswith(f"cannot write {run_dir}") and "training goes on in memory" in said[0]
    assert said[1] == f"{run_dir} could not be written: the run is saved in {saved} (go on with --run-dir {saved} " \
                      "--resume)"
    assert not list(run_dir.glob("*.pt")) and not (run_dir / ".lock").exists()
    assert {p.name for p in saved.iterdir()} >= {"last.pt", "best.pt", "config.json", "metrics.jsonl"}
    assert f"{saved}" in out  # the summary names where the run is
    code, out, err = cli("lm", "train", "--run-dir", saved, "--resume", "--max-tokens", 6 * STEP, "--quiet")
    assert code == 0 and "step 6" in out, err
