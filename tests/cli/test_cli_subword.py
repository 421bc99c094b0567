"""Subword vocabularies end to end (`--tokenizer bpe:SIZE` or a tokenizer.json) on a slice of real PTB text: train,
reuse, eval per token, per word and per byte, generate text, resume, compare, plot, clusters, refusals."""
from __future__ import annotations

import json
import math
import sys

import pytest

import sohsm.data.loading
from sohsm.data import load_corpus
from sohsm.train import read_metrics

pytest.importorskip("tokenizers")

TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10
BUDGET = ["--max-tokens", 60 * TOKENS_PER_STEP, "--eval-every", 30, "--log-every", 10]


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A self-organized run over a byte-level BPE of 400 tokens trained on the slice's training split."""
    run_dir = tmp_path_factory.mktemp("runs") / "bpe"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "bpe:400", "--head", "self_organized",
                         "--run-dir", run_dir, *small, *BUDGET, "--update-every", 20)
    assert code == 0, err
    return run_dir


@pytest.fixture(scope="module")
def word_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A full-softmax run over the slice's words, as a reference."""
    run_dir = tmp_path_factory.mktemp("runs") / "words"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", run_dir, *small,
                         "--max-tokens", 20 * TOKENS_PER_STEP)
    assert code == 0, err
    return run_dir


def _eval_json(cli, run_dir, split="valid"):
    code, out, err = cli("lm", "eval", run_dir, "--split", split, "--json")
    assert code == 0, err
    return json.loads(out)


def _one_line_error(code, err):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    return lines[0]


