"""Every kind of command-line error is one line under one prefix, the command's (`sohsm lm: error: ...`), in words
a user can type."""
from __future__ import annotations

import pytest

from sohsm.cli.config_flags import given_value
from sohsm.cli.main import build_parser

NEW_RUN = ["lm", "train", "--corpus", "ptb", "--head", "full"]


def _one_line(code: int, err: str, prefix: str = "sohsm lm: error: ") -> str:
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(prefix), err
    assert "usage:" not in err and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv, words", [
    (["lm", "train", "--corpus", "ptb", "--head", "nosuch", "--run-dir", "x"], "--head: invalid choice: 'nosuch'"),
    (NEW_RUN, "the following arguments are required: --run-dir"),
    ([*NEW_RUN, "--run-dir", "x", "--epochs", "two"], "--epochs: invalid int value: 'two'"),
    ([*NEW_RUN, "--run-dir", "x", "--epohcs", "2"], "unrecognized arguments: --epohcs 2"),
    ([*NEW_RUN, "--run-dir", "x", "--hidden", "8"], "unrecognized arguments: --hidden 8"),  # no prefixes of flags
    (["lm", "nosuch"], "invalid choice: 'nosuch'"),
])
def test_argparse_errors_are_one_line_with_the_commands_prefix(argv, words, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line(*cli(*argv)[::2])
    assert words in line and line.endswith("--help)")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, words", [
    (["--head", "self_organised"], "--head: invalid choice: 'self_organised'; did you mean self_organized?"),
    (["--head", "self_organized", "--head-option", "gama=2"], "has no option 'gama'; did you mean gamma?"),
    (["--head", "full", "--corpus", "ptbx"], "unknown corpus 'ptbx' (did you mean ptb?)"),
    (["--head", "full", "--optimizer", "adamm"], "did you mean adam or adamw?"),
])
def test_a_mistyped_name_gets_the_known_names_close_to_it(argv, words, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = [] if "--corpus" in argv else ["--corpus", "ptb"]
    line = _one_line(*cli("lm", "train", *corpus, *argv, "--run-dir", "x")[::2])
    assert words in line
    assert not list(tmp_path.iterdir())


def test_a_choice_error_without_a_close_name_has_no_dangling_separator(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line(*cli("lm", "train", "--corpus", "ptb", "--head", "zzz", "--run-dir", "x")[::2])
    assert "invalid choice: 'zzz' (choose from adaptive," in line and ";" not in line


@pytest.mark.parametrize("argv, words", [
    (["lm", "train", "--run-dir", "x", "--hiden-size", "8"],
     "unrecognized arguments: --hiden-size 8 (did you mean --hidden-size?)"),
    (["lm", "train", "--run-dir", "x", "--epohcs=2"], "(did you mean --epochs?)"),
    (["lm", "train", "--run-dir", "x", "--hiden-size", "8", "--epohcs", "2"],
     "(--hiden-size: did you mean --hidden-size?; --epohcs: did you mean --epochs?)"),
    (["lm", "eval", "runs/x", "--spilt", "test"], "(did you mean --split?)"),
    (["s2s", "train", "--run-dir", "x", "--max-sise", "9"], "(did you mean --max-size?)"),
])
def test_a_misspelled_flag_gets_the_flag_closest_to_it(argv, words, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line(*cli(*argv)[::2], f"sohsm {argv[0]}: error: ")
    assert words in line, line
    assert "(see sohsm " in line
    line = _one_line(*cli("lm", "train", "--run-dir", "x", "--zzzzzz", "2")[::2])
    assert "did you mean" not in line and "unrecognized arguments: --zzzzzz 2 (see" in line


def test_the_commands_own_checks_use_the_same_prefix(cli, tmp_path):
    line = _one_line(*cli(*NEW_RUN, "--run-dir", tmp_path / "r", "--head-option", "gamma")[::2])
    assert "--head-option: expected KEY=VALUE" in line
    line = _one_line(*cli("s2s", "train", "--head", "nosuch", "--run-dir", tmp_path / "s")[::2], "sohsm s2s: error: ")
    assert "--head: invalid choice" in line


def test_an_error_before_any_command_has_the_programs_prefix(cli):
    line = _one_line(*cli("nosuch")[::2], "sohsm: error: ")
    assert "invalid choice: 'nosuch'" in line and "(see sohsm --help)" in line


@pytest.mark.parametrize("flag, value", [
    ("--time-budget", "-5"), ("--max-tokens", "0"), ("--lr", "-1"), ("--clip", "-1"), ("--min-count", "0"),
    ("--max-size", "1"), ("--clusters-cut", "0"),
])
def test_range_errors_name_the_flag_in_words_a_user_can_type(flag, value, cli, tmp_path):
    extra = ["--clusters-from", tmp_path / "paths.txt"] if flag == "--clusters-cut" else []
    line = _one_line(*cli(*NEW_RUN, "--run-dir", tmp_path / "r", flag, value, *extra)[::2])
    assert f"{flag} must be" in line and "None" not in line, line
    if "or none" in line:  # the word it offers is one the flag takes
        args = build_parser().parse_args([*NEW_RUN, "--run-dir", "r", flag, "none"])
        assert given_value(getattr(args, flag[2:].replace("-", "_"))) is None
