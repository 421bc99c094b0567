"""benchmarks/transformer.py --hf on the CPU at tiny sizes: a row per head (Liger's say it is not installed), the
report written after every row, finite losses, Liger's patches undone after its row; without CUDA, one line."""
from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--hf", "--hf-device", "cpu", "--hf-vocab", "500", "--hf-hidden", "32", "--hf-intermediate", "64",
        "--hf-layers", "1", "--hf-attention-heads", "4", "--hf-kv-heads", "2", "--hf-context", "16",
        "--hf-batch", "2", "--hf-warmup", "1", "--hf-steps", "2",
        "--hf-corpus-tokens", "256"]  # 8 steps an epoch: the self-organized head's K is 1


@pytest.fixture
def hf_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its `from _machine import ...`, `from gpu import ...`
    spec = importlib.util.spec_from_file_location("transformer_benchmark", ROOT / "benchmarks" / "transformer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_rows(hf_bench, monkeypatch) -> tuple[list[dict], list[int]]:
    """The rows run_hf returns, and how many rows each writing of the report held."""
    rows, written = [], []
    run_hf, write = hf_bench.run_hf, hf_bench.write_hf_report
    monkeypatch.setattr(hf_bench, "run_hf", lambda *args: rows.extend(run_hf(*args)) or rows)
    monkeypatch.setattr(hf_bench, "write_hf_report",
                        lambda path, args, device, config, rows: (written.append(len(rows)),
                                                                  write(path, args, device, config, rows)))
    return rows, written


def test_hf_rows_run_on_the_cpu_and_the_report_is_written_after_each(hf_bench, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed, wherever the test runs
    rows, written = record_rows(hf_bench, monkeypatch)
    report = tmp_path / "hf.md"
    assert hf_bench.main([*TINY, "--output", str(report)]) == 0
    assert [r["key"] for r in rows] == list(hf_bench.HF_ROWS)
    assert written == list(range(1, len(hf_bench.HF_ROWS) + 1))  # a crash loses nothing
    for row in rows:
        if row["key"].startswith("liger"):
            assert row["note"].startswith("skipped: liger-kernel not installed")
            continue
        assert "note" not in row, row
        assert row["tokens_per_s"] > 0 and row["step_ms"] > 0
        assert math.isfinite(row["first_loss"]) and math.isfinite(row["last_loss"])
    by_key = {r["key"]: r for r in rows}
    # sohsm's full head took lm_head's weight: the same model, the same first loss as HF's own head
    assert by_key["full"]["first_loss"] == pytest.approx(by_key["hf"]["first_loss"], abs=1e-4)
    assert by_key["self_organized"]["K"] == 1 and by_key["self_organized"]["reclusterings"] == 2
    text = report.read_text()
    assert "not a measurement" in text and "vocabulary 500, untied" in text
    for name in hf_bench.HF_ROWS.values():
        assert sum(line.startswith(f"| {name} |") for line in text.splitlines()) == 1
    assert text.count("skipped: liger-kernel not installed") == 2
    assert "| HF lm_head + its loss | 16,000 |" in text and "| 1.00x |" in text


def test_liger_patches_its_row_only(hf_bench, tmp_path, monkeypatch):
    """A stand-in for Liger patches as apply_liger_kernel_to_llama does (module names, LlamaForCausalLM.forward):
    its row runs patched, and the row after it runs HF's own Llama again."""
    from transformers.models.llama import modeling_llama

    forward, norm = modeling_llama.LlamaForCausalLM.forward, modeling_llama.LlamaRMSNorm
    calls = []

    def apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
                                    swiglu=True, model=None):
        assert fused_linear_cross_entropy and not cross_entropy
        calls.append({"rope": rope, "rms_norm": rms_norm, "swiglu": swiglu})

        def patched(self, *args, **kwargs):
            calls.append("forward")
            return forward(self, *args, **kwargs)

        modeling_llama.LlamaForCausalLM.forward = patched
        modeling_llama.LlamaRMSNorm = type("PatchedNorm", (norm,), {})

    liger = types.ModuleType("liger_kernel")
    liger_transformers = types.ModuleType("liger_kernel.transformers")
    liger_transformers.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel", liger)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", liger_transformers)
    rows, _ = record_rows(hf_bench, monkeypatch)
    assert hf_bench.main([*TINY, "--hf-heads", "liger", "liger_flce", "hf", "--output", str(tmp_path / "hf.md")]) == 0
    assert [r.get("note") for r in rows] == [None, None, None]
    assert calls == [{"rope": True, "rms_norm": True, "swiglu": True}, *["forward"] * 3,
                     {"rope": False, "rms_norm": False, "swiglu": False}, *["forward"] * 3]  # none in the hf row
    assert modeling_llama.LlamaForCausalLM.forward is forward and modeling_llama.LlamaRMSNorm is norm


def test_hf_without_cuda_refuses_in_one_line(hf_bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = tmp_path / "hf.md"
    assert hf_bench.main(["--hf", "--output", str(report)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "needs a CUDA device" in err
    assert not report.exists()
