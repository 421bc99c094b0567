"""benchmarks/step_graph_gpu.py without a GPU (``sohsm lm train`` and the device mocked): a page only from runs that
all ran, and the GPU call's script self-sufficient."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def benchmark(monkeypatch):
    spec = importlib.util.spec_from_file_location("step_graph_gpu", ROOT / "benchmarks" / "step_graph_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a mocked GPU")
    return module


def _fake_train(failing: set[str]):
    def train(argv):
        head, graph = argv[argv.index("--head") + 1], argv[argv.index("--step-graph") + 1]
        if (head, graph) in failing:
            return 1
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        run_dir.mkdir(parents=True)
        rows = [{"kind": "train", "tokens": 1000 * k, "elapsed_s": k * (0.5 if graph == "on" else 1.0)}
                for k in range(1, 4)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    return train


@pytest.mark.parametrize("failing", [set(), {("adaptive", "on")}, {("full", "off"), ("full", "on")}])
def test_a_page_is_written_only_where_every_run_ran(benchmark, tmp_path, monkeypatch, capsys, failing):
    import sohsm.cli.main

    monkeypatch.setattr(sohsm.cli.main, "main", _fake_train(failing))
    output = tmp_path / "page.md"
    monkeypatch.setattr(sys, "argv", ["step_graph_gpu.py", "--head", "full", "--head", "adaptive", "--work",
                                      str(tmp_path / "work"), "--output", str(output), "--corpus", "c"])
    code = benchmark.main()
    err = capsys.readouterr().err
    if failing:
        assert code == 1 and not output.exists() and "not written" in err
        assert all(f"{head} --step-graph {graph}" in err for head, graph in failing)
    else:
        assert code == 0
        text = output.read_text()
        assert "| `full` | 1,000 | 2,000 | 2.00x |" in text and "at commit " in text


def test_the_gpu_call_finds_its_code_and_data_and_interprets_triton_for_the_emulator_alone():
    script = (ROOT / "benchmarks" / "step_graph_gpu.sh").read_text()
    assert "export PYTHONPATH=$PWD/src" in script and 'cd "$(dirname "$0")/.."' in script
    assert '"${SOHSM_DATA:-}" ../shared/data ./shared/data ./.gpu-data' in script
    interpreted = [line for line in script.splitlines() if "TRITON_INTERPRET=1" in line and "pytest" in line]
    assert len(interpreted) == 1 and "test_step_graph_failures.py" in interpreted[0]
    assert "test_step_graph_cuda.py" not in interpreted[0] and "export TRITON_INTERPRET" not in script
    limits = [int(word.split()[0]) for word in script.split("timeout")[1:]]
    assert sum(limits) < 600, limits  # the whole call, every stage at its limit, under ten minutes
