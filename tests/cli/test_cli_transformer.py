"""`sohsm lm train --model transformer` end to end on a slice of real PTB text, and every run tool on its runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sohsm
import sohsm.train.session as session  # the session calls evaluate
from sohsm.train import read_metrics
from sohsm.train.schedule import schedule_factor

#: a transformer of 2 blocks of width 32 with 4 heads, beside the `small` fixture's sizes (batch 16, BPTT 10)
TRANSFORMER = ["--model", "transformer", "--layers", "2", "--attention-heads", "4"]
TOKENS_PER_STEP = 16 * 10


def _train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train" and not r.get("partial")]


@pytest.fixture(scope="module")
def transformer_run(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A self-organized transformer run of 80 steps: 10 warm-up steps, then the cosine; re-clustering every 20."""
    run_dir = tmp_path_factory.mktemp("runs") / "transformer"
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir,
                         *small, *TRANSFORMER, "--max-tokens", 80 * TOKENS_PER_STEP, "--eval-every", 40,
                         "--warmup", 10, "--update-every", 20, "--log-every", 5, "--dropout", 0.1)
    assert code == 0, err
    return run_dir


def test_a_transformer_run_learns_with_the_transformer_recipe(transformer_run):
    config = json.loads((transformer_run / "config.json").read_text())
    assert config["model"]["architecture"] == "transformer" and config["model"]["emb_size"] == 32
    assert config["optim"]["optimizer"] == "adamw" and config["optim"]["lr_schedule"] == "cosine"
    assert config["bptt"] == 10 and config["batch_size"] == 16  # the sizes given win over the recipe's
    train = _train_records(transformer_run)
    assert train[-1]["nll_nats"] < train[0]["nll_nats"] - 0.5
    evals = [r for r in read_metrics(transformer_run / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [40, 80] and evals[-1]["ppl"] < evals[0]["ppl"]
    assert sum(r["kind"] == "recluster" for r in read_metrics(transformer_run / "metrics.jsonl")) == 4
    checkpoint = torch.load(transformer_run / "last.pt", weights_only=True)
    assert checkpoint["position"]["state"] is None  # nothing carried from one window to the next
    assert checkpoint["optimizer"]["param_groups"][0]["fused"] is True  # the CPU fuses AdamW


def test_the_rate_warms_up_then_follows_the_cosine(transformer_run):
    """The rate a train record shows is the one of the interval's last step (80 planned steps, warm-up 10)."""
    for record in _train_records(transformer_run):
        expected = 1e-3 * schedule_factor("cosine", record["step"] - 1, 10, 80)
        assert record["lr"] == pytest.approx(expected, rel=1e-9), record["step"]
    assert _train_records(transformer_run)[-1]["lr"] == pytest.approx(1e-4)


def test_eval_generate_clusters_and_plot_take_a_transformer_run(transformer_run, cli, tmp_path):
    code, out, err = cli("lm", "eval", transformer_run, "--split", "test", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["ppl"] == pytest.approx(result["ppl_cluster"] * result["ppl_in_cluster"], rel=1e-6)
    texts = [cli("lm", "generate", transformer_run, "--prompt", "the company said", "--length", 15, "--seed", 3)
             for _ in range(2)]
    assert texts[0][0] == 0 and texts[0][1] == texts[1][1] and len(texts[0][1].split()) >= 10
    code, out, err = cli("clusters", "show", transformer_run, "--top", 3)
    assert code == 0 and "most frequent words" in out, err
    code, out, err = cli("plot", transformer_run, "-o", tmp_path / "figure.png")
    assert code == 0 and (tmp_path / "figure.png").stat().st_size > 0, err


def test_resume_continues_a_transformer_run_exactly(tmp_path, ptb_slice, small, cli, monkeypatch):
    """24 steps straight == interrupted at step 10 (Ctrl-C) + resume: the same losses and rates (warm-up, cosine,
    dropout masks) and weights."""
    common = ["--corpus", ptb_slice, "--head", "self_organized", *small, *TRANSFORMER, "--warmup", 5,
              "--update-every", 7, "--dropout", 0.1, "--log-every", 1, "--eval-every", 10,
              "--max-tokens", 24 * TOKENS_PER_STEP]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("lm", "train", "--run-dir", straight, *common)[0] == 0
    evaluate = session.evaluate

    def interrupting_evaluate(*args, **kwargs):  # Ctrl-C during the first evaluation (step 10)
        monkeypatch.setattr(session, "evaluate", evaluate)
        signal.raise_signal(signal.SIGINT)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(session, "evaluate", interrupting_evaluate)
    code, out, err = cli("lm", "train", "--run-dir", resumed, *common)
    assert code == 130 and torch.load(resumed / "last.pt", weights_only=True)["step"] == 10, err
    code, _, err = cli("lm", "train", "--run-dir", resumed, "--resume", "--quiet")
    assert code == 0, err
    expected, got = _train_records(straight), _train_records(resumed)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(1, 25))
    assert max(abs(a["nll_nats"] - b["nll_nats"]) for a, b in zip(expected, got)) <= 1e-6
    assert [r["lr"] for r in got] == [r["lr"] for r in expected]
    a, b = (torch.load(run / "last.pt", weights_only=True) for run in (straight, resumed))
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("head, tied", [
    ("full", True), ("adaptive", True), ("two_level_frequency", True), ("tree_huffman", False),
    ("importance_sampling", False),
])
def test_each_head_family_trains_on_a_transformer(tmp_path, ptb_slice, small, cli, head, tied):
    """Every head trains; by the one default rule those that can be tied are."""
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", head, "--run-dir", tmp_path / "run", *small,
                         *TRANSFORMER, "--max-tokens", 12 * TOKENS_PER_STEP, "--log-every", 4,
                         "--eval-every", 0, "--warmup", 2)
    assert code == 0, err
    records = _train_records(tmp_path / "run")
    loss = "nll_nats" if "nll_nats" in records[0] else "loss"
    assert records[-1][loss] < records[0][loss]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["tie_weights"] is tied
    checkpoint = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    if head == "full":  # tied: the head's word vectors are the embedding
        assert torch.equal(checkpoint["model"]["embedding.weight"], checkpoint["head"]["weight"])
    assert ("embedding.weight" in checkpoint["model"]) is (head == "full" or not tied)


@pytest.mark.parametrize("sizes, message", [
    (["--hidden-size", "30", "--emb-size", "30"], "--hidden-size 30 must be a multiple of --attention-heads 4"),
    (["--hidden-size", "32", "--emb-size", "64"], "a transformer's --emb-size 64 must equal its --hidden-size 32"),
    (["--hidden-size", "28", "--positions", "rotary"], "rotary positions need an even head size"),
])
def test_sizes_a_transformer_cannot_take_are_refused_before_anything_is_written(tmp_path, ptb_slice, cli, sizes,
                                                                                message):
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "run",
                         "--model", "transformer", "--attention-heads", "4", *sizes, "--quiet")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_compare_trains_every_head_on_a_transformer(tmp_path, ptb_slice, small, cli):
    code, out, err = cli("lm", "compare", "--corpus", ptb_slice, "--out", tmp_path / "cmp", "--heads",
                         "full,self_organized", *small, *TRANSFORMER, "--max-tokens", 10 * TOKENS_PER_STEP,
                         "--eval-every", 0)
    assert code == 0, err
    report = (tmp_path / "cmp" / "results.md").read_text()
    assert "transformer 2×32, 4 heads, learned positions, context 10" in report and "cosine decay" in report
    for head in ("full", "self_organized"):
        config = json.loads((tmp_path / "cmp" / head / "config.json").read_text())
        assert config["model"]["architecture"] == "transformer" and config["optim"]["optimizer"] == "adamw"


