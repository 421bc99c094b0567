"""Code outside ``heads/`` asks a head what it can do, never its name or class (docs/architecture.md).

The loop (``train/``), the tasks (``tasks/``) and what is done with finished runs (``runs/``) may hold a head's name
only as a value they were given; a registered head's name written into their source (a string, or a name quoted in
a message or an example), or a concrete head class imported or named there, is a decision by name that belongs to the
head (its registry hooks: :func:`sohsm.heads.setting_defaults`, :func:`~sohsm.heads.legacy_options`,
:func:`~sohsm.heads.preset`, ...; its roles: :mod:`sohsm.head_catalogue`). Prose naming a head in double back-quotes is
documentation and passes.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sohsm
from sohsm.heads import Head, head_names

ROOT = Path(sohsm.__file__).parent
#: the rooms that must not decide by a head's name
ROOMS = ("train", "tasks", "runs")


def _concrete_head_classes() -> dict[str, str]:
    """``{class name: module}`` of every head class defined outside the interface (``heads/base.py``)."""
    found, todo = {}, list(Head.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("sohsm.heads.") and cls.__module__ != "sohsm.heads.base":
            found[cls.__name__] = cls.__module__
    return found


def head_name_uses(source: str, names: list[str], classes: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, what)`` of every registered head name or concrete head class in ``source``."""
    quoted = re.compile(r"""(['"])(""" + "|".join(map(re.escape, names)) + r")\1")
    modules = set(classes.values())
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in names:
                found.append((node.lineno, f"the string {node.value!r}"))
            elif match := quoted.search(node.value):
                found.append((node.lineno, f"{match.group(0)} in a string"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in modules:
                found.append((node.lineno, f"an import from {node.module}"))
            found += [(node.lineno, f"an import of {a.name}") for a in node.names if a.name in classes]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"an import of {a.name}") for a in node.names if a.name in modules]
        elif isinstance(node, ast.Attribute) and node.attr in classes:
            found.append((node.lineno, f"the class {node.attr}"))
        elif isinstance(node, ast.Name) and node.id in classes:
            found.append((node.lineno, f"the class {node.id}"))
    return found


def test_the_detector_finds_a_name_a_quoted_name_and_a_class():
    names, classes = head_names(), _concrete_head_classes()
    assert {"FullSoftmax", "SelfOrganizedSoftmax", "PMISoftmax", "BinaryTreeSoftmax"} <= set(classes)
    assert "Head" not in classes and "ClusteredHead" not in classes  # the interface may be asked
    source = ('if name == "pmi":\n    pass\n'
              'raise ValueError(f"use the \'tree\' head, not {name}")\n'
              "from sohsm.heads.sampled import PMISoftmax\n"
              "from sohsm.heads import FullSoftmax\n"
              "import sohsm.heads.binary_tree\n"
              "ok = isinstance(head, heads.SelfOrganizedSoftmax)\n"
              '"""Prose: a ``tree_huffman`` run, a full softmax, a tree."""\n')
    assert sorted({line for line, _ in head_name_uses(source, names, classes)}) == [1, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("room", ROOMS)
def test_no_registered_head_name_or_class_outside_the_heads(room):
    names, classes = head_names(), _concrete_head_classes()
    uses = [f"{path.relative_to(ROOT)}:{line}: {what}"
            for path in sorted((ROOT / room).rglob("*.py"))
            for line, what in head_name_uses(path.read_text(encoding="utf-8"), names, classes)]
    assert not uses, "decided by a head's name (ask the head or its registry instead):\n" + "\n".join(uses)
