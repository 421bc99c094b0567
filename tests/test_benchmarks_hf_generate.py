"""benchmarks/hf_generate.py on a tiny Llama: every head generates, and the page says each ratio and its verdict."""
import argparse

from benchmark_scripts import load_script
from needs import HF_HOW, need_packages

need_packages("transformers", "accelerate", how=HF_HOW)


def _script():
    return load_script("hf_generate")


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
