"""The help of the commands: the training options grouped with the common ones first, no flag both required and
defaulted, a usage line one can read, and examples that are whole command lines."""
from __future__ import annotations

import argparse
import re
import shlex

import pytest

from sohsm.cli.main import build_parser

TRAIN_COMMANDS = ("lm", "s2s", "w2v")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _all_parsers(parser: argparse.ArgumentParser):
    yield parser
    for child in _subparsers(parser).values():
        yield from _all_parsers(child)


def _train(command: str) -> argparse.ArgumentParser:
    return _subparsers(_subparsers(build_parser())[command])["train"]


@pytest.mark.parametrize("command", TRAIN_COMMANDS)
def test_training_options_come_in_groups_the_common_first(command):
    parser = _train(command)
    titles = [g.title for g in parser._action_groups if g._group_actions and g.title != "options"]
    assert titles[:3] == ["run", "data", "head"] and titles.index("model") < titles.index("optimisation")
    run = next(g for g in parser._action_groups if g.title == "run")
    assert [a.option_strings[0] for a in run._group_actions][:2] == ["--run-dir", "--resume"]
    head = next(g for g in parser._action_groups if g.title == "head")
    assert head._group_actions[0].option_strings == ["--head"]
    usage = parser.format_usage()
    assert len(usage.splitlines()) == 1 and len(usage) <= 100, usage


@pytest.mark.parametrize("command", TRAIN_COMMANDS)
def test_no_flag_is_required_and_defaulted_at_once(command):
    for action in _train(command)._actions:
        text = " ".join((action.help or "").split())
        assert not ("must name it" in text and "(default:" in text), (action.option_strings, text)
        assert "required" not in text or "(default:" not in text, (action.option_strings, text)
    lm = {a.dest: " ".join(a.help.split()) for a in _train("lm")._actions}
    for dest in ("corpus", "head"):
        assert lm[dest].count("a new run must name it") == 1 and "default" not in lm[dest], lm[dest]


def test_the_fused_flag_says_what_each_choice_does():
    fused = next(a for a in _train("lm")._actions if a.dest == "fused")
    text = " ".join(fused.help.split())
    assert "(equal to 1e-6)" not in text and "within 1e-6" in text and "(default: true)" in text


def _examples(epilog: str) -> list[str]:
    """The command lines of an epilog, their continuation lines joined; each line's command at most 100 columns."""
    out, pending = [], ""
    for line in epilog.splitlines():
        text = pending + line.strip()
        if pending or text.startswith("sohsm ") or " -m sohsm " in text:
            command = line.split(" #")[0].rstrip()  # a comment may run on
            assert len(command) <= 100, f"an example line of {len(command)} columns: {line}"
        pending = text[:-1] + " " if text.endswith("\\") else ""
        if not pending and (text.startswith("sohsm ") or " -m sohsm " in text):
            out.append(text)
    assert not pending, f"a continuation without its next line: {pending}"
    return out


def test_every_example_in_the_help_is_one_whole_command_that_parses():
    checked, top = 0, build_parser()
    for parser in _all_parsers(top):
        for example in _examples(parser.epilog or ""):
            argv = shlex.split(example, comments=True)
            argv = argv[argv.index("sohsm") + 1:]
            argv = argv[:next((i for i, w in enumerate(argv) if w in (">", "<", "|", "&&", ";")), len(argv))]
            if any(word.isupper() and word.isalpha() for word in argv):  # a placeholder (GIGAWORD_DIR) stays
                argv = [w.lower() if w.isupper() else w for w in argv]
            try:
                top.parse_args(argv)
            except SystemExit:
                pytest.fail(f"{parser.prog}: the example does not parse: {example}")
            checked += 1
    assert checked >= 20


