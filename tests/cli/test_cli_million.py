"""`sohsm lm train` over a vocabulary of a million words: it runs with the defaults and says before its first step
what it will use; a head that cannot fit is refused in one line, before anything is written, naming one that fits."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import sohsm.tasks.lm.preflight as preflight

MILLION = 1_000_000
#: a tiny model: the test is about the vocabulary, not the model
TINY = ["--emb-size", "16", "--hidden-size", "16", "--batch-size", "8", "--bptt", "5", "--min-count", "1"]


@pytest.fixture(scope="module")
def million_words(tmp_path_factory) -> Path:
    """A corpus folder whose training text holds each of a million words once (a vocabulary of a million words)."""
    folder = tmp_path_factory.mktemp("million")
    words = [f"w{i}" for i in range(MILLION)]
    random.Random(0).shuffle(words)
    lines = (" ".join(words[i : i + 50]) for i in range(0, MILLION, 50))
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for split in ("valid", "test"):
        (folder / f"{split}.txt").write_text(" ".join(words[:200]) + "\n", encoding="utf-8")
    return folder


def test_a_million_words_train_with_the_defaults_said_before_the_first_step(million_words, tmp_path, cli,
                                                                            one_thread):
    run_dir = tmp_path / "run"
    code, out, err = cli("lm", "train", "--corpus", million_words, "--head", "self_organized", "--run-dir", run_dir,
                         *TINY, "--max-tokens", 3 * 8 * 5, "--eval-batch-size", "8")
    assert code == 0, err
    start = err[: err.index("train:")] if "train:" in err else err  # what it says before it trains (--quiet not given)
    assert "1,000,00" in start and "words" in start
    assert "clusters" in start and "memory: about" in start and "at its peak" in start
    assert "head option div_value=4, q_clusters=16" in start  # dense q would hold 3.7 GiB: compact on the CPU
    options = json.loads((run_dir / "config.json").read_text())["head"]["options"]
    assert options["q_clusters"] == 16
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "train" for r in records)


def test_a_head_that_cannot_fit_is_refused_in_one_line_naming_one_that_fits(million_words, tmp_path, cli,
                                                                           monkeypatch, one_thread):
    monkeypatch.setattr(preflight, "device_memory", lambda device: 8 * 10**9)  # a machine of 8 GB
    run_dir = tmp_path / "run"
    code, out, err = cli("lm", "train", "--corpus", million_words, "--head", "full", "--run-dir", run_dir,
                         "--emb-size", "256", "--hidden-size", "256", "--min-count", "1", "--quiet")
    assert code != 0
    message = err.strip()
    assert "\n" not in message, message
    assert "does not fit" in message and "1,000,00" in message and "output logits" in message
    assert "--head self_organized would need at least" in message
    assert not run_dir.exists()  # nothing written
