"""The closing summary of every task's `train` command, on results made by hand: one wording of why a session
stopped, a dev line whenever the run has a best perplexity, only the scores a head has, the session's speed."""
from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path

import pytest

from sohsm.cli import lm, s2s, w2v
from sohsm.train.evaluation import EvalResult
from sohsm.train.session import TrainResult

SUMMARIES = {"lm": lm._print_summary, "s2s": s2s._print_summary, "w2v": w2v._print_summary}


def _result(run_dir: Path, **fields) -> TrainResult:
    (run_dir / "config.json").write_text(json.dumps({"data": {"dataset": "gigaword"}, "batch_words": 1000}))
    defaults = dict(run_dir=run_dir, stopped="max_tokens", step=4, tokens=2000, elapsed_s=2.0, epoch=0.1,
                    best_ppl=None, last_eval=None, signature={"head": "full"}, session_tokens=2000, session_s=2.0)
    defaults.update(fields)
    result = TrainResult(**defaults)
    result.paths = {k: run_dir / f"{k}.x" for k in ("metrics", "last", "best")}
    return result


def _summary(task: str, result: TrainResult) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        SUMMARIES[task](result)
    return out.getvalue()


def _evaluation(ppl: float, clusters: bool) -> EvalResult:
    return EvalResult(nll_nats=1.0, ppl=ppl, ppl_cluster=12.5 if clusters else None,
                      ppl_in_cluster=ppl / 12.5 if clusters else None, tokens=100, seconds=1.0, tokens_per_s=100.0)


@pytest.mark.parametrize("task", SUMMARIES)
@pytest.mark.parametrize("stopped, words", [
    ("done", "all epochs done"), ("time_budget", "time budget spent"), ("interrupted", "interrupted (SIGTERM)")])
def test_every_task_says_why_it_stopped_in_the_same_words(task, stopped, words, tmp_path):
    result = _result(tmp_path, stopped=stopped, stop_signal=signal.SIGTERM if stopped == "interrupted" else None)
    assert _summary(task, result).startswith(f"stopped     {words}: step 4, ")


@pytest.mark.parametrize("task, budget", [("lm", "token"), ("s2s", "token"), ("w2v", "row")])
def test_a_spent_budget_names_what_the_task_counts(task, budget, tmp_path):
    assert _summary(task, _result(tmp_path)).startswith(f"stopped     {budget} budget spent: ")


@pytest.mark.parametrize("task", SUMMARIES)
def test_a_resumed_session_stopped_before_its_first_evaluation_still_gives_the_best_dev_ppl(task, tmp_path):
    result = _result(tmp_path, stopped="interrupted", best_ppl=123.456, tokens=6000, session_tokens=1000,
                     elapsed_s=5.0, session_s=1.0)
    dev = [line for line in _summary(task, result).splitlines() if line.startswith("dev ")]
    assert dev == ["dev         best ppl 123.46 (from an earlier session; this one stopped before its first "
                   "evaluation)"]
    assert not [line for line in _summary(task, _result(tmp_path)).splitlines() if line.startswith("dev ")]


def test_a_head_without_clusters_shows_no_cluster_scores(tmp_path):
    line = [line for line in _summary("lm", _result(tmp_path, last_eval=_evaluation(50.0, False), best_ppl=50.0))
            .splitlines() if line.startswith("dev ")]
    assert line == ["dev         ppl 50.00 (best 50.00)"]
    line = [line for line in _summary("lm", _result(tmp_path, last_eval=_evaluation(50.0, True), best_ppl=40.0))
            .splitlines() if line.startswith("dev ")]
    assert line == ["dev         ppl 50.00, cluster ppl 12.50, in-cluster ppl 4.00 (best 40.00)"]


@pytest.mark.parametrize("task", SUMMARIES)
def test_the_speed_is_the_sessions_and_compiling_is_given_apart(task, tmp_path):
    result = _result(tmp_path, tokens=6000, elapsed_s=10.0, session_tokens=2000, session_s=0.5, compile_s=34.2)
    line = _summary(task, result).splitlines()[0]
    unit = "rows" if task == "w2v" else "tokens"
    assert f"10.0 s of training (4,000 {unit}/s this session" in line
    assert line.endswith(" + 34.2 s compiling (--compile; not counted)")
    assert "this session" not in _summary(task, _result(tmp_path)).splitlines()[0]  # a new run: one speed


def test_the_compiling_a_word2vec_run_did_is_named_as_numbas(tmp_path):
    result = _result(tmp_path, compile_s=21.5, compiled="Numba's word2vec loops, cached on disk for the next run")
    assert _summary("w2v", result).splitlines()[0].endswith(
        " + 21.5 s compiling (Numba's word2vec loops, cached on disk for the next run; not counted)")
