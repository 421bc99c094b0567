"""`sohsm lm train / eval / generate` end to end on a slice of real PTB text."""
from __future__ import annotations

import json
import math
import shutil
import signal

import pytest
import torch

import sohsm.train.session as loop  # the session calls evaluate
from small_run import run_files
from sohsm.train import read_metrics
from sohsm.train.loading import load_run

TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10


@pytest.fixture(scope="module")
def sohsm_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A self-organized run of 300 steps (re-clustering every 50), evaluated every 100."""
    run_dir = tmp_path_factory.mktemp("runs") / "sohsm"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir,
                         *small, "--max-tokens", 300 * TOKENS_PER_STEP, "--eval-every", 100,
                         "--update-every", 50, "--log-every", 25, "--dropout", 0.1)
    assert code == 0, err
    return run_dir, out


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A full-softmax run of 60 steps with tied weights."""
    run_dir = tmp_path_factory.mktemp("runs") / "full"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", run_dir, *small,
                         "--max-tokens", 60 * TOKENS_PER_STEP, "--eval-every", 30, "--tie-weights")
    assert code == 0, err
    return run_dir


def _train_losses(run_dir):
    return [(r["step"], r["nll_nats"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "train" and not r.get("partial")]


# -- train ------------------------------------------------------------------------------------
def test_train_writes_the_run_directory(sohsm_run):
    run_dir, out = sohsm_run
    for name in ("config.json", "vocab.json", "metrics.jsonl", "last.pt", "best.pt"):
        assert (run_dir / name).is_file(), name
    config = json.loads((run_dir / "config.json").read_text())
    assert config["head"]["name"] == "self_organized" and config["head"]["update_every"] == 50
    # the summary says where everything is and how to use it
    for text in ("metrics.jsonl", "last.pt", "best.pt", "sohsm plot", "sohsm clusters show", "sohsm lm eval",
                 "head:self_organized"):
        assert text in out, text


def test_metrics_records(sohsm_run):
    run_dir, _ = sohsm_run
    records = read_metrics(run_dir / "metrics.jsonl")
    kinds = {r["kind"] for r in records}
    assert kinds == {"train", "eval", "recluster"}
    for r in records:
        assert {"kind", "step", "tokens", "elapsed_s"} <= set(r)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(25, 301, 25))
    assert all(r["tokens"] == r["step"] * TOKENS_PER_STEP for r in train)
    assert all(math.isclose(r["ppl"], math.exp(r["nll_nats"])) and r["tokens_per_s"] > 0 for r in train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [100, 200, 300]
    for r in evals:  # Eq. 5-6: ppl = cluster ppl x in-cluster ppl
        assert math.isclose(r["ppl"], r["ppl_cluster"] * r["ppl_in_cluster"], rel_tol=1e-9)
    assert evals[-1]["ppl"] < evals[0]["ppl"]
    reclusters = [r for r in records if r["kind"] == "recluster"]
    assert [r["step"] for r in reclusters] == [50, 100, 150, 200, 250, 300]
    for r in reclusters:
        assert 0 <= r["change_rate"] <= 1 and 0 <= r["moved_tf_mass"] <= 1 + 1e-9 and r["empty_clusters"] >= 0


def test_checkpoint_contents(sohsm_run):
    run_dir, _ = sohsm_run
    checkpoint = torch.load(run_dir / "last.pt", weights_only=True)
    assert {"model", "head", "optimizer", "config", "vocab", "rng", "position", "step", "tokens", "elapsed_s",
            "signature"} <= set(checkpoint)
    assert checkpoint["step"] == 300 and checkpoint["tokens"] == 300 * TOKENS_PER_STEP
    signature = checkpoint["signature"]
    assert signature["head"] == "self_organized" and signature["K"] == 50 and signature["seed"] == 1
    assert signature["vocab"] == len(checkpoint["vocab"]["itos"]) and signature["clusters"] > 0
    assert "train.txt:" in signature["corpus"] and signature["version"]
    assert checkpoint["position"]["state"] is not None  # the carried LSTM state, mid-epoch
    assert len(checkpoint["head"]["_extra_state"]["history"]) == 6


def test_full_softmax_run_reports_no_cluster_perplexity(full_run):
    evals = [r for r in read_metrics(full_run / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and all(r["ppl_cluster"] is None and r["ppl_in_cluster"] is None for r in evals)
    checkpoint = torch.load(full_run / "last.pt", weights_only=True)
    assert checkpoint["signature"]["clusters"] is None
    assert "head.weight" not in checkpoint["model"]  # tied: the head's weight is the embedding
    assert torch.equal(checkpoint["model"]["embedding.weight"], checkpoint["head"]["weight"])


def test_time_budget_stops_training(tmp_path, ptb_slice, small, cli):
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_frequency", "--run-dir",
                         tmp_path / "run", *small, "--time-budget", 0.3, "--eval-every", 0)
    assert code == 0, err
    assert "time budget spent" in out
    checkpoint = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert 0.3 <= checkpoint["elapsed_s"] < 30 and checkpoint["step"] >= 1


# -- resume -------------------------------------------------------------------------------------
RESUME_OPTIONS = ["--head", "self_organized", "--update-every", 7, "--dropout", 0.3, "--log-every", 1,
                  "--eval-every", 20, "--checkpoint-every", 9]


def test_resume_continues_exactly(tmp_path, ptb_slice, small, cli, monkeypatch):
    """40 steps straight == 20 steps + resume == interrupted at step 20 (Ctrl-C) + resume."""
    n = 40
    straight, budget, interrupted = tmp_path / "straight", tmp_path / "budget", tmp_path / "interrupted"
    common = ["--corpus", ptb_slice, *small, *RESUME_OPTIONS]
    assert cli("lm", "train", "--run-dir", straight, *common, "--max-tokens", n * TOKENS_PER_STEP)[0] == 0

    assert cli("lm", "train", "--run-dir", budget, *common, "--max-tokens", n // 2 * TOKENS_PER_STEP)[0] == 0
    assert torch.load(budget / "last.pt", weights_only=True)["step"] == n // 2
    code, out, err = cli("lm", "train", "--run-dir", budget, "--resume", "--quiet",
                         "--max-tokens", n * TOKENS_PER_STEP)
    assert code == 0, err

    evaluate = loop.evaluate

    def interrupting_evaluate(*args, **kwargs):  # Ctrl-C during the first evaluation (step 20)
        monkeypatch.setattr(loop, "evaluate", evaluate)
        signal.raise_signal(signal.SIGINT)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", interrupting_evaluate)
    code, out, err = cli("lm", "train", "--run-dir", interrupted, *common, "--max-tokens", n * TOKENS_PER_STEP)
    assert code == 130 and "interrupted" in out
    assert torch.load(interrupted / "last.pt", weights_only=True)["step"] == 20
    assert cli("lm", "train", "--run-dir", interrupted, "--resume", "--quiet")[0] == 0

    expected = _train_losses(straight)
    assert [s for s, _ in expected] == list(range(1, n + 1))
    for other in (budget, interrupted):
        got = _train_losses(other)
        assert [s for s, _ in got] == [s for s, _ in expected]
        assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6
        moves = [r["change_rate"] for r in read_metrics(other / "metrics.jsonl") if r["kind"] == "recluster"]
        assert moves == [r["change_rate"] for r in read_metrics(straight / "metrics.jsonl")
                         if r["kind"] == "recluster"]
    a = torch.load(straight / "last.pt", weights_only=True)
    b = torch.load(budget / "last.pt", weights_only=True)
    assert all(torch.equal(a["head"][k], b["head"][k]) for k in a["head"] if isinstance(a["head"][k], torch.Tensor))


def test_tied_self_organized_run_resumes_exactly_and_evaluates(tmp_path, ptb_slice, small, cli):
    """--tie-weights with a self-organized head: the embedding reads the head's rows, across re-clusterings
    and a resume; the checkpoint holds the vectors once; eval and generate build the same tied model."""
    n, straight, resumed = 30, tmp_path / "straight", tmp_path / "resumed"
    common = ["--corpus", ptb_slice, *small, *RESUME_OPTIONS, "--tie-weights"]
    assert cli("lm", "train", "--run-dir", straight, *common, "--max-tokens", n * TOKENS_PER_STEP)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, *common, "--max-tokens", n // 2 * TOKENS_PER_STEP)[0] == 0
    code, _, err = cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet", "--max-tokens", n * TOKENS_PER_STEP)
    assert code == 0, err
    expected, got = _train_losses(straight), _train_losses(resumed)
    assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, n + 1))
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6
    assert len([r for r in read_metrics(straight / "metrics.jsonl") if r["kind"] == "recluster"]) >= 3
    checkpoint = torch.load(straight / "last.pt", weights_only=True)
    assert not any("embedding" in key for key in checkpoint["model"])  # the vectors live in the head alone
    code, out, err = cli("lm", "eval", straight)
    assert code == 0 and "ppl" in out, err
    assert cli("lm", "generate", straight, "--prompt", "the")[0] == 0


def test_tied_adaptive_run_resumes_exactly_and_evaluates(tmp_path, ptb_slice, small, cli):
    """--tie-weights with adaptive softmax (adaptive input): a run resumed half-way equals one run straight; the
    checkpoint holds the vectors once, in the head; eval and generate build the same tied model."""
    n, straight, resumed = 20, tmp_path / "straight", tmp_path / "resumed"
    common = ["--corpus", ptb_slice, *small, "--head", "adaptive", "--head-option", "div_value=2", "--dropout", 0.3,
              "--log-every", 1, "--eval-every", 10, "--checkpoint-every", 7, "--tie-weights"]
    assert cli("lm", "train", "--run-dir", straight, *common, "--max-tokens", n * TOKENS_PER_STEP)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, *common, "--max-tokens", n // 2 * TOKENS_PER_STEP)[0] == 0
    code, _, err = cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet", "--max-tokens", n * TOKENS_PER_STEP)
    assert code == 0, err
    expected, got = _train_losses(straight), _train_losses(resumed)
    assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, n + 1))
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6
    checkpoint = torch.load(straight / "last.pt", weights_only=True)
    assert json.loads((straight / "config.json").read_text())["model"]["tie_weights"] is True
    assert not any("embedding" in key for key in checkpoint["model"])  # the vectors live in the head alone
    resumed_head = torch.load(resumed / "last.pt", weights_only=True)["head"]
    assert all(torch.allclose(checkpoint["head"][k], resumed_head[k], rtol=0, atol=1e-6) for k in checkpoint["head"])
    code, out, err = cli("lm", "eval", straight)
    assert code == 0 and "ppl" in out, err
    assert cli("lm", "generate", straight, "--prompt", "the")[0] == 0


