"""`sohsm lm compare` end to end on a slice of real PTB text: runs, report, resumption, refusals."""
from __future__ import annotations

import json
import signal

import pytest

import sohsm.train.session as loop  # the session calls evaluate
from sohsm.train import read_metrics

TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10
STEPS = 40
BUDGET = ["--max-tokens", STEPS * TOKENS_PER_STEP, "--eval-every", 20, "--log-every", 10]


def _one_line_error(code, err):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    return lines[0]


def _mtimes(out):
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/last.pt")}


@pytest.fixture(scope="module")
def compared(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """full and self_organized (each tied by default), plus a self_organized variant re-clustering every 10 steps,
    untied."""
    out = tmp_path_factory.mktemp("compare") / "heads"
    argv = ["lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "full,self_organized",
            "--variant", "k10:self_organized:update_every=10,gamma=2,tie_weights=false", *small, *BUDGET]
    code, stdout, err = cli(*argv)
    assert code == 0, err
    return out, argv, stdout


def test_compare_trains_one_run_per_head_and_writes_the_report(compared):
    out, argv, stdout = compared
    names = ["full", "self_organized", "self_organized-k10"]
    for name in names:
        records = read_metrics(out / name / "metrics.jsonl")
        assert max(r["tokens"] for r in records) == STEPS * TOKENS_PER_STEP, name
    variant = json.loads((out / "self_organized-k10" / "config.json").read_text())["head"]
    assert variant["update_every"] == 10 and variant["options"] == {"gamma": 2}
    assert json.loads((out / "self_organized" / "config.json").read_text())["head"]["update_every"] is None
    tied = {name: json.loads((out / name / "config.json").read_text())["model"]["tie_weights"] for name in names}
    assert tied == {"full": True, "self_organized": True, "self_organized-k10": False}

    results = (out / "results.md").read_text()
    assert "sohsm lm compare --corpus" in results and "--variant k10:self_organized:update_every=10,gamma=2" in results
    assert ("Head options: `full`: tie_weights=True; `self_organized`: tie_weights=True; "
            "`self_organized-k10`: gamma=2, update_every=10") in results
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| run")]
    assert [row.split("|")[1].strip() for row in rows] == names
    assert "speed vs full" in results and "empty clusters at the end" in results
    assert (out / "figure1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clusters = (out / "clusters.md").read_text()
    assert "## self_organized\n" in clusters and "## self_organized-k10\n" in clusters
    rows = [line.split("|") for line in clusters.splitlines() if line.startswith("| ") and "rank" not in line]
    assert rows and all(int(row[3]) > 1 for row in rows)  # learned clusters; one-word ones are counted above them
    assert "one-word clusters not listed (the " in clusters
    assert [r["name"] for r in json.loads((out / "compare.json").read_text())["runs"]] == names
    assert "results.md" in stdout and "new run" in stdout


def test_a_second_invocation_skips_the_finished_runs(compared, cli):
    out, argv, _ = compared
    before = _mtimes(out)
    code, stdout, err = cli(*argv)
    assert code == 0, err
    assert stdout.count("skipped") == 3 and "training in" not in stdout
    assert _mtimes(out) == before


def test_report_only_rewrites_the_report_from_the_runs(compared, cli):
    out, argv, _ = compared
    (out / "results.md").unlink()
    code, _, err = cli("lm", "compare", "--out", out, "--report-only")
    assert code == 0, err
    results = (out / "results.md").read_text()
    assert "report rewritten by `sohsm lm compare --out" in results and "self_organized-k10" in results


def test_a_run_from_lm_train_is_resumed_by_compare(tmp_path, ptb_slice, small, cli):
    out = tmp_path / "heads"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", out / "full", *small,
                       "--max-tokens", 20 * TOKENS_PER_STEP, "--eval-every", 20, "--log-every", 10)
    assert code == 0, err
    code, stdout, err = cli("lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "full,two_level_random",
                            *small, *BUDGET)
    assert code == 0, err
    assert f"resume at {20 * TOKENS_PER_STEP:,} tokens" in stdout
    for name in ("full", "two_level_random"):
        train_steps = [r["step"] for r in read_metrics(out / name / "metrics.jsonl")
                       if r["kind"] == "train" and not r.get("partial")]
        assert train_steps == list(range(10, STEPS + 1, 10)), name  # the resumed run continues where it stopped


def test_an_interrupted_comparison_continues_where_it_stopped(tmp_path, ptb_slice, small, cli, monkeypatch):
    out = tmp_path / "heads"
    argv = ["lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "full,two_level_random", *small,
            "--max-tokens", 30 * TOKENS_PER_STEP, "--eval-every", 10, "--log-every", 10]
    evaluate = loop.evaluate

    def interrupting_evaluate(*args, **kwargs):  # Ctrl-C during the first evaluation of the first run (step 10)
        monkeypatch.setattr(loop, "evaluate", evaluate)
        signal.raise_signal(signal.SIGINT)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", interrupting_evaluate)
    code, stdout, _ = cli(*argv)
    assert code == 130 and "run the same command again" in stdout
    assert not (out / "two_level_random").exists() and not (out / "results.md").exists()

    code, stdout, err = cli(*argv)
    assert code == 0, err
    assert f"resume at {10 * TOKENS_PER_STEP:,} tokens" in stdout and "two_level_random  new run" in stdout
    steps = [r["step"] for r in read_metrics(out / "full" / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [10, 20, 30] and (out / "results.md").is_file()


def test_a_run_with_other_settings_is_refused_before_anything_trains(tmp_path, ptb_slice, small, cli):
    out = tmp_path / "heads"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", out / "full", *small,
                       "--max-tokens", 5 * TOKENS_PER_STEP)
    assert code == 0, err
    code, _, err = cli("lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "full,two_level_random",
                       *small, "--emb-size", 16, *BUDGET)
    assert "model.emb_size is 32 in the run, 16 requested" in _one_line_error(code, err)
    assert sorted(p.name for p in out.iterdir()) == ["full"]


@pytest.mark.parametrize("options, message", [
    (["--heads", "full,softmax"], "--heads: unknown head 'softmax'"),
    (["--heads", "full,two_level_random", "--update-every", 5],
     "--update-every (5) means nothing for the heads full, two_level_random"),
    (["--heads", "full", "--head-option", "gamma=2"], "--head-option gamma means nothing for the heads full"),
    (["--head-option", "gamma=abc"], "head 'self_organized': option gamma must be float, got 'abc'"),
    (["--variant", "x:full:gamma=2"], "--variant x: head 'full' has no option 'gamma'; its options: bias"),
    (["--heads", "full,self_organized", "--head-option", "gamma=-1"], "head 'self_organized': gamma must be positive"),
    (["--heads", "full", "--variant", "x:full"], "run full-x would train the same run as full (the same head"),
])
def test_bad_heads_and_options_are_one_line_before_anything_is_written(tmp_path, ptb_slice, small, cli, options,
                                                                        message):
    code, _, err = cli("lm", "compare", "--corpus", ptb_slice, "--out", tmp_path / "heads", *small, *options)
    assert message in _one_line_error(code, err)
    assert not (tmp_path / "heads").exists()


# -- several seeds in one command -------------------------------------------------------------------------
def test_compare_over_seeds_reports_means_and_differences_against_the_reference(tmp_path, ptb_slice, small, cli):
    out = tmp_path / "seeds"
    argv = ["lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "two_level_random,adaptive",
            "--seeds", "1,2", *small, *BUDGET]
    code, stdout, err = cli(*argv)
    assert code == 0, err
    best = {}
    for seed in (1, 2):
        for head in ("two_level_random", "adaptive"):
            config = json.loads((out / f"seed-{seed}" / head / "config.json").read_text())
            assert config["seed"] == seed and config["head"]["name"] == head
            best[seed, head] = min(r["ppl"] for r in read_metrics(out / f"seed-{seed}" / head / "metrics.jsonl")
                                   if r["kind"] == "eval")
        assert (out / f"seed-{seed}" / "results.md").is_file()
    assert best[1, "adaptive"] != best[2, "adaptive"]  # the seeds made different runs
    text = (out / "seeds.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "vs adaptive, seed by seed" in rows["run"]  # adaptive is the default reference
    diffs = [100 * (best[s, "two_level_random"] / best[s, "adaptive"] - 1) for s in (1, 2)]
    cells = [c.strip() for c in rows["two_level_random"].split("|")[1:-1]]
    mean = (best[1, "two_level_random"] + best[2, "two_level_random"]) / 2
    assert cells[1:5] == [f"{best[1, 'two_level_random']:.2f}", f"{best[2, 'two_level_random']:.2f}", f"{mean:.2f}",
                          "2"]
    assert cells[5] == ", ".join(f"{d:+.2f}%" for d in diffs)
    assert cells[6] == f"{sum(diffs) / 2:+.2f}% over 2"
    assert "seeds.md" in stdout
    # the report alone, against another reference
    code, stdout, err = cli("lm", "compare", "--out", out, "--seeds", "1,2", "--reference", "two_level_random",
                            "--report-only")
    assert code == 0, err
    assert "vs two_level_random, seed by seed" in (out / "seeds.md").read_text()


@pytest.mark.parametrize("options, message", [
    (["--seeds", "1,2", "--seed", "3"], "either --seed or --seeds"),
    (["--seeds", "1,1"], "distinct integers"),
    (["--seeds", "one"], "integers separated by commas"),
    (["--reference", "full"], "give --seeds too"),
])
def test_bad_seeds_are_refused(tmp_path, ptb_slice, small, cli, options, message):
    code, _, err = cli("lm", "compare", "--corpus", ptb_slice, "--out", tmp_path / "heads", *small, *options)
    assert message in _one_line_error(code, err)
    assert not (tmp_path / "heads").exists()


def test_a_comparison_gives_its_runs_the_vocabulary_s_options_and_continues(tmp_path, ptb_slice, small, cli,
                                                                            monkeypatch):
    """Over ``BANDED_FROM_WORDS`` words (lowered here below the slice's vocabulary) the self-organized run of a
    comparison takes ``div_value=4`` as ``lm train`` gives it, and the same command run again finds its runs as
    they were written, skips them, and builds the banded head to check it first; a run from before (every word at
    d) is named, not trained on as the other."""
    from sohsm.heads.two_level import run_defaults

    monkeypatch.setattr(run_defaults, "BANDED_FROM_WORDS", 50)
    out = tmp_path / "heads"
    argv = ["lm", "compare", "--corpus", ptb_slice, "--out", out, "--heads", "full,self_organized", *small, *BUDGET]
    code, _, err = cli(*argv)
    assert code == 0, err
    assert json.loads((out / "self_organized" / "config.json").read_text())["head"]["options"] == {"div_value": 4}
    assert json.loads((out / "full" / "config.json").read_text())["head"]["options"] == {}
    code, stdout, err = cli(*argv)
    assert code == 0, err
    assert stdout.count("skipped") == 2

    older = tmp_path / "older"  # as a release before the option wrote it: every word at d
    monkeypatch.setattr(run_defaults, "BANDED_FROM_WORDS", 10**6)
    assert cli(*[older if a == out else a for a in argv])[0] == 0
    monkeypatch.setattr(run_defaults, "BANDED_FROM_WORDS", 50)
    before = _mtimes(older)
    line = _one_line_error(*cli(*[older if a == out else a for a in argv])[::2])
    assert "holds a run with other settings than this comparison" in line and "div_value" in line
    assert _mtimes(older) == before