def _loaded_after(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``sohsm ARGV`` (its output dropped)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import sohsm.cli.main

    src = str(Path(sohsm.cli.main.__file__).parents[2])
    code = ("import contextlib, io, sys\nfrom sohsm.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
            "print(' '.join(sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], ["data", "list"], ["data", "--help"]])
def test_starting_the_command_imports_no_torch(argv, tmp_path):
    """`sohsm --help`, `--version` and `data list` start at once: torch (seconds to import) is not imported."""
    loaded = _loaded_after([*argv, *(["--data-dir", str(tmp_path)] if argv == ["data", "list"] else [])])
    assert "sohsm.cli.main" in loaded and not {"torch", "matplotlib", "triton"} & loaded


def test_ctrl_c_during_start_up_is_one_line_and_130(cli, monkeypatch):
    """An interrupt while a command's modules are imported (seconds for torch) is no traceback."""
    import importlib

    def interrupted(name, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    code, out, err = cli("lm", "train", "--help")
    assert (code, out, err) == (130, "", "interrupted\n")


def test_lm_train_help_is_wide_short_and_says_what_it_trains(cli, monkeypatch):
    """Each help beside its flag on a wide terminal, no benchmark figures in a flag's help (they are in docs/),
    and a first line that names both models."""
    monkeypatch.setenv("COLUMNS", "122")
    code, out, _ = cli("lm", "train", "--help")
    assert code == 0
    lines = out.splitlines()
    assert max(map(len, lines)) > 100 and len(lines) < 170, len(lines)
    description = " ".join(out.split("\n\n")[1].split())
    assert description.startswith("Train a language model (the paper's LSTM, or a transformer")
    helps = {a.dest: " ".join(a.help.split()) for a in _train("lm")._actions}
    for dest in ("dropout", "fused"):
        assert "->" not in helps[dest] and " ms" not in helps[dest] and len(helps[dest]) < 240, helps[dest]


def _shown_default(text: str, choice: tuple[str, str] | None) -> str | None:
    """The default a flag's help shows (``(default: 30; --model transformer: 100)``) for the run that makes
    ``choice`` (``("--model", "transformer")``; ``None``: the choices' defaults); ``None`` where it shows none."""
    found = re.search(r"\(default: (.*)\)$", " ".join(text.split()))
    if found is None:
        return None
    first, *others = found.group(1).split("; ")
    by_choice = dict(re.fullmatch(r"(--\S+ \S+): (.+)", other).group(1, 2) for other in others)
    return by_choice.get(" ".join(choice), first) if choice else first


@pytest.mark.parametrize("argv", [
    ["lm", "train", "--corpus", "ptb", "--head", "full"],
    ["lm", "train", "--corpus", "ptb", "--head", "full", "--model", "transformer"],
    ["s2s", "train", "--head", "full"],
    ["w2v", "train", "--corpus", "text8-small", "--head", "full"],
])
def test_every_default_the_help_shows_is_the_one_a_new_run_takes(argv, cli, monkeypatch, tmp_path):
    """The config a new run is started with (what it writes to config.json, but for head options its vocabulary
    settles) against every ``(default: ...)`` of ``--help``: an LSTM's 30 warm-up steps, a transformer's 100."""
    import sohsm.train
    from sohsm.cli.config_flags import _show

    started = []
    monkeypatch.setattr(sohsm.train, "train", lambda config, run_dir, progress: started.append(config))
    code, _, err = cli(*argv, "--run-dir", tmp_path / "run")
    assert started, err
    config = started[0]
    parser = _train(argv[0])
    paths = {flag.dest: flag.path for flag in parser.get_default("config_flags")}
    choice = ("--model", "transformer") if "transformer" in argv else None
    compared = 0
    for action in parser._actions:
        shown = _shown_default(action.help or "", choice)
        if shown is None or action.dest not in paths or action.option_strings[0] in argv:
            continue
        value = config.get(paths[action.dest])
        if action.dest == "tie_weights":
            assert shown == "true for a new run that can be tied" and value is True  # full softmax, 512 and 512
        else:
            assert shown == _show(value), (action.option_strings[0], shown, value)
        compared += 1
    assert compared > 12
