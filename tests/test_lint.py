"""The linter's verdict is a test: ``ruff check`` finds nothing in src/, tests/ and benchmarks/.

The rules are pyproject.toml's ``[tool.ruff]``; CI runs the test suite, so a finding fails CI with ruff's own
report. ``python -m ruff check --fix src tests benchmarks`` fixes the safe findings."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("src", "tests", "benchmarks")


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]' (the dev extra brings the linter)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                             *PATHS], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"ruff check {' '.join(PATHS)}:\n{result.stdout}{result.stderr}"
