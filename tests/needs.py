"""What a test needs from the machine it runs on: data in the data directory, kernels in torch, an extra's packages.

A test whose data or hardware the machine lacks is skipped with the reason and what to do about it.
CI sets ``SOHSM_REQUIRE_DATA=1``: there a missing data set fails the test instead, so nothing that CI
is meant to run is ever skipped silently. Nothing is downloaded at test time.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from sohsm.data.files import resolve_data_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
#: set to 1 where every data set must be present (CI): a missing one fails instead of skipping
REQUIRE_ENV = "SOHSM_REQUIRE_DATA"


def data_dir() -> Path:
    """The data directory the tests read: ``$SOHSM_DATA`` (relative to the repository root), else the
    library's default (``~/.cache/sohsm``)."""
    path = resolve_data_dir()
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()


def missing(what: str, how: str) -> None:
    """Skip the test (fail it where ``$SOHSM_REQUIRE_DATA`` is set) because ``what`` is missing."""
    reason = f"{what} not in the data directory {data_dir()}: {how}"
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{reason} (${REQUIRE_ENV} is set, so this is an error)")
    pytest.skip(reason)


def need_files(what: str, how: str, *relative: str) -> Path:
    """The data directory, once every ``relative`` path is in it; else skip (or fail) naming ``what``."""
    root = data_dir()
    absent = [r for r in relative if not (root / r).is_file()]
    if absent:
        missing(f"{what} ({', '.join(absent)})", how)
    return root


def need_corpus(name: str) -> Path:
    """The data directory, once every file of the known corpus ``name`` is in it."""
    from sohsm.data.corpora import get_spec

    return need_files(name, f"run `sohsm data fetch {name}`", *(f.path for f in get_spec(name).files))


def need_packages(*names: str, how: str) -> None:
    """Skip the test, or the whole module when called at its top, until every package of ``names`` is installed;
    fail instead where ``$SOHSM_REQUIRE_DATA`` is set (CI installs every extra, so nothing there is skipped)."""
    absent = [name for name in names if importlib.util.find_spec(name) is None]
    if not absent:
        return
    reason = f"{', '.join(absent)} not installed: {how}"
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{reason} (${REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


#: how to install what the Hugging Face tests need
HF_HOW = "pip install -e '.[hf]' (or the dev extra)"


GIGAWORD_HOW = "see docs/s2s.md for where Gigaword and DUC-2004 come from and where they go"


@functools.cache
def bf16_lstm_failure() -> str | None:
    """Why this machine cannot run an LSTM under bf16 autocast on the CPU; ``None`` if it can."""
    from sohsm.train.precision import autocast_fails

    lstm = torch.nn.LSTM(4, 4)
    return autocast_fails("bf16", torch.device("cpu"), lambda: lstm(torch.zeros(1, 1, 4)))


def need_bf16_lstm() -> None:
    """Skip the test where torch has no bf16 LSTM kernel for this CPU (the CLI refuses ``--amp bf16`` there)."""
    failure = bf16_lstm_failure()
    if failure is not None:
        pytest.skip(f"this CPU has no bf16 LSTM kernels in torch {torch.__version__}: {failure}")