def test_bf16_and_compile_train_a_transformer_as_float32_does(tmp_path, ptb_slice, small, cli):
    """Autocast bf16 and torch.compile take the transformer through the LSTM's code paths: close to float32, eager."""
    torch._dynamo.reset()
    common = ["--corpus", ptb_slice, "--head", "self_organized", *small, *TRANSFORMER, "--dropout", "0",
              "--max-tokens", 8 * TOKENS_PER_STEP, "--log-every", 2, "--eval-every", 0, "--warmup", 2]
    losses = {}
    for name, extra in (("fp32", []), ("bf16", ["--amp", "bf16"]), ("compiled", ["--compile"])):
        code, _, err = cli("lm", "train", "--run-dir", tmp_path / name, *common, *extra)
        assert code == 0, err
        losses[name] = [r["nll_nats"] for r in _train_records(tmp_path / name)]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02) and losses["bf16"] != losses["fp32"]
    assert losses["compiled"] == pytest.approx(losses["fp32"], rel=1e-4)


def test_two_processes_train_a_transformer_as_one(tmp_path, ptb_slice, small, cli):
    """DDP through torchrun: each rank reads half the columns; losses and weights are those of one process."""
    common = ["--corpus", ptb_slice, "--head", "self_organized", *small, *TRANSFORMER, "--dropout", "0",
              "--update-every", "2", "--eval-every", "3", "--eval-batch-size", "4", "--log-every", "1",
              "--checkpoint-every", "0", "--warmup", "2", "--max-tokens", 5 * TOKENS_PER_STEP]
    one, two = tmp_path / "one", tmp_path / "two"
    code, _, err = cli("lm", "train", "--run-dir", one, *common)
    assert code == 0, err
    src = str(Path(sohsm.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "sohsm", "lm", "train", "--run-dir", str(two), *map(str, common)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [read_metrics(run / "metrics.jsonl") for run in (one, two)]
    for kind in ("train", "eval"):
        a, b = ([(r["step"], r["nll_nats"]) for r in rs if r["kind"] == kind] for rs in records)
        assert a and [s for s, _ in a] == [s for s, _ in b]
        assert [n for _, n in b] == pytest.approx([n for _, n in a], rel=1e-5), kind
    first, second = (torch.load(run / "last.pt", weights_only=True) for run in (one, two))
    assert second["world_size"] == 2
    for key, value in first["model"].items():
        torch.testing.assert_close(second["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_the_guides_settings_file_is_a_transformer_config(tmp_path):
    """The transformer.yaml of docs/training.md is read as it is and makes the model its comments say."""
    import re

    from sohsm.cli.config_file import read_config_file
    from sohsm.tasks.lm import LMConfig

    guide = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    (block,) = re.findall(r"```yaml\n(# transformer.yaml.*?)```", guide, flags=re.S)
    (tmp_path / "transformer.yaml").write_text(block)
    config = LMConfig.from_overrides({**read_config_file(str(tmp_path / "transformer.yaml"), LMConfig),
                                      "data.corpus": "ptb"})
    m, o = config.model, config.optim
    assert (m.architecture, m.layers, m.hidden_size, m.attention_heads, config.bptt) == ("transformer", 4, 256, 4, 128)
    assert (o.optimizer, o.lr_schedule, o.warmup, o.weight_decay, o.clip) == ("adamw", "cosine", 100, 0.1, 1.0)