def test_bpe_training_stores_the_tokenizer_and_trains_over_its_ids(bpe_run):
    config = json.loads((bpe_run / "config.json").read_text())
    assert config["data"]["tokenizer"] == "bpe:400"
    tokenizer = json.loads((bpe_run / "tokenizer.json").read_text())
    vocab = json.loads((bpe_run / "vocab.json").read_text())
    assert tokenizer["model"]["type"] == "BPE" and tokenizer["pre_tokenizer"]["type"] == "ByteLevel"
    assert len(vocab["itos"]) == len(tokenizer["model"]["vocab"]) <= 400
    assert {"Ġthe", "<unk>"} <= set(vocab["itos"][:10])  # frequency order: among the most frequent
    assert all(a >= b for a, b in zip(vocab["counts"], vocab["counts"][1:]))
    evals = [r for r in read_metrics(bpe_run / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [30, 60] and evals[-1]["ppl"] < evals[0]["ppl"] < 400


def test_a_tokenizer_file_is_reused_with_the_same_ids(bpe_run, ptb_slice, small, cli, tmp_path):
    run_dir = tmp_path / "reuse"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", bpe_run / "tokenizer.json",
                         "--head", "full", "--run-dir", run_dir, *small, "--max-tokens", 10 * TOKENS_PER_STEP)
    assert code == 0, err
    assert (run_dir / "vocab.json").read_text() == (bpe_run / "vocab.json").read_text()
    assert (run_dir / "tokenizer.json").read_text() == (bpe_run / "tokenizer.json").read_text()
    assert json.loads((run_dir / "config.json").read_text())["data"]["tokenizer"] == str(bpe_run / "tokenizer.json")
    assert _eval_json(cli, run_dir)["signature"]["corpus"] == _eval_json(cli, bpe_run)["signature"]["corpus"]


def test_eval_reports_per_token_per_word_and_bits_per_byte_consistently(bpe_run, ptb_slice, cli):
    words = load_corpus(ptb_slice)  # the word-level reading of the same text: its words and bytes
    for split in ("valid", "test"):
        result = _eval_json(cli, bpe_run, split)
        assert result["subwords"] is True
        assert result["words"] == words.words[split] == getattr(words, split).numel()  # <eos> per line counted
        assert result["text_bytes"] == words.text_bytes[split]
        assert result["split_tokens"] > result["words"] and result["tokens"] <= result["split_tokens"]
        loss = result["nll_nats"] * result["split_tokens"]  # nats over the whole split
        assert math.isclose(result["ppl_word"], math.exp(loss / result["words"]), rel_tol=1e-9)
        assert math.isclose(result["bits_per_byte"], loss / math.log(2) / result["text_bytes"], rel_tol=1e-9)
        assert math.isclose(result["ppl"], math.exp(result["nll_nats"]), rel_tol=1e-9)
        assert result["ppl_word"] > result["ppl"]  # a word takes more than one token
    code, out, err = cli("lm", "eval", bpe_run)
    assert code == 0, err
    for label in ("ppl per token", "ppl per word", "bits per byte", "cluster ppl", "subword tokens"):
        assert label in out, label


def test_dev_records_of_a_subword_run_carry_per_word_and_per_byte_figures(bpe_run, word_run, cli):
    """metrics.jsonl's dev records compare across tokenizers too: the last one is the final model's, which
    ``lm eval --checkpoint last`` scores the same; a word run's records keep perplexity alone."""
    evals = [r for r in read_metrics(bpe_run / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and all(r["ppl_word"] > r["ppl"] > 1 and r["bits_per_byte"] > 0 for r in evals)
    code, out, err = cli("lm", "eval", bpe_run, "--checkpoint", "last", "--json")
    assert code == 0, err
    last = json.loads(out)
    assert math.isclose(evals[-1]["ppl_word"], last["ppl_word"], rel_tol=1e-6)
    assert math.isclose(evals[-1]["bits_per_byte"], last["bits_per_byte"], rel_tol=1e-6)
    assert not any("ppl_word" in r for r in read_metrics(word_run / "metrics.jsonl") if r["kind"] == "eval")


def test_a_word_run_also_reports_bits_per_byte_on_the_same_bytes(word_run, bpe_run, cli):
    words, subwords = _eval_json(cli, word_run), _eval_json(cli, bpe_run)
    assert words["subwords"] is False and words["split_tokens"] == words["words"]
    assert math.isclose(words["ppl_word"], words["ppl"], rel_tol=1e-9)
    assert words["text_bytes"] == subwords["text_bytes"] and words["words"] == subwords["words"]
    assert math.isclose(words["bits_per_byte"], words["nll_nats"] * words["words"] / math.log(2) / words["text_bytes"],
                        rel_tol=1e-9)
    code, out, err = cli("lm", "eval", word_run)
    assert code == 0 and "bits per byte" in out and "ppl per word" not in out, err


def test_generate_writes_text_not_subwords(bpe_run, cli):
    code, out, err = cli("lm", "generate", bpe_run, "--prompt", "the company said", "--length", 40, "--seed", 3)
    assert code == 0, err
    assert out.startswith("the company said") and "Ġ" not in out and "Ċ" not in out
    again = cli("lm", "generate", bpe_run, "--prompt", "the company said", "--length", 40, "--seed", 3)[1]
    assert again == out
    code, out, err = cli("lm", "generate", bpe_run, "--prompt", "", "--length", 20, "--greedy")
    assert code == 0 and out.strip() and "Ġ" not in out, err


def test_resume_reads_the_stored_tokenizer_and_never_trains_one(bpe_run, tmp_path, cli, monkeypatch):
    import shutil

    run_dir = tmp_path / "resumed"
    shutil.copytree(bpe_run, run_dir)

    def refuse(*args, **kwargs):
        raise AssertionError("a resumed run trained a tokenizer")

    monkeypatch.setattr(sohsm.data.loading, "_trained_bpe", refuse)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 70 * TOKENS_PER_STEP,
                         "--quiet")
    assert code == 0, err
    assert max(r["tokens"] for r in read_metrics(run_dir / "metrics.jsonl")) == 70 * TOKENS_PER_STEP
    # another tokenizer in its place is another vocabulary: refused
    (run_dir / "tokenizer.json").unlink()
    line = _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens",
                                80 * TOKENS_PER_STEP)[::2])
    assert "has no tokenizer.json" in line
    line = _one_line_error(*cli("lm", "eval", run_dir)[::2])
    assert "has no tokenizer.json" in line