def test_a_banded_run_of_one_widened_weight_evaluates_but_does_not_resume(tmp_path, ptb_slice, small, cli):
    """A checkpoint whose banded head kept one widened ``weight`` (before band weights): eval reads it (each band's
    rows split out of it), a resume is refused with a message naming why, and nothing is written."""
    run = tmp_path / "banded"
    common = ["--corpus", ptb_slice, *small, "--head", "self_organized", "--head-option", "div_value=4",
              "--tie-weights", "--checkpoint-every", 5]
    assert cli("lm", "train", "--run-dir", run, *common, "--max-tokens", 10 * TOKENS_PER_STEP)[0] == 0
    _, before, _ = cli("lm", "eval", run)
    for name in ("best.pt", "last.pt"):  # rewrite the checkpoints as the earlier release wrote them
        checkpoint = torch.load(run / name, weights_only=True)
        head = checkpoint["head"]
        loaded = load_run(run, checkpoint=name.removesuffix(".pt")).head
        widened = loaded.words.matrix(loaded._layout).detach()
        for key in [k for k in head if k.startswith("band_weights.")]:
            del head[key]
        head["weight"] = widened
        torch.save(checkpoint, run / name)
    files = run_files(run)
    code, after, err = cli("lm", "eval", run)
    assert code == 0, err
    assert [line for line in after.splitlines() if line.startswith("ppl")] == \
        [line for line in before.splitlines() if line.startswith("ppl")]
    code, _, err = cli("lm", "train", "--run-dir", run, "--resume", "--quiet", "--max-tokens", 20 * TOKENS_PER_STEP)
    assert code != 0 and "one widened weight" in err
    assert run_files(run) == files


