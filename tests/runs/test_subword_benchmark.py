"""benchmarks/subword.py end to end on a small text: it trains, evaluates and keeps each run, skips kept ones,
and its report's numbers are the kept evaluations' own."""
import contextlib
import io
import json
import subprocess

import pytest

from benchmark_scripts import load_script
from sohsm.cli.main import main as sohsm_main

pytest.importorskip("tokenizers")
subword = load_script("subword")

#: a tiny model and budget in place of the protocol's
TINY = ("--layers 1 --hidden-size 16 --attention-heads 2 --bptt 8 --batch-size 4 --eval-batch-size 4 "
        "--max-tokens 320 --eval-every 5 --log-every 5 --warmup 2")
SENTENCES = ["the cat sat on the mat", "a dog ran after the cat", "the bird saw a dog on the mat"]


def _in_process(*args: str) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = sohsm_main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SOHSM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(subword.kept_runs, "sohsm", _in_process)
    folder = tmp_path / "text"
    folder.mkdir()
    for name, lines in (("train.txt", 200), ("valid.txt", 40), ("test.txt", 40)):
        (folder / name).write_text("\n".join(SENTENCES[i % 3] for i in range(lines)) + "\n")
    return folder


def test_train_keeps_each_run_and_the_report_reads_them(corpus, tmp_path):
    results = tmp_path / "results"
    argv = ["train", "--vocabularies", "bpe:270", "--runs", "full-tied,self_organized-tied", "--seeds", "1",
            "--runs-dir", str(tmp_path / "runs"), "--results", str(results), "--corpus", str(corpus), "--extra", TINY]
    assert subword.main(argv) == 0
    kept = results / "bpe-270" / "seed-1" / "self_organized-tied"
    assert sorted(p.name for p in kept.iterdir()) == ["config.json", "metrics.jsonl", "test.json", "valid.json"]
    config = json.loads((kept / "config.json").read_text())
    assert config["data"]["tokenizer"] == "bpe:270" and config["model"]["architecture"] == "transformer"
    assert config["model"]["hidden_size"] == 16 and config["max_tokens"] == 320  # the tiny flags override
    test = json.loads((kept / "test.json").read_text())
    assert test["checkpoint"] == "best.pt" and test["subwords"] and test["words"] > 0
    before = (kept / "test.json").stat().st_mtime_ns
    assert subword.main(argv) == 0 and (kept / "test.json").stat().st_mtime_ns == before  # kept: skipped

    text = subword.report(tmp_path / "subword.md", results)
    assert (tmp_path / "subword.md").read_text() == text and "## bpe:270" in text
    row = next(line for line in text.splitlines() if line.startswith("| self_organized-tied"))
    valid = json.loads((kept / "valid.json").read_text())
    assert f"| {valid['ppl_word']:.2f} | {test['ppl_word']:.2f} | {valid['bits_per_byte']:.4f} |" in row
    assert "- self_organized-tied: " in text  # against the full softmax


def test_bad_vocabularies_are_refused(capsys):
    with pytest.raises(SystemExit):
        subword.main(["train", "--vocabularies", "words"])
    assert "bpe:SIZE" in capsys.readouterr().err
