"""benchmarks/step_ops.py on a small model: it counts the ops of ordinary steps, by stage, and the sync-free path's
statistics waiting to be folded cut the self-organized head's count (the count is exact: no timing here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from needs import need_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def step_ops():
    spec = importlib.util.spec_from_file_location("step_ops", ROOT / "benchmarks" / "step_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_waiting_statistics_issue_fewer_ops_a_step(step_ops, monkeypatch):
    from sohsm.heads.two_level.self_organizing import device_statistics

    data_dir = need_corpus("ptb")
    args = ["--corpus", "ptb", "--data-dir", str(data_dir), "--emb-size", "16", "--hidden-size", "16",
            "--batch-size", "8", "--bptt", "5", "--eval-every", "0", "--checkpoint-every", "0",
            "--head", "self_organized", "--head-option", "backend=grouped_torch"]
    counts = {}
    for fold in (1, 8):
        monkeypatch.setattr(device_statistics, "FOLD_EVERY", fold)
        counts[fold] = step_ops.count(args)
    (every, every_stages), (waiting, waiting_stages) = counts[1], counts[8]
    assert every == sum(every_stages.values()) and every_stages["backward"] > 0 and every_stages["optimizer"] > 0
    assert every_stages["backward"] == waiting_stages["backward"]  # only the forward's fold changed
    assert waiting < every - 30  # the fold was some sixty ops: at most one in eight steps pays them now