def test_clusters_show_prints_subwords_as_text(bpe_run, cli):
    code, out, err = cli("clusters", "show", bpe_run, "--top", 3)
    assert code == 0, err
    assert "subwords" in out.splitlines()[0] and '" the"' in out.splitlines()[0] and "Ġ" not in out
    assert out.splitlines()[1].endswith("most frequent subwords") and "words" not in out.splitlines()[1].split()
    rows = out.splitlines()[2:]
    assert len(rows) == 3 and all('"' in row for row in rows)
    code, out, err = cli("clusters", "show", bpe_run, "--word", "the")
    assert code == 0 and '" the"' in out, err
    code, out, err = cli("clusters", "show", bpe_run, "--word", "Ġthe")
    assert code == 0 and '" the"' in out, err


def test_compare_and_plot_work_over_subwords(ptb_slice, small, cli, tmp_path, bpe_run):
    out = tmp_path / "heads"
    code, stdout, err = cli("lm", "compare", "--corpus", ptb_slice, "--tokenizer", "bpe:400", "--out", out,
                            "--heads", "full,self_organized", *small, "--max-tokens", 20 * TOKENS_PER_STEP,
                            "--eval-every", 10)
    assert code == 0, err
    for name in ("full", "self_organized"):
        assert (out / name / "tokenizer.json").read_text() == (bpe_run / "tokenizer.json").read_text()  # cached BPE
    assert "Ġ" not in (out / "clusters.md").read_text() and '" the"' in (out / "clusters.md").read_text()
    code, stdout, err = cli("plot", bpe_run, "-o", tmp_path / "figure.png")
    assert code == 0, err
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("value, message", [
    ("bpe:100", "--tokenizer bpe:100: SIZE must be an integer >= 258"),
    ("bpe:many", "--tokenizer bpe:many: SIZE must be an integer >= 258"),
    ("no-such-tokenizer.json", "is neither bpe:SIZE"),
])
def test_bad_tokenizer_values_exit_2_with_one_line(value, message, ptb_slice, small, cli, tmp_path):
    line = _one_line_error(*cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", value, "--head", "full",
                                "--run-dir", tmp_path / "run", *small)[::2])
    assert message in line
    assert not (tmp_path / "run").exists()


def test_a_word_cut_beside_a_tokenizer_is_refused(ptb_slice, small, cli, tmp_path):
    line = _one_line_error(*cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "bpe:300", "--min-count", 2,
                                "--head", "full", "--run-dir", tmp_path / "run", *small)[::2])
    assert "--min-count cuts rare words" in line


def test_without_tokenizers_the_message_says_what_to_install(ptb_slice, small, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers raises ImportError
    line = _one_line_error(*cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "bpe:300", "--head", "full",
                                "--run-dir", tmp_path / "run", *small)[::2])
    assert "pip install 'sohsm[hf]'" in line


def test_a_bpe_that_learns_fewer_tokens_than_asked_says_so(ptb_slice, small, cli, tmp_path, one_thread):
    """A training split too small for the size asked gives fewer tokens: the start line says how many of how many."""
    loud = [option for option in small if option != "--quiet"]
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--tokenizer", "bpe:60000", "--head", "full",
                       "--run-dir", tmp_path / "run", *loud, "--max-tokens", TOKENS_PER_STEP)
    assert code == 0, err
    size = len(json.loads((tmp_path / "run" / "vocab.json").read_text())["itos"])
    assert size < 60000 and f"{size:,} subwords of the 60,000 asked (the training split has no more pairs to " \
                                "merge)" in err.splitlines()[0], err
