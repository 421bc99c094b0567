"""Packages whose names are imported from their modules on first use.

A package's ``__init__`` that imports its modules imports torch with them (seconds), and so does every light
module inside it (a config, a catalogue): Python runs the package's ``__init__`` first. With
:func:`lazy_exports` the package names what it exports and where each comes from, and imports a module the
first time one of its names is asked for (PEP 562), so ``sohsm lm train --help`` reads the configs without torch.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, table: Mapping[str, tuple[str, ...]]) -> tuple[Callable, Callable, list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, exporting each module's names of ``table``
    (``{"sohsm.tasks.lm.config": ("LMConfig", ...), ...}``)."""
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # asked once
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__, sorted(where)
