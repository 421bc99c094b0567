"""benchmarks/hf_generate.py on a tiny Llama: every head generates, and the page says each ratio and its verdict."""
import argparse
import importlib.util
import sys
from pathlib import Path

from needs import HF_HOW, need_packages

need_packages("transformers", "accelerate", how=HF_HOW)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script():
    spec = importlib.util.spec_from_file_location("hf_generate", BENCHMARKS / "hf_generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_every_head_generates_and_the_page_gives_each_ratio():
    hf_generate = _script()
    args = argparse.Namespace(width=16, layers=1, new_tokens=3, repeats=1)
    row = hf_generate.run_size(2000, args)
    names = ["full", *hf_generate.HEADS]
    assert all(row[f"{name}_{mode}"] > 0 for name in names for mode in ("greedy", "sampled"))
    page = "\n".join(hf_generate.report([row], "abc1234", "python benchmarks/hf_generate.py", "2026-12-06"))
    for name in hf_generate.HEADS:
        ratio = row[f"{name}_greedy"] / row["full_greedy"]
        assert f"- 2k, greedy, `{name}`: {ratio:.2f}x, {'met' if ratio >= 1 else 'missed'}" in page
