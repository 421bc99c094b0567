"""Every usage example in the library's docstrings runs (doctest)."""
import doctest
import importlib
import pkgutil

import pytest

import sohsm

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(sohsm.__path__, prefix="sohsm.") if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