def test_resume_after_a_crash_drops_records_past_the_checkpoint(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    common = ["--corpus", ptb_slice, *small, "--head", "full", "--log-every", 1, "--eval-every", 0,
              "--checkpoint-every", 5]
    assert cli("lm", "train", "--run-dir", run_dir, *common, "--max-tokens", 5 * TOKENS_PER_STEP)[0] == 0
    with open(run_dir / "metrics.jsonl", "a") as handle:  # what a crash after step 5 would leave behind
        handle.write(json.dumps({"kind": "train", "step": 6, "tokens": 0, "elapsed_s": 0, "nll_nats": 99.0}) + "\n")
        handle.write('{"kind": "train", "st')
    assert cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens", 8 * TOKENS_PER_STEP)[0] == 0
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, 9))
    assert all(r["nll_nats"] < 50 for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train")
    # a resume whose budget is already spent takes no step and writes nothing
    before = run_files(run_dir)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet")
    assert code == 0 and "nothing left to train" in out and f"--max-tokens {16 * TOKENS_PER_STEP}" in out
    assert run_files(run_dir) == before


# -- errors ---------------------------------------------------------------------------------------
def _one_line_error(code, err):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("head, options, reason", [
    ("tree_huffman", [], "inner nodes"),
    ("nce", [], "sampled objective"),
    ("self_organized", ["--head-option", "word_dim=16"], "word_dim=16"),
])
def test_tying_a_head_that_cannot_be_tied_is_one_line_before_anything_is_written(tmp_path, ptb_slice, small, cli,
                                                                               head, options, reason):
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", head, *options, "--run-dir", tmp_path / "run",
                       *small, "--tie-weights", "--max-tokens", TOKENS_PER_STEP)
    _one_line_error(code, err)
    assert f"head '{head}' cannot be tied (--tie-weights): " in err and reason in err, err
    assert not (tmp_path / "run").exists()


