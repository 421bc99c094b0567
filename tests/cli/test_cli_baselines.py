"""The baseline heads through `sohsm lm train / eval / generate` on a slice of real PTB text."""
from __future__ import annotations

import json
import math
import shlex

import pytest
import torch

from sohsm.clustering import load_tree, tree_paths
from sohsm.heads import build_head
from sohsm.train import read_metrics

TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10
OBJECTIVES = {"adaptive": "nll", "dsoftmax": "nll", "tree_huffman": "nll", "tree_random": "nll",
              "importance_sampling": "importance_sampling", "nce": "nce", "pmi": "negative_sampling"}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_baseline_trains_and_evaluates(name, tmp_path, ptb_slice, small, cli, one_thread):
    run_dir = tmp_path / name
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", name, "--run-dir", run_dir, *small,
                         "--max-tokens", 4 * TOKENS_PER_STEP, "--log-every", 2, "--eval-every", 4)
    assert code == 0, err
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [2, 4]
    for r in train:
        if OBJECTIVES[name] == "nll":
            assert math.isclose(r["ppl"], math.exp(r["nll_nats"])) and "objective" not in r
        else:  # an objective is labelled as one, never as a perplexity
            assert r["objective"] == OBJECTIVES[name] and math.isfinite(r["loss"])
            assert "ppl" not in r and "nll_nats" not in r
    (evaluation,) = [r for r in records if r["kind"] == "eval"]
    vocab_size = len(json.loads((run_dir / "vocab.json").read_text())["itos"])
    assert math.isfinite(evaluation["ppl"]) and 1 < evaluation["ppl"] < 2 * vocab_size
    code, out, err = cli("lm", "eval", run_dir, "--split", "test")
    assert code == 0, err
    assert "ppl" in out


def test_sampled_head_resumes_exactly(tmp_path, ptb_slice, small, cli, one_thread):
    """6 steps straight == 3 steps + resume: the noise generator is in the checkpoint."""
    common = ["--corpus", ptb_slice, *small, "--head", "nce", "--log-every", 1, "--eval-every", 0]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("lm", "train", "--run-dir", straight, *common, "--max-tokens", 6 * TOKENS_PER_STEP)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, *common, "--max-tokens", 3 * TOKENS_PER_STEP)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet", "--max-tokens", 6 * TOKENS_PER_STEP)[0] == 0

    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")
                if r["kind"] == "train" and not r.get("partial")]

    expected, got = losses(straight), losses(resumed)
    assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, 7))
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6


def test_tree_head_generates_greedily(tmp_path, ptb_slice, small, cli, one_thread):
    run_dir = tmp_path / "tree"
    assert cli("lm", "train", "--corpus", ptb_slice, "--head", "tree_huffman", "--run-dir", run_dir, *small,
               "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    code, out, err = cli("lm", "generate", run_dir, "--prompt", "the company", "--length", 5, "--greedy")
    assert code == 0, err
    assert len(out.split()) >= 5


def test_tree_build_writes_a_bootstrapped_tree(tmp_path, ptb_slice, small, cli, one_thread):
    run_dir, output = tmp_path / "tree-random", tmp_path / "trees" / "bootstrap.pt"
    assert cli("lm", "train", "--corpus", ptb_slice, "--head", "tree_random", "--run-dir", run_dir, *small,
               "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    code, out, err = cli("tree", "build", run_dir, "--output", output, "--variant", "balanced", "--max-tokens", 5000)
    assert code == 0, err
    assert str(output) in out and "balanced tree" in out and "tree_file" in out
    vocab_size = len(json.loads((run_dir / "vocab.json").read_text())["itos"])
    children, meta = load_tree(output, vocab_size)
    assert meta["kind"] == "bootstrap" and meta["variant"] == "balanced" and meta["source_step"] == 2
    lengths = tree_paths(children).lengths
    assert int(lengths.max()) - int(lengths.min()) <= 1
    head = build_head("tree_file", 32, vocab_size, path=str(output))
    assert torch.equal(head.tree, children)
    (command,) = [shlex.split(line.partition(":")[2]) for line in out.splitlines() if line.startswith("train with it:")]
    argv = [tmp_path / "tree-file" if word == "RUN_DIR" else word for word in command[1:]]  # as printed, but sohsm
    code, _, err = cli(*argv, *small, "--max-tokens", 2 * TOKENS_PER_STEP)
    assert code == 0, err
    assert json.loads((tmp_path / "tree-file" / "config.json").read_text())["head"]["options"] == {"path": str(output)}
    code, _, err = cli("tree", "build", run_dir, "--output", output)  # never overwrites
    assert code == 2 and "exists" in err
    code, _, err = cli("tree", "build", tmp_path / "no-run", "--output", tmp_path / "x.pt")
    assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["tree_huffman", "nce"])
@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_row_sparse_heads_train_under_clipping(name, tmp_path, ptb_slice, small, cli, one_thread):
    """--head-option sparse=true: row-sparse gradients go through the loop's clipping and Adagrad."""
    run_dir = tmp_path / name
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", name, "--head-option", "sparse=true",
                         "--run-dir", run_dir, *small, "--max-tokens", 4 * TOKENS_PER_STEP, "--clip", 0.1)
    assert code == 0, err
    (evaluation,) = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert math.isfinite(evaluation["ppl"])
