"""benchmarks/step_ops.py on a small model: it counts the ops of ordinary steps, by stage, and the sync-free path's
statistics waiting to be folded cut the self-organized head's count (the count is exact: no timing here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from needs import need_corpus
from small_run import zipf_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
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


#: ops an ordinary step of each head may issue on the path CUDA takes (Triton's kernels, counted under its
#: interpreter), eager and captured as one graph: the counts of this release (docs/benchmarks/step-ops.md; the
#: self-organized head's fold of q every 16 steps rounded up), held so that an op added to every step fails here,
#: on the CPU. Lower them when a change cuts ops.
TRITON = ["--head-option", "backend=triton"]
NO_RECLUSTERING = ["--update-every", "1000"]  # ordinary steps only (an epoch of the made-up corpus is 125 steps)
BUDGETS = {
    "full": (["--head", "full"], 66, 8),
    "adaptive": (["--head", "adaptive"], 165, 8),
    "default": (["--head", "self_organized", *TRITON, "--head-option", "div_value=4", *NO_RECLUSTERING], 130, 13),
    "every word at d": (["--head", "self_organized", *TRITON, "--head-option", "div_value=null", *NO_RECLUSTERING],
                        102, 13),
    "frequency binning": (["--head", "two_level_frequency", *TRITON], 95, 8),
}


@pytest.fixture(scope="module")
def counts(step_ops, tmp_path_factory):
    """Each head's ops a step on a made-up corpus of 300 words (the count does not depend on the sizes; Triton's
    interpreter is slow on large clusters)."""
    corpus = zipf_corpus(tmp_path_factory.mktemp("zipf"))
    common = ["--corpus", str(corpus), "--emb-size", "16", "--hidden-size", "16",
              "--batch-size", "8", "--bptt", "5", "--eval-every", "0", "--checkpoint-every", "0"]
    return {name: (step_ops.count([*common, *head])[0], step_ops.count([*common, *head], graph=True)[0])
            for name, (head, _, _) in BUDGETS.items()}


@pytest.mark.parametrize("name", list(BUDGETS))
def test_each_head_stays_within_its_op_budget(counts, name):
    eager, graph = counts[name]
    _, eager_budget, graph_budget = BUDGETS[name]
    assert eager <= eager_budget, f"{name}: {eager:.1f} ops an eager step, budget {eager_budget}"
    assert graph <= graph_budget, f"{name}: {graph:.1f} ops a step captured as one graph, budget {graph_budget}"


def test_the_default_issues_no_more_ops_than_adaptive_softmax(counts):
    assert counts["default"][0] <= counts["adaptive"][0]
