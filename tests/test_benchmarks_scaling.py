"""benchmarks/scaling.py: one cell end to end in its own process at a small vocabulary, and the page from results."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scaling():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "benchmarks" / "scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cell_times_its_steps_and_measures_the_rest(scaling, tmp_path):
    from gpu import write_zipf_corpus

    corpus = write_zipf_corpus(tmp_path / "zipf", 2000, 80_000, seed=0)  # K of a few steps
    out = tmp_path / "cell" / "result.json"
    out.parent.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--cell", "self_organized", "2000",
                           str(corpus), str(out), "--steps", "2", "--step-budget", "1000"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stderr[-2000:]
    row = json.loads(out.read_text())
    assert row["head"] == "self_organized" and row["words"] == 2000 and row["steps"] == 2
    assert row["tokens_per_s"] > 0 and row["peak_rss_bytes"] > 0 and 0 < row["first_step_s"]
    assert row["recluster_s"] >= 0 and row["eval_tokens_per_s"] > 0 and row["top10_ms"] > 0
    assert -20 < row["eval_mean_log_prob"] < 0  # log-probabilities of real targets over 2,000 words


def test_the_page_says_which_targets_were_met(scaling, tmp_path):
    def cell(head, words, rate, **more):
        return {"head": head, "words": words, "tokens_per_s": rate, "steps": 6, "peak_rss_bytes": 2e9,
                "first_step_s": 3.0, "eval_tokens_per_s": 100.0, "top10_ms": 1.0, "commit": "abc1234", **more}

    results = {"self_organized@10000": cell("self_organized", 10_000, 10_000.0, recluster_s=0.1),
               "self_organized@1000000": cell("self_organized", 1_000_000, 6_000.0, recluster_s=7.0),
               "adaptive@1000000": cell("adaptive", 1_000_000, 100.0),
               "full@1000000": {"head": "full", "words": 1_000_000, "not_run": "not run: too large"}}
    page = tmp_path / "scaling.md"
    scaling.report(results, page, "python benchmarks/scaling.py")
    text = page.read_text()
    assert (tmp_path / "scaling.png").exists()
    assert "| 1M | `self_organized` | 6,000 | 6 | 2.00 GB | 3.0 s | 7.00 |" in text
    assert "| 1M | `full` | not run: too large |" in text and "| 33k | `adaptive` | not measured yet |" in text
    assert "| tokens/s at 1M against its own at 10k | 0.60x | >= 0.7x | missed |" in text
    assert "| peak RSS at 1M (GB) | 2.00 | < 3 | met |" in text
    assert "| one re-clustering at 1M (CPU s) | 7.00 | < 5 | missed |" in text
    assert "(`adaptive`) | 60.00x | >= 5x | met |" in text
