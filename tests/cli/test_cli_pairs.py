"""`sohsm s2s pairs`: Gigaword SGML in, the folder `s2s train --pairs` trains on out; bad input in one line."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from disk import read_only
from needs import REPO_ROOT, need_files

TINY = ["--emb-size", "16", "--hidden-size", "16", "--batch-size", "8", "--quiet"]


def _gigaword(folder: Path, n: int = 60) -> Path:
    """A month of hand-written Gigaword stories (and one that is not a story)."""
    docs = [f'<DOC id="CNA_ENG_199710{i:02d}.{i:04d}" type="story" >\n<HEADLINE>\nTAIWAN MINISTER {i} VISITS '
            f"EUROPE FOR TRADE TALKS\n</HEADLINE>\n<DATELINE>\nTaipei, Oct. 1 (CNA)\n</DATELINE>\n<TEXT>\n<P>\n"
            f"Taiwan's minister number {i} left for Europe on Monday to promote\ntrade ties, officials said.\n</P>\n"
            "<P>\nMore.\n</P>\n</TEXT>\n</DOC>\n" for i in range(n)]
    docs.append('<DOC id="X.1" type="multi" >\n<HEADLINE>\nNEWS\n</HEADLINE>\n<TEXT>\nSome news.\n</TEXT>\n</DOC>\n')
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "cna_eng_199710.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(docs))
    return folder


def _one_line_error(code: int, err: str) -> str:
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_pairs_then_train_on_them(tmp_path, cli):
    giga, out, empty = _gigaword(tmp_path / "giga"), tmp_path / "pairs", tmp_path / "no-data"
    empty.mkdir()
    code, stdout, err = cli("s2s", "pairs", giga, "--out", out, "--valid-share", "0.2", "--data-dir", empty)
    assert code == 0, err
    assert re.search(r"documents read\s+61\n", stdout) and re.search(r"dropped: not a story\s+1\n", stdout)
    assert "none found in the data directory" in stdout and f"sohsm s2s train --pairs {out}" in stdout
    assert "gigaword: 100%" in err  # the progress bar
    report = json.loads((out / "pairs.json").read_text())
    assert report["written"]["train"] + report["written"]["valid"] == 60 and report["written"]["valid"] > 0
    code, stdout, err = cli("s2s", "train", "--pairs", out, *TINY, "--head", "full", "--run-dir", tmp_path / "run",
                            "--max-tokens", 300, "--eval-every", 2)
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["pairs"] == str(out.resolve())
    assert f"pairs={report['written']['train']}" in stdout  # the signature names the pairs trained on
    code, stdout, err = cli("s2s", "titles", "--pairs", out, "--out", tmp_path / "titles")
    assert code == 0, err
    assert (tmp_path / "titles" / "train.txt").read_text() == (out / "train.title.txt").read_text()


def test_pairs_bad_input_is_one_line_and_writes_nothing(tmp_path, cli):
    giga = _gigaword(tmp_path / "giga")
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain.gz").write_bytes(gzip.compress(b"just some text\n"))
    (tmp_path / "fake.gz").write_text("not gzip")
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "out"
    cases = [
        ([tmp_path / "missing"], "missing: no such file or folder"),
        ([tmp_path / "empty"], "empty: no .gz files in this folder"),
        ([tmp_path / "plain.gz"], "plain.gz: not English Gigaword SGML"),
        ([tmp_path / "fake.gz"], "fake.gz: not a gzip file"),
        ([giga, "--valid-share", "0"], "--valid-share must be between 0 and 1"),
        ([giga, "--valid-share", "1e-9"], "no dev pair left of 61 documents"),
    ]
    for argv, message in cases:
        line = _one_line_error(*cli("s2s", "pairs", *argv, "--out", out, "--quiet")[::2])
        assert line.startswith("sohsm s2s: error: ") and message in line, line
        assert not out.exists()
    line = _one_line_error(*cli("s2s", "pairs", giga, "--out", tmp_path / "a-file", "--quiet")[::2])
    assert "a-file: a file, not a folder" in line


def test_pairs_into_a_read_only_folder(tmp_path, cli, monkeypatch):
    giga, out = _gigaword(tmp_path / "giga"), tmp_path / "out"
    out.mkdir()
    read_only(monkeypatch, out)
    code, _, err = cli("s2s", "pairs", giga, "--out", out, "--quiet")
    line = _one_line_error(code, err)
    assert re.fullmatch(rf"sohsm s2s: error: {re.escape(str(out))}/[a-z.]+\.(txt|json): Permission denied", line), line
    assert list(out.iterdir()) == []


def test_the_cna_numbers_in_the_docs(tmp_path, cli):
    """docs/s2s.md shows what `sohsm s2s pairs` prints on the two CNA months of the data directory."""
    root = need_files("English Gigaword SGML", "two LDC English Gigaword months; see docs/s2s.md",
                      "gigaword-raw-sgml/cna_eng_199710.gz", "gigaword-raw-sgml/cna_eng_200403.gz")
    code, stdout, err = cli("s2s", "pairs", root / "gigaword-raw-sgml", "--out", tmp_path / "pairs-cna",
                            "--data-dir", root, "--quiet")
    assert code == 0, err
    docs = (REPO_ROOT / "docs" / "s2s.md").read_text(encoding="utf-8")
    table = [line for line in stdout.splitlines() if line.startswith(("documents", "  dropped", "pairs written"))]
    assert len(table) == 12
    for line in table:
        assert "    " + line in docs, line
    blacklisted = json.loads((tmp_path / "pairs-cna" / "pairs.json").read_text())["blacklisted"]
    shown = re.search(r"`pairs.json` counts the ([\d,]+) blacklisted headlines by the first entry of the list each "
                      r"holds: `' : '` (\d+)\s+\(.*?\), `ap` (\d+), `' by '` (\d+), `-lrb-` (\d+), `' i '` (\d+), "
                      r"the rest (\d+)\.", docs, re.S)
    assert shown, "docs/s2s.md no longer shows the blacklist counts"
    top = [" : ", "ap", " by ", "-lrb-", " i "]
    rest = sum(v for k, v in blacklisted.items() if k not in top)
    assert [int(n.replace(",", "")) for n in shown.groups()] == [sum(blacklisted.values()),
                                                                 *(blacklisted[k] for k in top), rest]
    if not all(name in stdout for name in ("gigaword (1,951", "duc2004 (500", "duc2003 (624")):
        pytest.fail(f"the test sets were not all read: {stdout}")


def test_train_on_a_folder_that_is_no_pairs_folder(tmp_path, cli):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.article.txt").write_text("a b .\n")
    giga = _gigaword(tmp_path / "giga")
    assert cli("s2s", "pairs", giga, "--out", tmp_path / "pairs", "--valid-share", "0.2", "--quiet")[0] == 0
    for argv, message in (
        (["--pairs", tmp_path / "missing"], "missing: no such folder of headline pairs"),
        (["--pairs", tmp_path / "half"], "train.title.txt, valid.article.txt, valid.title.txt missing"),
        (["--pairs", tmp_path / "pairs", "--dataset", "reverse"],
         "--pairs is a folder of headline pairs: it needs --dataset gigaword, got 'reverse'"),
    ):
        line = _one_line_error(*cli("s2s", "train", *argv, *TINY, "--head", "full", "--run-dir",
                                    tmp_path / "run")[::2])
        assert message in line, line
        assert not (tmp_path / "run").exists()


def test_a_test_set_article_is_left_out(tmp_path, cli):
    """A story whose first sentence is an input of the Gigaword test set (``UNK`` for a word there) is dropped:
    here the ten stories of ministers 0 to 9, whose digit is ``#`` in both."""
    giga, data = _gigaword(tmp_path / "giga"), tmp_path / "data"
    (data / "gigaword" / "Giga").mkdir(parents=True)
    (data / "gigaword" / "Giga" / "input.txt").write_text(
        "taiwan 's minister number # left for UNK on monday to promote trade ties , officials said .\n")
    code, stdout, err = cli("s2s", "pairs", giga, "--out", tmp_path / "pairs", "--valid-share", "0.2",
                            "--data-dir", data, "--quiet")
    assert code == 0, err
    assert re.search(r"dropped: in a test set\s+10\n", stdout) and "test sets   gigaword (1 articles)" in stdout
    titles = (tmp_path / "pairs" / "train.title.txt").read_text() + (tmp_path / "pairs" / "valid.title.txt").read_text()
    assert "taiwan minister # visits" not in titles and "taiwan minister ## visits" in titles
