"""`sohsm lm train` head options and start-up lines, on a slice of real PTB text."""
from __future__ import annotations

import json
import re

import pytest
import torch

import sohsm.tasks.lm.progress as lm_progress
import sohsm.train.progress as progress
from sohsm.cli.train_options import parse_head_option, parse_option_list
from sohsm.heads import build_head
from sohsm.tasks.lm import LMConfig as TrainConfig
from sohsm.train import load_run, read_metrics

TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10


def _one_line_error(code, err):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("text, expected", [
    ("gamma=2", ("gamma", 2)), ("gamma=1.5", ("gamma", 1.5)), ("projection=true", ("projection", True)),
    ("n_clusters=null", ("n_clusters", None)), ("init=frequency", ("init", "frequency")),
    ('init="frequency"', ("init", "frequency")), ("smoothing=a=b", ("smoothing", "a=b")), ("seed=", ("seed", "")),
])
def test_head_option_values_are_json_where_they_can_be(text, expected):
    assert parse_head_option(text) == expected


def test_option_lists_and_malformed_options():
    assert parse_option_list("update_every=20,gamma=2") == {"update_every": 20, "gamma": 2}
    assert parse_option_list("") == {}
    for bad in ("gamma", "=2", "2x=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_head_option(bad)
    with pytest.raises(ValueError, match="given twice"):
        parse_option_list("gamma=1,gamma=2")


def test_head_options_reach_the_head(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir, *small,
                       "--head-option", "gamma=2", "--head-option", "init=frequency",
                       "--head-option", "update_every=5", "--max-tokens", 10 * TOKENS_PER_STEP)
    assert code == 0, err
    head = json.loads((run_dir / "config.json").read_text())["head"]
    assert head == {"name": "self_organized", "update_every": 5, "options": {"gamma": 2, "init": "frequency"}}
    run = load_run(run_dir, "last")
    assert run.head.reclustering.gamma == 2.0 and run.head.update_every == 5 and len(run.head.history) == 2


@pytest.mark.parametrize("head, options, message", [
    ("full", ["--head-option", "gamma=2"], "head 'full' has no option 'gamma'; its options: bias"),
    ("two_level_frequency", ["--update-every", 10],
     "--update-every (10) means nothing for head 'two_level_frequency'"),
    ("self_organized", ["--head-option", "gamma=abc"], "head 'self_organized': option gamma must be float, got 'abc'"),
    ("self_organized", ["--head-option", "gamma=-1"], "head 'self_organized': gamma must be positive, got -1"),
    ("self_organized", ["--head-option", "init=lexical"], "init must be 'random' or 'frequency'"),
    ("self_organized", ["--head-option", "gamma"], "--head-option: expected KEY=VALUE"),
    ("self_organized", ["--update-every", 5, "--head-option", "update_every=6"], "disagree"),
])
def test_a_wrong_head_option_is_one_line_before_the_run_directory_exists(tmp_path, ptb_slice, small, cli, head,
                                                                         options, message):
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", head, "--run-dir", tmp_path / "run", *small,
                       *options)
    assert message in _one_line_error(code, err)
    assert not (tmp_path / "run").exists()


def test_start_up_lines_and_the_estimate(tmp_path, ptb_slice, small, cli, monkeypatch):
    postfixes = []
    set_postfix = progress._EstimatingBar.set_postfix
    monkeypatch.setattr(progress._EstimatingBar, "set_postfix",
                        lambda self, *a, **k: postfixes.append(k) or set_postfix(self, *a, **k))
    monkeypatch.setattr(progress, "LOSS_REFRESH_S", 1e9)  # between records only the records' losses, here
    loud = [option for option in small if option != "--quiet"]
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir, *loud,
                       "--max-tokens", 30 * TOKENS_PER_STEP, "--log-every", 10, "--eval-every", 0)
    assert code == 0, err
    lines = err.splitlines()
    first = next(line for line in lines if "train tokens" in line)
    for text in (f"{ptb_slice.name}: ", " words, ", "LSTM 1×32/32, tied |", "head self_organized: ", " parameters, ",
                 " clusters, K ", "(auto, ≈8 per epoch)", "| cpu"):
        assert text in first, text
    assert f"plan: {30 * TOKENS_PER_STEP:,} tokens (max_tokens;" in err
    assert any(line.startswith("≈ ") and f"for {30 * TOKENS_PER_STEP:,} tokens at " in line for line in lines)
    # no line of spaces in a log: a line written beside the bar ends the bar's line (stderr is no terminal here)
    assert not [part for part in re.split(r"[\r\n]", err) if part and not part.strip()]
    # the bar shows the loss from the first step: the steps' so far after steps 1, 2, 4 and 8, then each train
    # record's (the interval's mean)
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    early, from_records = postfixes[:4], postfixes[4:]
    assert all(float(p["loss"]) > 0 and float(p["ppl"]) > 1 for p in early)
    assert [float(p["ppl"]) for p in from_records] == pytest.approx([round(r["ppl"], 1) for r in records], abs=0.051)
    assert len(from_records) == len(records) == 3


@pytest.mark.parametrize("overrides, said", [
    ({"head.name": "self_organized"}, "tied"),
    ({"head.name": "self_organized", "model.emb_size": 32, "model.hidden_size": 64},
     "untied (emb_size 32 != hidden_size 64; equal sizes tie)"),
    ({"head.name": "tree"}, "untied (head tree cannot be tied: it has no word vectors"),
    ({"head.name": "full", "model.tie_weights": False}, "untied (tie_weights false)"),
])
def test_the_start_up_lines_say_whether_the_head_is_tied_and_why_not(overrides, said):
    """A new run ties where it can; one untied by its sizes or its head says so, not silently."""
    assert lm_progress.describe_tying(TrainConfig.from_overrides(overrides)).startswith(said)


def test_the_announced_k_is_the_one_the_head_chooses():
    counts = torch.randint(1, 50, (300,))
    config = TrainConfig(batch_size=4, bptt=5)
    head = build_head("self_organized", 8, 300, counts=counts, reclusters_per_epoch=3)
    described = lm_progress.describe_k(head, config)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)  # attach holds it weakly: keep it alive
    head.attach(optimizer)
    head(torch.randn(config.batch_size * config.bptt, 8), torch.randint(0, 300, (config.batch_size * config.bptt,)))
    assert described == f"K {head.update_every} (auto, ≈3 per epoch)"
    assert head.update_every == max(1, round(float(counts.sum()) / 20 / 3))
    assert lm_progress.describe_k(build_head("full", 8, 300), config) is None
