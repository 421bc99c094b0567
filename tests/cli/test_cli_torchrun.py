"""`torchrun --nproc-per-node 2 -m sohsm lm train`: two CPU processes (gloo) train as one process would.

With the same global batch (each rank reads half of the columns) and no dropout, the
two-process run takes the same steps as the one-process run: DDP averages the ranks'
gradients, which is the gradient of the whole batch; the self-organized head folds
both ranks' targets into its statistics and re-clusters identically; evaluation adds
the ranks' sums. Losses and weights agree to float tolerance.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sohsm
from sohsm.train import read_metrics
from sohsm.train.distributed import Ranks

#: 16 columns (8 per rank), 5 rows a window; re-clustering every 2 steps; evaluation every 3 in 4 columns
OPTIONS = ["--emb-size", "16", "--hidden-size", "16", "--batch-size", "16", "--bptt", "5", "--quiet",
           "--head", "self_organized", "--update-every", "2", "--eval-every", "3", "--eval-batch-size", "5",
           "--log-every", "1", "--checkpoint-every", "0", "--dropout", "0"]
TOKENS_PER_STEP = 16 * 5


def torchrun(nproc: int, *argv) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node NPROC -m sohsm ARGV`` in fresh processes that import this checkout."""
    src = str(Path(sohsm.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "sohsm", *map(str, argv)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "last.pt", weights_only=True)


def _assert_same_run(one: Path, two: Path) -> None:
    a, b = _final(one), _final(two)
    assert a["step"] == b["step"] and a["tokens"] == b["tokens"]
    for part in ("model", "head"):
        for key, value in a[part].items():
            if isinstance(value, torch.Tensor):
                if value.is_floating_point():
                    torch.testing.assert_close(b[part][key], value, rtol=1e-4, atol=1e-5, msg=f"{part}.{key}")
                else:
                    assert torch.equal(b[part][key], value), f"{part}.{key}"
    torch.testing.assert_close(b["position"]["state"][0], a["position"]["state"][0], rtol=1e-4, atol=1e-5)
    records = [read_metrics(run / "metrics.jsonl") for run in (one, two)]
    for kind in ("train", "eval"):  # (the interrupted run also evaluated where its first session ended)
        losses = [{r["step"]: (r["nll_nats"], r.get("eval_tokens")) for r in rs if r["kind"] == kind and
                   not r.get("partial")} for rs in records]
        assert losses[0] and set(losses[0]) <= set(losses[1])
        for step, (nll, tokens) in losses[0].items():
            assert losses[1][step][0] == pytest.approx(nll, rel=1e-5), (kind, step)
            assert losses[1][step][1] == tokens  # the ranks' shares of the dev columns add up to all of them
    reclusterings = [[r["change_rate"] for r in rs if r["kind"] == "recluster"] for rs in records]
    assert len(reclusterings[0]) >= 2 and reclusterings[0] == reclusterings[1]


def test_two_processes_train_as_one_and_resume(tmp_path, ptb_slice, cli):
    common = ["--corpus", ptb_slice, *OPTIONS]
    one, two = tmp_path / "one", tmp_path / "two"
    code, _, err = cli("lm", "train", "--run-dir", one, *common, "--max-tokens", 6 * TOKENS_PER_STEP)
    assert code == 0, err

    done = torchrun(2, "lm", "train", "--run-dir", two, *common, "--max-tokens", 4 * TOKENS_PER_STEP)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("stopped ") == 1  # rank 0 speaks for both
    assert _final(two)["world_size"] == 2 and len(_final(two)["rng_ranks"]) == 2
    steps = [r["step"] for r in read_metrics(two / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # rank 0 alone writes

    # one process cannot take over two processes' run
    code, _, err = cli("lm", "train", "--run-dir", two, "--resume", "--max-tokens", 6 * TOKENS_PER_STEP)
    assert code != 0 and "trained by 2 process(es)" in err and len(err.strip().splitlines()) == 1

    done = torchrun(2, "lm", "train", "--run-dir", two, "--resume", "--quiet", "--max-tokens", 6 * TOKENS_PER_STEP)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_same_run(one, two)


# -- the parts that need no second process ------------------------------------------------------
def test_ranks_share_columns_in_contiguous_parts_that_cover_them_once():
    for world in (1, 2, 3, 5):
        for size in (world, 7, 16, 33):
            parts = [Ranks(rank, world).share(size) for rank in range(world)]
            covered = [i for part in parts for i in range(size)[part]]
            assert covered == list(range(size))
            assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1


def test_a_batch_that_does_not_divide_among_the_processes_is_refused(ptb_slice):
    from sohsm.tasks.lm import LMConfig as TrainConfig, LMTask
    from sohsm.train import apply_overrides

    config = apply_overrides(TrainConfig(), {"data.corpus": str(ptb_slice), "batch_size": 10, "eval_batch_size": 4,
                                             "model.emb_size": 8, "model.hidden_size": 8})
    task = LMTask.load(config, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"batch_size \(10\) must be a multiple of the number of processes \(3\)"):
        task.shard(Ranks(0, 3))
    with pytest.raises(ValueError, match=r"eval_batch_size \(4\) must be at least the number of processes \(5\)"):
        task.shard(Ranks(1, 5))
    task.shard(Ranks(1, 2))
    assert task.data.size(1) == 5 and task.tokens_per_epoch == task.epoch_length * 10


def test_sigterm_to_torchrun_stops_both_ranks_after_the_same_step_with_a_checkpoint(tmp_path, ptb_slice):
    """torchrun passes SIGTERM on to its workers; they agree to stop, rank 0 saves, and all exit."""
    run_dir = tmp_path / "run"
    src = str(Path(sohsm.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "sohsm",
               "lm", "train", "--run-dir", str(run_dir), "--corpus", str(ptb_slice), *OPTIONS, "--epochs", "50"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(r["kind"] == "train" and r["step"] >= 5 for r in _records(run_dir)):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert out.count("stopped     interrupted (SIGTERM)") == 1, err[-3000:]
    checkpoint = _final(run_dir)
    steps = [r["step"] for r in _records(run_dir) if r["kind"] == "train"]
    assert checkpoint["world_size"] == 2 and checkpoint["step"] == steps[-1] >= 5


def _records(run_dir: Path) -> list[dict]:
    try:
        return read_metrics(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        return []
