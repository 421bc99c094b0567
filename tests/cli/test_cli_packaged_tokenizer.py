"""`sohsm lm train --tokenizer llama3` end to end on a slice of real PTB text: the head has every one of the
tokenizer's 128,256 rows though the slice uses a few thousand, bits per byte take every row's probability mass,
a run resumes with the tokenizer it names, and a missing package is one line saying what to install."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from sohsm.data import load_corpus
from sohsm.train import read_metrics

pytest.importorskip("quicktok")

N_LLAMA3 = 128_256
TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10


@pytest.fixture(scope="module")
def llama3_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A tied full-softmax run over Llama 3's vocabulary, 20 steps."""
    run_dir = tmp_path_factory.mktemp("runs") / "llama3"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "llama3", "--head", "full",
                         "--run-dir", run_dir, *small, "--max-tokens", 20 * TOKENS_PER_STEP, "--eval-every", 10)
    assert code == 0, err
    return run_dir


def test_the_head_has_every_row_of_the_tokenizer(llama3_run):
    config = json.loads((llama3_run / "config.json").read_text())
    assert config["data"]["tokenizer"] == "llama3"
    assert json.loads((llama3_run / "tokenizer.json").read_text())["name"] == "llama3"
    vocab = json.loads((llama3_run / "vocab.json").read_text())
    assert len(vocab["itos"]) == N_LLAMA3
    used = sum(1 for count in vocab["counts"] if count > 0)
    assert 1000 < used < N_LLAMA3 // 10  # the slice uses a sliver of the rows
    state = torch.load(llama3_run / "best.pt", map_location="cpu", weights_only=False)
    shapes = [tuple(t.shape) for t in state["model"].values() if t.dim() == 2]
    assert (N_LLAMA3, 32) in shapes  # the tied output rows (the embedding)


def test_bits_per_byte_take_the_whole_split_over_every_row(llama3_run, ptb_slice, cli):
    words = load_corpus(ptb_slice)
    code, out, err = cli("lm", "eval", llama3_run, "--split", "test", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["subwords"] is True and result["text_bytes"] == words.text_bytes["test"]
    loss = result["nll_nats"] * result["split_tokens"]
    assert math.isclose(result["bits_per_byte"], loss / math.log(2) / result["text_bytes"], rel_tol=1e-9)
    # every token of the split is scored: Llama 3's tokens of the slice's test text, an <eos> per line
    test = load_corpus(ptb_slice, tokenizer="llama3").test
    assert result["split_tokens"] == test.numel() and 0 < result["nll_nats"] < math.log(N_LLAMA3)


def test_resume_reads_the_tokenizer_the_run_names(llama3_run, tmp_path, cli):
    import shutil

    run_dir = tmp_path / "resumed"
    shutil.copytree(llama3_run, run_dir)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 25 * TOKENS_PER_STEP,
                         "--quiet")
    assert code == 0, err
    assert max(r["tokens"] for r in read_metrics(run_dir / "metrics.jsonl")) == 25 * TOKENS_PER_STEP


def test_without_quicktok_the_message_says_what_to_install(ptb_slice, small, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "quicktok", None)  # import quicktok raises ImportError
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "o200k", "--head", "full",
                         "--run-dir", tmp_path / "run", *small)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "pip install 'sohsm[tokenizers]'" in lines[0]
