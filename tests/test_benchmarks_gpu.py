"""benchmarks/gpu.py's whole-model comparison without a GPU: every figure kept as it comes, tokens/s after the
warm-up, the backend each head ran (``sohsm lm train`` and the device's name mocked)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_benchmark(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(name="a mocked GPU", total_memory=2**34))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(module, "LM_SETTINGS", (("WikiText-2", "wikitext-2", 32, ()),))
    return module


def test_lm_keeps_every_figure_as_it_comes_and_times_after_the_warm_up(gpu_benchmark, tmp_path, monkeypatch):
    import sohsm.cli.main

    report_path = tmp_path / "out"
    report_path.mkdir()  # --output DIR: the report is DIR/gpu.md
    seen_before_run = []

    def fake_train(argv):
        head, run_dir = argv[argv.index("--head") + 1], Path(argv[argv.index("--run-dir") + 1])
        report = report_path / "gpu.md"
        seen_before_run.append(report.read_text() if report.exists() else "")
        if head == "adaptive":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        run_dir.mkdir()
        records = [{"kind": "train", "tokens": 100, "elapsed_s": 10.0, "epoch": 1},  # 10 s of warm-up
                   {"kind": "train", "tokens": 1100, "elapsed_s": 11.0, "epoch": 1},
                   {"kind": "recluster", "step": 30},
                   {"kind": "train", "tokens": 2100, "elapsed_s": 12.0, "epoch": 1}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return 0

    monkeypatch.setattr(sohsm.cli.main, "main", fake_train)
    args = argparse.Namespace(lm_heads=["full", "adaptive", "self_organized"], lm_tokens=2100, lm_log_every=20,
                              compile=False, verbose=False, seed=0, repeats=20, warmup=5, zipf_words=10,
                              zipf_tokens=100)
    device = torch.device("cpu")
    report = gpu_benchmark.Report(report_path, args, device)
    rows = gpu_benchmark.run_lm(args, device, report)
    assert [r["head"] for r in rows] == ["full", "adaptive", "self_organized"]
    assert rows[0]["tokens_per_s"] == pytest.approx(1000.0)  # not 2100 / 12: the first interval is left out
    assert "illegal memory access" in rows[1]["note"] and "tokens_per_s" not in rows[1]
    assert rows[2]["tokens_per_s"] == pytest.approx(1000.0)
    assert [r.get("backend") for r in rows] == ["-", None, "per_cluster"]  # auto on the CPU
    assert "| WikiText-2 | 32 | full | - | 2,100 |" in seen_before_run[1]  # written before the next run began
    assert "| WikiText-2 | 32 | adaptive | - |" in seen_before_run[2]
    text = (report_path / "gpu.md").read_text()
    assert "| WikiText-2 | 32 | self_organized | per_cluster | 2,100 | 12.0 | 1,000 | 1.00x | |" in text


def test_a_page_s_command_line_leaves_out_the_output_folder_of_the_machine_that_ran_it():
    spec = importlib.util.spec_from_file_location("benchmark_machine", ROOT / "benchmarks" / "_machine.py")
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    argv = ["--hf", "--output", "/somewhere/out/page.md", "--hf-steps", "8", "--output=/x.md"]
    assert machine.command_line(argv) == "--hf --hf-steps 8"
