"""Fixtures of the headline tests: a folder laid out like the data directory, with 200 real Gigaword pairs."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from needs import GIGAWORD_HOW, need_files
from sohsm.cli.main import main


def _head(path: Path, lines: int) -> str:
    with open(path, encoding="utf-8") as handle:
        return "".join(line for _, line in zip(range(lines), handle))


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A data directory: 200 training pairs, 40 dev pairs, 30 test and DUC-2004 inputs (first lines of each)."""
    files = {"gigaword/train/train.article.txt": 200, "gigaword/train/train.title.txt": 200,
             "gigaword/train/valid.article.filter.txt": 40, "gigaword/train/valid.title.filter.txt": 40,
             "gigaword/Giga/input.txt": 30, "gigaword/Giga/task1_ref0.txt": 30,
             "duc2004/input.txt": 30, **{f"duc2004/task1_ref{i}.txt": 30 for i in range(4)}}
    source = need_files("Gigaword and DUC-2004", GIGAWORD_HOW, *files)
    root = tmp_path_factory.mktemp("s2s-data")
    for name, lines in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(_head(source / name, lines), encoding="utf-8")
    return root


@pytest.fixture(autouse=True, scope="module")
def private_env(tmp_path_factory):
    """Keep the user's cache out of every test."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SOHSM_CACHE", str(tmp_path_factory.mktemp("sohsm-cache")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def cli():
    """``cli(*argv)`` runs ``sohsm ARGV`` in-process and returns (exit code, stdout, stderr)."""
    def run(*argv) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exit_:  # argparse errors
                code = exit_.code if isinstance(exit_.code, int) else 2
        return code, out.getvalue(), err.getvalue()

    return run