def test_missing_corpus_is_one_line_and_creates_nothing(tmp_path, small, cli):
    code, out, err = cli("lm", "train", "--corpus", tmp_path / "no-such-text", "--head", "full",
                         "--run-dir", tmp_path / "run", *small)
    assert "no-such-text" in _one_line_error(code, err)
    assert not (tmp_path / "run").exists()


def test_unknown_head_is_refused(tmp_path, ptb_slice, small, cli):
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "no_such_head", "--run-dir", tmp_path, *small)
    assert code == 2 and "invalid choice" in err and "self_organized" in err


def test_new_run_needs_corpus_and_head(tmp_path, ptb_slice, small, cli):
    line = _one_line_error(*cli("lm", "train", "--run-dir", tmp_path / "run", *small)[::2])
    assert "--corpus" in line and "--head" in line


def test_option_a_head_does_not_take(tmp_path, ptb_slice, small, cli):
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--update-every", 10,
                       "--run-dir", tmp_path / "run", *small)
    assert "--update-every (10) means nothing for head 'full'" in _one_line_error(code, err)
    assert not (tmp_path / "run").exists()


def test_compact_statistics_from_the_command_line(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--head-option",
                       "q_clusters=16", "--update-every", 10, "--run-dir", run_dir, *small, "--max-tokens",
                       30 * TOKENS_PER_STEP, "--eval-every", 0)
    assert code == 0, err
    checkpoint = torch.load(run_dir / "last.pt", weights_only=True)
    head = checkpoint["head"]
    assert "q" not in head and head["q_values"].shape[1] == head["q_index"].shape[1] == 16
    assert head["q_index"].dtype == torch.int32 and head["q_rest"].dim() == 1
    assert len(head["_extra_state"]["history"]) == 3
    assert any(r["change_rate"] > 0 for r in head["_extra_state"]["history"])
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--head-option",
                       "q_clusters=0", "--run-dir", tmp_path / "bad", *small)
    assert "q_clusters must be None or an integer in [1," in _one_line_error(code, err)
    assert not (tmp_path / "bad").exists()


