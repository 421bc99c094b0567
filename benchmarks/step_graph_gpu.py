"""Whole-model tokens/s on a GPU, each head with its training step eager and captured as one CUDA graph.

The step of a small model on a GPU is bound by the ops the host issues (docs/benchmarks/step-ops.md counts them);
``--step-graph on`` issues the ordinary step as one graph (:mod:`sohsm.train.step_graph`). This trains
``sohsm lm train`` for each ``--head`` with ``--step-graph off`` and ``on``, one run at a time, the pairs
interleaved (a machine's drift falls on both), and reports tokens per second after the first logged interval
(the start, the warm-up and the capture left out), with each head's ratio to the full softmax and to adaptive
softmax in the same form. Writes docs/benchmarks/step-graph-gpu.md, only where every run succeeded (else it names
the runs that failed and exits 1). Needs a CUDA device. Usage::

    python benchmarks/step_graph_gpu.py --corpus wikitext-2 --amp bf16 --emb-size 512 --hidden-size 512 \\
        --max-tokens 600000
    python benchmarks/step_graph_gpu.py --zipf 256000 --amp bf16 --emb-size 512 --hidden-size 512 \\
        --max-tokens 600000 --output docs/benchmarks/step-graph-gpu-256k.md

``--zipf N`` trains on a made-up corpus of N word types drawn by Zipf's law (2M training tokens, written once into
``--work``), the large vocabulary no corpus here has. Other arguments go to ``sohsm lm train``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

HEADS = ["full", "adaptive", "self_organized", "self_organized --head-option div_value=null",
         "two_level_frequency"]


def zipf_corpus(folder: Path, words: int, tokens: int = 2_000_000, seed: int = 0) -> Path:
    """``folder`` with train.txt, valid.txt and test.txt of ``words`` word types drawn by Zipf's law."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "test.txt").exists():
        return folder
    rng = np.random.default_rng(seed)
    names = np.array([f"w{i}" for i in range(words)])
    p = 1.0 / np.arange(1, words + 1)
    p /= p.sum()
    for name, n in (("train.txt", tokens), ("valid.txt", tokens // 20), ("test.txt", tokens // 20)):
        ids = rng.choice(words, size=n, p=p)
        lines = (" ".join(names[ids[k: k + 50]]) for k in range(0, n, 50))
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def steady_rate(run_dir: Path) -> float | None:
    """Tokens per second between the first and the last train record (the start and the capture before it)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    if len(train) < 2:
        return None
    first, last = train[0], train[-1]
    return (last["tokens"] - first["tokens"]) / max(last["elapsed_s"] - first["elapsed_s"], 1e-9)


def _commit() -> str:
    """The checkout's commit (``git rev-parse --short HEAD``), ``unknown`` outside a git checkout."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", action="append", help=f"a head and its options (repeat; default: {HEADS})")
    parser.add_argument("--zipf", type=int, help="train on a made-up Zipf corpus of this many word types")
    parser.add_argument("--work", type=Path, help="where the runs (and a Zipf corpus) go (default: a temporary folder)")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
                        / "step-graph-gpu.md", help="where the table is written")
    args, rest = parser.parse_known_args()
    import torch

    if not torch.cuda.is_available():
        print("step_graph_gpu.py: needs a CUDA device (it times CUDA graphs)", file=sys.stderr)
        return 2
    from sohsm.cli.main import main as sohsm

    work = args.work or Path(tempfile.mkdtemp(prefix="step-graph-"))
    corpus = ["--corpus", str(zipf_corpus(work / f"zipf-{args.zipf}", args.zipf))] if args.zipf else []
    common = [*corpus, *rest, "--device", "cuda", "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "20",
              "--quiet"]
    rates: dict[tuple[str, str], float | None] = {}
    for head in args.head or HEADS:
        for graph in ("off", "on"):
            run_dir = work / f"{head.replace(' ', '_').replace('=', '-')}-{graph}"
            started = time.perf_counter()
            code = sohsm(["lm", "train", *common, "--run-dir", str(run_dir), "--head", *shlex.split(head),
                          "--step-graph", graph])
            rates[head, graph] = steady_rate(run_dir) if code == 0 else None
            print(f"{head} --step-graph {graph}: exit {code}, {rates[head, graph] or 0:,.0f} tokens/s "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    failed = [f"{head} --step-graph {graph}" for (head, graph), rate in rates.items() if rate is None]
    if failed:  # a page of zeros reads as a measurement: none is written
        print(f"step_graph_gpu.py: {args.output} not written: {len(failed)} of {len(rates)} runs failed "
              f"({', '.join(failed)})", file=sys.stderr)
        return 1

    def ratio(value: float | None, other: float | None) -> str:
        return f"{value / other:.2f}x" if value and other else "-"

    lines = ["# Whole-model tokens/s on a GPU, the step eager and captured as one graph\n",
             f"`python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}` at commit {_commit()} on "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}; `sohsm lm train {shlex.join(common)}`, "
             "one run at a time, tokens/s after the first logged interval.\n",
             "| head | eager | one graph | graph / eager | graph x full (graph) | graph x adaptive (graph) |",
             "|---|---:|---:|---:|---:|---:|"]
    for head in args.head or HEADS:
        off, on = rates[head, "off"], rates[head, "on"]
        lines.append(f"| `{head}` | {off or 0:,.0f} | {on or 0:,.0f} | {ratio(on, off)} | "
                     f"{ratio(on, rates.get(('full', 'on')))} | {ratio(on, rates.get(('adaptive', 'on')))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
