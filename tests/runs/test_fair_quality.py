"""benchmarks/fair_quality.py's report: the numbers it prints are the kept runs' own, paired seed by seed."""
import json
import math
from pathlib import Path

import pytest

from benchmark_scripts import load_script

fair = load_script("fair_quality")


def _keep(folder: Path, dev: list[float], test: float) -> None:
    folder.mkdir(parents=True)
    records = [{"kind": "train", "step": 10, "tokens": 1000, "elapsed_s": 2.0}]
    records += [{"kind": "eval", "split": "valid", "step": 5 * (i + 1), "epoch": 0.5 * (i + 1), "ppl": p}
                for i, p in enumerate(dev)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "config.json").write_text("{}")
    (folder / "test.json").write_text(json.dumps({"ppl": test, "step": 10, "checkpoint": "best.pt"}))


def test_report_pairs_runs_seed_by_seed(tmp_path):
    results = tmp_path / "fair"
    tests = {"full-tied": (100.0, 110.0, 90.0), "self_organized-tied": (101.0, 112.0, 90.0)}
    for name, values in tests.items():
        for seed, test in zip((1, 2, 3), values):
            _keep(results / "promise" / f"seed-{seed}" / name, [test * 1.2, test * 1.1], test)
    text = fair.report(tmp_path / "fair.md", results)
    assert (tmp_path / "fair.md").read_text() == text
    row = next(line for line in text.splitlines() if line.startswith("| self_organized-tied"))
    assert "111.10 / 101.00" in row and "(2 seeds)" not in row   # best dev is the lower of the two evaluations
    ratios = [101 / 100, 112 / 110, 1.0]
    mean = math.expm1(sum(math.log(r) for r in ratios) / 3) * 100
    line = next(line for line in text.splitlines() if line.startswith("- self_organized-tied"))
    assert line.startswith(f"- self_organized-tied: {mean:+.2f}% (higher on 2 of 3 seeds, +0.00% to +1.82%; t ")
    assert "p 0." in line and "adaptive" not in text.split("## ")[1].split("Against")[0]


def test_report_skips_protocols_without_runs(tmp_path):
    text = fair.report(tmp_path / "fair.md", tmp_path / "none")
    assert "## " not in text


def test_a_corpus_without_a_test_split_is_reported_on_dev_alone(tmp_path):
    """The text8 prefix has train and valid only: its runs are kept with no test figure, and compared on dev."""
    results = tmp_path / "fair"
    for name, dev in (("adaptive-untied", 120.0), ("self_organized-tied", 114.0)):
        _keep(results / "lstm256-text8" / "seed-1" / name, [dev], None)
    text = fair.report(tmp_path / "fair.md", results)
    row = next(line for line in text.splitlines() if line.startswith("| self_organized-tied"))
    assert "114.00 / –" in row and "| – |" in row
    line = next(line for line in text.splitlines() if line.startswith("- self_organized-tied"))
    assert line == f"- self_organized-tied: no test split [{(114 / 120 - 1) * 100:+.2f}% (one seed)]"


def test_a_gpu_run_is_kept_and_tabled_apart_from_the_cpu_runs(tmp_path, monkeypatch):
    """--device cuda trains with that device, keeps its runs in PROTOCOL-cuda, and the report tables them apart."""
    calls = []

    def sohsm(*args):
        calls.append(args)
        if args[:2] == ("lm", "eval"):
            return type("Done", (), {"returncode": 0, "stdout": json.dumps({"ppl": 90.0, "step": 4,
                                                                            "checkpoint": "/x/best.pt"}), "stderr": ""})
        run = Path(args[args.index("--run-dir") + 1])
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "split": "valid", "step": 4, "epoch": 1.0,
                                                       "ppl": 95.0}) + "\n")
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})

    monkeypatch.setattr(fair.kept_runs, "sohsm", sohsm)
    monkeypatch.setattr(fair, "RESULTS", tmp_path / "fair")
    assert fair.train("lstm256-ptb", [1], ["full-tied"], tmp_path / "runs", "cuda") == 0
    train, evaluate = calls
    assert train[train.index("--device") + 1] == "cuda" and evaluate[evaluate.index("--device") + 1] == "cuda"
    kept = tmp_path / "fair" / "lstm256-ptb-cuda" / "seed-1" / "full-tied"
    assert json.loads((kept / "test.json").read_text())["checkpoint"] == "best.pt"
    _keep(tmp_path / "fair" / "lstm256-ptb" / "seed-1" / "full-tied", [120.0], 110.0)
    text = fair.report(tmp_path / "fair.md", tmp_path / "fair")
    cpu, gpu = text.split("## ")[1:]
    assert gpu.startswith("Penn Treebank, LSTM 256, six epochs, trained on a GPU") and "--device cuda" in gpu
    assert "95.00 / 90.00" in gpu and "95.00" not in cpu and "--device" not in cpu


@pytest.mark.parametrize("run", sorted(fair.RUNS))
def test_every_run_builds_its_head_from_the_options_it_names(run):
    """A run's head options are read as ``--head-option`` reads them, and the head builds with them: a variant with a
    misspelt or out-of-range option fails here, not an hour into a training."""
    import torch

    from sohsm.cli.config_flags import parse_head_option
    from sohsm.heads import build_head

    head, _, options = fair.RUNS[run]
    counts = torch.arange(400, 0, -1).double()
    head_options = dict(parse_head_option(text) for text in options)
    if head_options.get("div_value") is not None:
        head_options["cutoffs"] = [20, 100]
    built = build_head(head, 16, 400, counts=counts, **head_options)
    assert built.n_classes == 400