def test_unwritable_run_directory(tmp_path, ptb_slice, small, cli):
    (tmp_path / "a-file").write_text("x")
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "a-file" / "run",
                       *small, "--max-tokens", 160)
    assert "cannot write" in _one_line_error(code, err)


def test_existing_run_is_not_overwritten(full_run, ptb_slice, small, cli):
    before = {p.name: p.read_bytes() for p in full_run.iterdir() if p.is_file()}
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", full_run, *small)
    assert "already holds a training run" in _one_line_error(code, err)
    assert {p.name: p.read_bytes() for p in full_run.iterdir() if p.is_file()} == before


def test_resume_refuses_other_head_or_options(full_run, ptb_slice, cli):
    before = (full_run / "last.pt").read_bytes()
    line = _one_line_error(*cli("lm", "train", "--run-dir", full_run, "--resume", "--head", "self_organized")[::2])
    assert "--head is 'full'" in line and "head.name" not in line  # the flag the user typed, not the field
    line = _one_line_error(*cli("lm", "train", "--run-dir", full_run, "--resume", "--hidden-size", "64")[::2])
    assert "--hidden-size is 32" in line and "model.hidden_size" not in line
    assert (full_run / "last.pt").read_bytes() == before


def test_resume_refuses_a_changed_vocabulary(tmp_path, ptb_slice, small, cli):
    corpus = tmp_path / "corpus"
    shutil.copytree(ptb_slice, corpus)
    run_dir = tmp_path / "run"
    assert cli("lm", "train", "--corpus", corpus, "--head", "full", "--run-dir", run_dir, *small,
               "--max-tokens", 5 * TOKENS_PER_STEP)[0] == 0
    with open(corpus / "train.txt", "a") as handle:
        handle.write("zyzzyva quokka xylophonist\n")
    before = (run_dir / "last.pt").read_bytes()
    line = _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 1000)[::2])
    assert "vocabulary" in line
    assert (run_dir / "last.pt").read_bytes() == before


def test_resume_without_a_run(tmp_path, cli):
    line = _one_line_error(*cli("lm", "train", "--run-dir", tmp_path / "nothing", "--resume")[::2])
    assert "no training run" in line


# -- eval ---------------------------------------------------------------------------------------
def test_eval_prints_perplexities(sohsm_run, cli):
    run_dir, _ = sohsm_run
    code, out, err = cli("lm", "eval", run_dir)
    assert code == 0, err
    for text in ("ppl", "cluster ppl", "in-cluster ppl", "tokens/s", "head:self_organized"):
        assert text in out
    best = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"][-1]
    code, out, err = cli("lm", "eval", run_dir, "--json", "--checkpoint", "last")
    result = json.loads(out)
    assert math.isclose(result["ppl"], best["ppl"], rel_tol=1e-6)  # the same checkpoint and data
    assert math.isclose(result["ppl"], result["ppl_cluster"] * result["ppl_in_cluster"], rel_tol=1e-9)
    code, out, err = cli("lm", "eval", run_dir, "--split", "test", "--json")
    assert code == 0 and json.loads(out)["tokens"] > 1000


def test_eval_full_softmax_has_no_cluster_perplexity(full_run, cli):
    code, out, err = cli("lm", "eval", full_run)
    assert code == 0, err
    assert "cluster ppl     n/a" in out
    result = json.loads(cli("lm", "eval", full_run, "--json")[1])
    assert result["ppl_cluster"] is None and result["ppl_in_cluster"] is None


def test_eval_writes_nothing(full_run, cli):
    before = {p.name: p.stat().st_mtime_ns for p in full_run.iterdir()}
    assert cli("lm", "eval", full_run)[0] == 0
    assert {p.name: p.stat().st_mtime_ns for p in full_run.iterdir()} == before


def test_eval_of_a_directory_that_is_no_run(tmp_path, cli):
    assert "no checkpoint" in _one_line_error(*cli("lm", "eval", tmp_path)[::2])


