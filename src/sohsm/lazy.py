"""Packages whose names are imported from their modules on first use; work put off until a module is imported.

A package's ``__init__`` that imports its modules imports torch with them (seconds), and so does every light
module inside it (a config, a catalogue): Python runs the package's ``__init__`` first. With
:func:`lazy_exports` the package names what it exports and where each comes from, and imports a module the
first time one of its names is asked for (PEP 562), so ``sohsm lm train --help`` reads the configs without torch.
:func:`after_import` runs a callback once a module is imported, and :func:`outside_compile` marks a method for
``torch.compile`` that way, so that importing a head does not import torch's compiler.
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable, Mapping
from typing import Any


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


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module`` is imported: now, where it is already, else right after Python has run it
    (a finder on ``sys.meta_path`` that hands the import to the others and runs the callbacks after it, once).

    What one module needs done only once another is in use (a method marked for ``torch.compile``, once the
    compiler is imported) is then done without importing that other module for everyone.
    """
    if module in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.module == module:
            finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, _AfterImport(module, [callback]))


class _AfterImport:
    """The finder of :func:`after_import`: it finds nothing itself; it wraps the loader the other finders give
    ``module``, so that the callbacks run once the module has run, and then leaves ``sys.meta_path``."""

    def __init__(self, module: str, callbacks: list[Callable[[], None]]) -> None:
        self.module, self.callbacks = module, callbacks

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find is not None else None
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, self)
                return spec
        return None

    def loaded(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in self.callbacks:
            callback()


class _CallbackLoader(importlib.abc.Loader):
    """A module's own loader, and the callbacks of :func:`after_import` after it ran the module."""

    def __init__(self, loader, finder: _AfterImport) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module's own, as if never wrapped
        self.loader.exec_module(module)
        self.finder.loaded()


def outside_compile(method: Callable) -> Any:
    """Decorator: ``method`` runs outside ``torch.compile``'s graph, as ``@torch.compiler.disable`` makes it, applied
    once torch's compiler (``torch._dynamo``) is imported: decorating at import would import the compiler (a second,
    several under load) for everyone who imports the class, compiling or not.

    Example::

        class Head(nn.Module):
            @outside_compile
            def noise_samples(self, n): ...   # read on the host: torch.compile cannot trace it
    """
    return _OutsideCompile(method)


class _OutsideCompile:
    """What :func:`outside_compile` puts in a class body: on the class's creation, the method itself, replaced by
    ``torch.compiler.disable(method)`` when the compiler is imported."""

    def __init__(self, method: Callable) -> None:
        self.method = method

    def __set_name__(self, owner: type, name: str) -> None:
        setattr(owner, name, self.method)

        def disable() -> None:
            import torch

            setattr(owner, name, torch.compiler.disable(self.method))

        after_import("torch._dynamo", disable)
