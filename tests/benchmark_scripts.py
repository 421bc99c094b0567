"""A benchmarks/ script as a module, the one way every test that needs one loads it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str, module_name: str | None = None) -> ModuleType:
    """``benchmarks/NAME.py`` as a module named ``module_name`` (default ``NAME``).

    The scripts import their neighbours by name (fair_quality, kept_runs, subword, ...): benchmarks/ is on
    ``sys.path`` while the script loads and only then, so that no script's name (heads, gpu, ...) shadows a
    test's module afterwards.
    """
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no script benchmarks/{name}.py"
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