# -- generate -----------------------------------------------------------------------------------
def test_generate_prints_words(sohsm_run, cli):
    run_dir, _ = sohsm_run
    vocab = json.loads((run_dir / "vocab.json").read_text())["itos"]
    code, out, err = cli("lm", "generate", run_dir, "--prompt", "the company said", "--length", 12, "--seed", 3)
    assert code == 0, err
    words = out.split()
    assert words[:3] == ["the", "company", "said"] and 3 < len(words) <= 15  # <eos> prints as a new line
    assert all(w in vocab for w in words)
    assert cli("lm", "generate", run_dir, "--prompt", "the company said", "--length", 12, "--seed", 3)[1] == out
    greedy = cli("lm", "generate", run_dir, "--prompt", "in new york", "--greedy", "--length", 5)
    assert greedy[0] == 0 and greedy[1] == cli("lm", "generate", run_dir, "--prompt", "in new york", "--greedy",
                                               "--length", 5)[1]


def test_generate_notes_unknown_words_and_rejects_bad_temperature(sohsm_run, cli):
    run_dir, _ = sohsm_run
    code, out, err = cli("lm", "generate", run_dir, "--prompt", "the qwxzv", "--length", 3, "--seed", 1)
    assert code == 0 and "qwxzv" in err and "<unk>" in out
    assert "temperature" in _one_line_error(*cli("lm", "generate", run_dir, "--prompt", "the",
                                                 "--temperature", 0)[::2])


def test_a_capitalised_prompt_on_a_lower_case_corpus_is_told_to_lower_case(sohsm_run, cli):
    run_dir = sohsm_run[0]
    code, out, err = cli("lm", "generate", run_dir, "--prompt", "The Company qwxzv", "--length", 3, "--seed", 1)
    assert code == 0
    assert err.strip().endswith("The Company qwxzv; the vocabulary has them in lower case: --prompt "
                                "'the company qwxzv'"), err
    assert "lower case" not in cli("lm", "generate", run_dir, "--prompt", "the qwxzv", "--length", 3)[2]


def test_generate_refuses_a_length_past_its_bound_before_loading_the_run(tmp_path, cli):
    line = _one_line_error(*cli("lm", "generate", tmp_path / "nothing-here", "--prompt", "the",
                                "--length", 100_000_000)[::2])
    assert "length must be an integer in [0, 100000]" in line and "100000000" in line


def test_a_long_generation_shows_a_bar_of_words(sohsm_run, cli):
    run_dir, _ = sohsm_run
    code, out, err = cli("lm", "generate", run_dir, "--prompt", "the", "--length", 1200, "--seed", 1)
    assert code == 0 and "generate" in err and "1200/1200" in err
    assert len(out.split()) > 1000


def test_help_has_runnable_examples(cli):
    for argv in (["lm", "train", "--help"], ["lm", "compare", "--help"], ["lm", "eval", "--help"],
                 ["lm", "generate", "--help"]):
        code, out, _ = cli(*argv)
        assert code == 0 and "examples:" in out and "sohsm lm" in out


def test_auto_k_is_recorded_in_the_signature(tmp_path, ptb_slice, small, cli, private_env, one_thread):
    """With no --update-every the head picks K at its first batch; checkpoints and the summary carry that K."""
    run_dir = tmp_path / "auto-k"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir,
                         *small, "--max-tokens", 20 * TOKENS_PER_STEP)
    assert code == 0, err
    k = torch.load(run_dir / "last.pt", weights_only=False)["signature"]["K"]
    assert isinstance(k, int) and k >= 1
    assert f"K:{k}" in out


# -- learning-rate decay ---------------------------------------------------------------------------
def test_lr_decay_follows_the_epochs_and_resumes_exactly(tmp_path, ptb_slice, small, cli):
    """Rate 1, 1/2, 1/4 in epochs 1-3 (decay 2 after 1 epoch); 1 epoch + resume to 3 == 3 epochs straight."""
    corpus = tmp_path / "tiny"
    corpus.mkdir()
    for split, lines in (("train", 60), ("valid", 10), ("test", 10)):
        text = (ptb_slice / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (corpus / f"{split}.txt").write_text("".join(text), encoding="utf-8")
    common = ["--corpus", corpus, "--head", "full", *small, "--optimizer", "sgd", "--lr", 1, "--lr-decay", 2,
              "--lr-decay-after", 1, "--log-every", 1, "--eval-every", 0, "--warmup", 0]  # the schedule alone
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("lm", "train", "--run-dir", straight, *common, "--epochs", 3)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, *common, "--epochs", 1)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet", "--epochs", 3)[0] == 0
    records = [r for r in read_metrics(straight / "metrics.jsonl") if r["kind"] == "train"]
    rates = {math.ceil(r["epoch"]): r["lr"] for r in records}
    assert rates == {1: 1.0, 2: 0.5, 3: 0.25}
    expected, got = _train_losses(straight), _train_losses(resumed)
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6


