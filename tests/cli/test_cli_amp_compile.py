"""`lm train --amp bf16|fp16` and `--compile`: short runs against the float32, eager run."""
from __future__ import annotations

import re

import pytest
import torch

from needs import need_bf16_lstm
from sohsm.train import read_metrics
from sohsm.train.precision import autocast_fails

STEPS = 40
OPTIONS = ["--head", "self_organized", "--emb-size", "32", "--hidden-size", "32", "--batch-size", "16",
           "--dropout", "0",
           "--head-option", "shortlist=0",  # the setting its thresholds were set for
           "--bptt", "10", "--quiet", "--eval-every", "0", "--log-every", "10", "--max-tokens", STEPS * 160]


def _train(cli, run_dir, corpus, *extra, said: list | None = None) -> tuple[list[float], float]:
    options = [o for o in OPTIONS if o != "--quiet" or said is None]
    code, out, err = cli("lm", "train", "--corpus", corpus, "--run-dir", run_dir, *options, *extra)
    assert code == 0, err
    if said is not None:
        said += [out, err]
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r["nll_nats"] for r in records if r["kind"] == "train"]
    (dev,) = [r["nll_nats"] for r in records if r["kind"] == "eval"]
    return train, dev


def test_bf16_run_trains_close_to_float32(tmp_path, ptb_slice, cli):
    need_bf16_lstm()
    train32, dev32 = _train(cli, tmp_path / "fp32", ptb_slice)
    train16, dev16 = _train(cli, tmp_path / "bf16", ptb_slice, "--amp", "bf16")
    assert train16[-1] < train16[0] - 0.5  # it learns
    assert train16 == pytest.approx(train32, rel=0.02)
    assert dev16 == pytest.approx(dev32, rel=0.02)
    assert train16 != train32  # bf16 did change the arithmetic
    assert torch.load(tmp_path / "bf16" / "last.pt", weights_only=True)["config"]["amp"] == "bf16"


def test_fp16_is_refused_where_the_lstm_has_no_fp16_kernel(tmp_path, ptb_slice, cli):
    lstm = torch.nn.LSTM(4, 4)
    failure = autocast_fails("fp16", torch.device("cpu"), lambda: lstm(torch.zeros(1, 1, 4)))
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--run-dir", tmp_path / "run", *OPTIONS,
                         "--amp", "fp16", "--max-tokens", 160)
    if failure is None:  # a torch with a CPU fp16 LSTM: the run trains, with its loss scaler saved
        assert code == 0, err
        assert "scaler" in torch.load(tmp_path / "run" / "last.pt", weights_only=True)
        return
    assert code == 2 and "amp 'fp16' cannot run the LSTM on the cpu" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_compiled_run_matches_the_eager_run(tmp_path, ptb_slice, cli):
    """torch.compile (inductor) of model and head: the same losses and weights as eager, to float tolerance."""
    torch._dynamo.reset()
    short = ["--max-tokens", 10 * 160, "--log-every", 2]
    eager, _ = _train(cli, tmp_path / "eager", ptb_slice, *short)
    said: list[str] = []
    compiled, _ = _train(cli, tmp_path / "compiled", ptb_slice, *short, "--compile", said=said)
    assert compiled == pytest.approx(eager, rel=1e-4)
    a, b = (torch.load(tmp_path / name / "last.pt", weights_only=True) for name in ("eager", "compiled"))
    assert b["config"]["compile"] and not a["config"]["compile"]
    # the start says so; the steps that compiled are not training time (seconds here, 10 tiny steps far less)
    out, err = said
    start = err.splitlines()[0]
    assert "| cpu |" in start and start.endswith("| compiled (--compile; compiling is not counted as training time)")
    compiling = re.search(r" \+ ([\d.]+) s compiling \(--compile; not counted\)$", out, re.MULTILINE)
    assert compiling, out
    compiling = float(compiling[1])
    assert b["elapsed_s"] < compiling, (b["elapsed_s"], out)
    for part in ("model", "head"):
        assert a[part].keys() == b[part].keys()  # the eager modules' names, no compile wrapper
        for key, value in a[part].items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                torch.testing.assert_close(b[part][key], value, rtol=1e-4, atol=1e-5, msg=f"{part}.{key}")


def test_a_bf16_run_resumes_where_it_stopped_and_may_turn_compile_on(tmp_path, ptb_slice, cli):
    """amp is part of the run (kept on resume); compile is speed only (may change on resume)."""
    need_bf16_lstm()
    torch._dynamo.reset()
    straight, _ = _train(cli, tmp_path / "straight", ptb_slice, "--amp", "bf16", "--max-tokens", 20 * 160)
    split = tmp_path / "split"
    _train(cli, split, ptb_slice, "--amp", "bf16", "--max-tokens", 10 * 160)
    code, _, err = cli("lm", "train", "--run-dir", split, "--resume", "--amp", "fp16")
    assert code == 2 and "amp is 'bf16' in the run" in err  # another precision is another run
    code, _, err = cli("lm", "train", "--run-dir", split, "--resume", "--quiet", "--compile", "--max-tokens", 20 * 160)
    assert code == 0, err
    records = read_metrics(split / "metrics.jsonl")
    resumed = [r["nll_nats"] for r in records if r["kind"] == "train" and not r.get("partial")]
    assert resumed == pytest.approx(straight, rel=1e-3)
    assert torch.load(split / "last.pt", weights_only=True)["config"]["compile"] is True
