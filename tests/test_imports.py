"""The package has no import cycle: every module can be imported on its own, in any order.

The graph is built from the source (every ``import`` statement, at the top of a
file or inside a function) with the edges Python's import system follows:
``import a.b.c`` and ``from a.b.c import x`` run ``a.b.c`` and every package
above it that the importing module is not already inside; ``from a.b import x``
with ``x`` a name (not a submodule) needs ``a.b`` to have finished, even from
inside ``a.b``.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import sohsm

ROOT = Path(sohsm.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules that importing ``name`` makes Python run (or need finished) first."""
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    inside = set(_ancestors(name)) | {name}
    targets: set[str] = set()

    def run(target: str) -> None:
        for module in [*_ancestors(target), target]:
            if module in modules and module not in inside:
                targets.add(module)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sohsm":
                    run(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "sohsm":
                continue
            run(source)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:
                    run(sub)
                elif source in modules and source != name:
                    targets.add(source)  # a name defined in `source` itself: it must have finished
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_top_level_and_function_level_imports():
    graph = import_graph()
    assert "sohsm.train.task" in graph["sohsm.train.loop"]
    assert "sohsm.train" in graph["sohsm.tasks.lm.task"]  # a package above, outside the importer, runs first
    assert "sohsm.heads" in graph["sohsm"]
    assert "sohsm.runs.plots" in graph["sohsm.cli.plot"]  # imported inside a function


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_loop_imports_no_task_and_the_tasks_no_report():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("sohsm.train"):
            assert not any(t.startswith(("sohsm.tasks", "sohsm.runs", "sohsm.cli")) for t in targets), (name, targets)
        if name.startswith("sohsm.tasks"):
            assert not any(t.startswith(("sohsm.runs", "sohsm.cli")) for t in targets), (name, targets)


#: the rooms of the package, each importing only rooms before it (docs/architecture.md says the same)
LAYERS = (("fields", "version", "rouge", "lazy", "atomic_writes"), ("data",), ("clustering",), ("heads",),
          ("head_catalogue",), ("models",), ("hf",), ("train",),
          ("tasks",), ("runs",), ("cli",), ("__main__",))


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_each_room_imports_only_the_rooms_before_it():
    level = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
    graph = import_graph()
    assert {_room(m) for m in graph} - {""} == set(level), "a room is missing from LAYERS"
    for name, targets in graph.items():
        if not _room(name):  # the package itself: its __init__ imports the heads
            continue
        for target in targets:
            if _room(target) and _room(target) != _room(name):
                assert level[_room(target)] < level[_room(name)], f"{name} imports {target}"


def _python(code: str) -> str:
    """Run ``code`` in a fresh interpreter that imports this checkout's sohsm; its standard output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_sohsm_loads_the_heads_and_no_training_model_or_data():
    loaded = _python("import sys, sohsm\n"
                     "sohsm.build_head('self_organized', 8, 50, counts=list(range(50, 0, -1)))\n"
                     "print(' '.join(sorted(m for m in sys.modules if m.startswith('sohsm'))))").split()
    assert "sohsm.heads.two_level.self_organizing.self_organized" in loaded
    rooms = {_room(m) for m in loaded}
    assert not rooms & {"train", "tasks", "data", "models", "hf", "runs", "cli"}, sorted(loaded)


def test_importing_sohsm_and_its_heads_loads_no_hugging_face_package():
    """The ``hf`` extra's packages are imported where they are used (``sohsm.hf``), never on the way to a head."""
    heavy = ("transformers", "tokenizers", "accelerate", "safetensors", "huggingface_hub")
    code = ("import sys, sohsm\n"
            "sohsm.build_head('self_organized', 8, 50, counts=list(range(50, 0, -1)))\n"
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})) or '-')")
    assert _python(code).split() == ["-"]


def test_the_loop_finds_a_task_by_name_without_it_being_imported_first():
    out = _python("import sys\nfrom sohsm.train.task import task_named\n"
                  "print('sohsm.tasks.lm' in sys.modules, task_named('w2v').name)")
    assert out.split() == ["False", "w2v"]


def test_neither_the_package_nor_the_help_imports_tokenizers():
    """Subword vocabularies import `tokenizers` (the hf extra) when one is made or read, never before."""
    out = _python("import contextlib, io, sys\nimport sohsm\nfrom sohsm.cli.main import main\n"
                  "import sohsm.tasks.lm, sohsm.data.loading\n"
                  "for argv in (['--help'], ['lm', 'train', '--help'], ['lm', 'eval', '--help']):\n"
                  "    with contextlib.redirect_stdout(io.StringIO()):\n"
                  "        try:\n"
                  "            main(argv)\n"
                  "        except SystemExit:\n"
                  "            pass\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tokenizers', 'transformers')))")
    assert out.strip() == "[]"


def test_the_help_of_every_training_command_imports_no_torch():
    """``--help`` reads the configs and the head catalogue alone: torch (seconds to import) only when a run starts."""
    out = _python("import contextlib, io, sys\nfrom sohsm.cli.main import main\n"
                  "for argv in (['lm', 'train', '--help'], ['s2s', 'train', '--help'], ['w2v', 'train', '--help'],\n"
                  "             ['lm', 'compare', '--help'], ['lm', 'eval', '--help']):\n"
                  "    with contextlib.redirect_stdout(io.StringIO()):\n"
                  "        try:\n"
                  "            main(argv)\n"
                  "        except SystemExit:\n"
                  "            pass\n"
                  "print('torch' in sys.modules)")
    assert out.strip() == "False"


def test_the_head_catalogue_is_the_registry():
    """The table ``--help`` lists heads from is what the registry holds (``python -m sohsm.head_catalogue`` rewrites
    it after a head or an option is added)."""
    from sohsm import head_catalogue

    assert head_catalogue.HEADS == head_catalogue.from_registry(), "run `python -m sohsm.head_catalogue`"


def test_importing_sohsm_hf_imports_transformers_only_when_a_name_is_used():
    """``from transformers import PreTrainedModel`` alone takes seconds: ``import sohsm.hf`` defers it to the first
    use of one of its names."""
    out = _python("import sys\nimport sohsm.hf\nprint('transformers' in sys.modules, 'torch' in sys.modules)\n"
                  "sohsm.hf.use_head\nprint('transformers' in sys.modules)")
    assert out.split() == ["False", "False", "True"]
