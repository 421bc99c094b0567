"""`sohsm data list|info|fetch`, run in-process through sohsm.cli.main.main."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sohsm.cli.main import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_list_shows_present_and_verified(data_dir, capsys):
    assert main(["data", "list", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    corpora = out.split("\n\n")[0]  # the headline data follows, after a blank line
    rows = {line.split()[0]: line for line in corpora.splitlines()[1:]}
    assert set(rows) == {"ptb", "wikitext-2", "wikitext-103", "text8", "text8-small"}
    assert rows["ptb"].split()[1] == "ok" and rows["text8-small"].split()[1] == "ok"
    assert rows["wikitext-103"].split()[1] == "missing"


def test_list_flags_a_corrupt_file(data_dir, tmp_path, capsys):
    import shutil

    shutil.copytree(data_dir / "ptb", tmp_path / "ptb")
    with open(tmp_path / "ptb" / "ptb.test.txt", "ab") as handle:
        handle.write(b"x")
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "CHECKSUM MISMATCH" in out and "ptb/ptb.test.txt: mismatch" in out


def test_info_prints_counts(data_dir, ptb, capsys):
    assert main(["data", "info", "ptb", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "10,000 entries" in out
    assert "train       929,589 tokens" in out and "valid       73,760 tokens" in out
    assert "(read)" in out  # the session's cache entry


def test_missing_corpus_is_one_line_and_fails(tmp_path, capsys):
    code = main(["data", "info", "ptb", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "ptb/ptb.train.txt" in err and "sohsm data fetch ptb" in err


def test_unknown_corpus(capsys):
    assert main(["data", "fetch", "nope"]) == 2
    assert "unknown corpus 'nope'" in capsys.readouterr().err


def test_fetch_from_a_mirror(data_dir, tmp_path, http_serve, capsys):
    base, _ = http_serve(data_dir)
    code = main(["data", "fetch", "ptb", "--data-dir", str(tmp_path), "--base-url", base, "--no-progress"])
    assert code == 0
    assert (tmp_path / "ptb" / "ptb.test.txt").is_file()
    assert capsys.readouterr().out.count(" ok") == 3


def test_data_without_subcommand_shows_usage(capsys):
    assert main(["data"]) == 2
    assert "fetch" in capsys.readouterr().err


def test_python_dash_m(data_dir, session_cache):
    env = dict(os.environ, SOHSM_DATA=str(data_dir), SOHSM_CACHE=str(session_cache))
    result = subprocess.run([sys.executable, "-m", "sohsm", "data", "list"], capture_output=True, text=True,
                            env=env, cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ptb" in result.stdout and "text8-small" in result.stdout
