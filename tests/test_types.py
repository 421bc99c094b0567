"""The type checker's verdict is a test: ``mypy`` finds nothing in src/sohsm.

The settings are pyproject.toml's ``[tool.mypy]`` (the files it checks among them); CI runs the test suite, so an
error fails CI with mypy's own report. ``python -m mypy`` from the repository root reproduces it."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[dev]' (the dev extra brings the type checker)")
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"mypy (pyproject.toml's [tool.mypy]):\n{result.stdout}{result.stderr}"