def test_lr_decay_below_one_is_refused(tmp_path, ptb_slice, small, cli):
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "run",
                         *small, "--lr-decay", 0.5)
    assert code != 0 and "--lr-decay must be >= 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# -- annealing and the fused step ---------------------------------------------------------------------
def _tiny_corpus(tmp_path, ptb_slice, train_lines=60):
    corpus = tmp_path / "tiny"
    corpus.mkdir()
    for split, lines in (("train", train_lines), ("valid", 10), ("test", 10)):
        text = (ptb_slice / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (corpus / f"{split}.txt").write_text("".join(text), encoding="utf-8")
    return corpus


def test_anneal_divides_the_rate_when_dev_stalls_and_resumes_exactly(tmp_path, ptb_slice, small, cli):
    """SGD at a rate that overfits 60 lines: every stalled evaluation divides the rate by 4; a resume follows."""
    corpus = _tiny_corpus(tmp_path, ptb_slice)
    common = ["--corpus", corpus, "--head", "full", *small, "--optimizer", "sgd", "--lr", 5, "--anneal", 4,
              "--log-every", 1, "--eval-every", 2, "--warmup", 0]  # the annealing alone
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("lm", "train", "--run-dir", straight, *common, "--epochs", 12)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, *common, "--epochs", 5)[0] == 0
    assert cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet", "--epochs", 12)[0] == 0
    records = read_metrics(straight / "metrics.jsonl")
    best, expected_scale = math.inf, 1.0
    scale_after = {}  # the rate each evaluation leaves for the steps after it
    for r in records:
        if r["kind"] == "eval":
            if r["ppl"] < best:
                best = r["ppl"]
            else:
                expected_scale /= 4
            scale_after[r["step"]] = expected_scale
    assert expected_scale < 1.0, "the test needs a run whose dev perplexity stalls"
    train = [r for r in records if r["kind"] == "train"]
    for r in train:
        before = [s for s in scale_after if s < r["step"]]
        scale = scale_after[max(before)] if before else 1.0
        assert math.isclose(r["lr"], 5 * scale), (r["step"], r["lr"], scale)
    expected, got = _train_losses(straight), _train_losses(resumed)
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got)) <= 1e-6


def test_anneal_below_one_is_refused(tmp_path, ptb_slice, small, cli):
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "run",
                         *small, "--anneal", 0.5)
    assert code != 0 and "anneal must be >= 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("head, optimizer", [("self_organized", "adagrad"), ("adaptive", "adam"), ("full", "sgd")])
def test_fused_step_trains_as_the_default_step(tmp_path, ptb_slice, small, cli, head, optimizer):
    """The fused optimizer step (the default) gives the losses of torch's default step, to float32 rounding."""
    corpus = _tiny_corpus(tmp_path, ptb_slice, train_lines=200)
    common = ["--corpus", corpus, "--head", head, *small, "--optimizer", optimizer, "--log-every", 1,
              "--eval-every", 0, "--epochs", 2, "--update-every", 5] if head == "self_organized" else \
             ["--corpus", corpus, "--head", head, *small, "--optimizer", optimizer, "--log-every", 1,
              "--eval-every", 0, "--epochs", 2]
    assert cli("lm", "train", "--run-dir", tmp_path / "fused", *common)[0] == 0
    assert cli("lm", "train", "--run-dir", tmp_path / "plain", *common, "--no-fused")[0] == 0
    fused = torch.load(tmp_path / "fused" / "last.pt", weights_only=False)
    plain = torch.load(tmp_path / "plain" / "last.pt", weights_only=False)
    assert fused["config"]["optim"]["fused"] is True and plain["config"]["optim"]["fused"] is False
    assert fused["optimizer"]["param_groups"][0]["fused"] and not plain["optimizer"]["param_groups"][0]["fused"]
    a, b = _train_losses(tmp_path / "fused"), _train_losses(tmp_path / "plain")
    assert len(a) == len(b) > 20
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) <= 1e-3
    for key, value in plain["model"].items():
        torch.testing.assert_close(fused["model"][key], value, rtol=0, atol=1e-3)


