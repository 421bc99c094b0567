"""Fixtures of the command-line tests: small slices of real PTB text and Gigaword pairs, a private cache.

The corpora are read from the data directory (``$SOHSM_DATA``, a relative value
taken relative to the repository root, else ``~/.cache/sohsm``); the slice is
written into a temporary folder, never into the repository. Without PTB there,
the tests that need it are skipped with the reason (failed where
``$SOHSM_REQUIRE_DATA`` is set, as in CI).
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from needs import GIGAWORD_HOW, data_dir as _data_dir, need_corpus, need_files
from sohsm.cli.main import main

#: a model small enough for a few hundred steps in seconds
SMALL_MODEL = ["--emb-size", "32", "--hidden-size", "32", "--batch-size", "16", "--bptt", "10", "--quiet"]


def _head(path: Path, lines: int) -> str:
    with open(path, encoding="utf-8") as handle:
        return "".join(line for _, line in zip(range(lines), handle))


@pytest.fixture(scope="session")
def ptb_slice(tmp_path_factory) -> Path:
    """A folder with train.txt (first 3000 lines of PTB train), valid.txt and test.txt (300 lines each)."""
    ptb = need_corpus("ptb") / "ptb"
    folder = tmp_path_factory.mktemp("ptb-slice")
    for name, source, lines in (("train.txt", "ptb.train.txt", 3000), ("valid.txt", "ptb.valid.txt", 300),
                                ("test.txt", "ptb.test.txt", 300)):
        (folder / name).write_text(_head(ptb / source, lines), encoding="utf-8")
    return folder


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


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sohsm-cache")


@pytest.fixture(autouse=True, scope="module")
def private_env(session_cache):
    """Keep the user's cache and environment out of every test (module-wide, for module fixtures too)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SOHSM_CACHE", str(session_cache))
    patch.setenv("SOHSM_DATA", str(_data_dir()))
    yield
    patch.undo()




@pytest.fixture(scope="session")
def small() -> list[str]:
    """Options of a small, quiet model: emb/hidden 32, batch 16, BPTT 10."""
    return list(SMALL_MODEL)


@pytest.fixture(scope="session")
def cli():
    """``cli(*argv)`` runs ``sohsm ARGV`` in-process and returns (exit code, stdout, stderr)."""
    return run


def run(*argv: str) -> tuple[int, str, str]:
    """``sohsm ARGV`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, out.getvalue(), err.getvalue()