def test_by_default_dev_is_evaluated_four_times_an_epoch(tmp_path, ptb_slice, small, cli, one_thread):
    """An epoch shorter than any fixed interval still draws a curve: every quarter epoch, and at its end."""
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_frequency", "--run-dir", run_dir,
                       *small, "--epochs", 1)
    assert code == 0, err
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in records if r["kind"] == "eval"]
    steps_per_epoch = max(r["step"] for r in records)
    quarter = steps_per_epoch // 4
    assert evals == [quarter, 2 * quarter, 3 * quarter, *([4 * quarter] if 4 * quarter < steps_per_epoch else []),
                     steps_per_epoch]


def test_a_large_vocabulary_gives_a_tied_lstm_s_self_organized_head_bands(tmp_path, ptb_slice, small, cli,
                                                                         monkeypatch):
    """From ``BANDED_FROM_WORDS`` words (lowered here to below the slice's vocabulary) a new tied LSTM run of the
    self-organized head takes ``div_value=4``: written in its config.json, said at the start, built into the head
    and kept on resume. Given ``div_value`` (``null`` too), untied, or over a smaller vocabulary, it takes none."""
    from sohsm.heads.two_level import run_defaults

    monkeypatch.setattr(run_defaults, "BANDED_FROM_WORDS", 50)
    common = ["--corpus", ptb_slice, *small, "--head", "self_organized", "--update-every", 4, "--checkpoint-every", 3,
              "--log-every", 1]
    banded = tmp_path / "banded"
    loud = [arg for arg in common if arg != "--quiet"]  # the start's lines
    code, out, err = cli("lm", "train", "--run-dir", banded, *loud, "--head-option", "gamma=2", "--max-tokens",
                         6 * TOKENS_PER_STEP)
    assert code == 0, err
    config = json.loads((banded / "config.json").read_text())
    assert config["head"]["options"] == {"gamma": 2, "div_value": 4} and config["model"]["tie_weights"] is True
    assert "head option div_value=4: the default for a tied LSTM's self_organized head" in out + err
    head = torch.load(banded / "last.pt", weights_only=True)["head"]
    assert any(key.startswith("band_projections.") for key in head)
    code, out, err = cli("lm", "train", "--run-dir", banded, "--resume", "--head-option", "gamma=2", "--max-tokens",
                         9 * TOKENS_PER_STEP)  # the options it was started with: the one it took is not asked again
    assert code == 0, err
    resumed = json.loads((banded / "config.json").read_text())
    assert resumed["head"] == config["head"] and "head option div_value" not in out + err
    assert [s for s, _ in _train_losses(banded)] == list(range(1, 10))
    line = _one_line_error(*cli("lm", "train", "--run-dir", banded, "--resume", "--head-option", "div_value=null",
                                "--max-tokens", 12 * TOKENS_PER_STEP)[::2])
    assert "div_value" in line and "in the run" in line  # an option it took is kept: asked otherwise, refused

    for name, extra in (("null", ["--head-option", "div_value=null"]), ("untied", ["--no-tie-weights"])):
        assert cli("lm", "train", "--run-dir", tmp_path / name, *common, *extra,
                   "--max-tokens", TOKENS_PER_STEP)[0] == 0
        assert json.loads((tmp_path / name / "config.json").read_text())["head"]["options"].get("div_value") is None
    monkeypatch.setattr(run_defaults, "BANDED_FROM_WORDS", 10**6)
    assert cli("lm", "train", "--run-dir", tmp_path / "small", *common, "--max-tokens", TOKENS_PER_STEP)[0] == 0
    assert json.loads((tmp_path / "small" / "config.json").read_text())["head"]["options"] == {}
