"""A decoder-only transformer with each head: whole-model training tokens/s, on a GPU and on the CPU.

**GPU** (the default): ``sohsm lm train --model transformer`` at GPT-2 small's size (12
blocks, width 768, 12 heads, context 512, batch 16 = 8,192 tokens a step, bf16 autocast,
float32 master weights, fused AdamW, dropout 0.1) with each head of ``--heads`` (every head's
defaults; the two-level heads on their sync-free Triton path, their default on CUDA), on
WikiText-2 (33k words) and on a synthetic Zipf corpus of ``--zipf-words`` words (256k;
:func:`gpu.write_zipf_corpus`). Each run is a process of its own and runs alone on the GPU,
``--gpu-tokens`` training tokens, no dev evaluation while it trains. The tokens/s reported is
that of the training clock after the first ``--log-every`` steps (allocation, autotuning and,
with ``--compile``, compilation fall in those); the whole run's rate stands beside it. Writes
``docs/benchmarks/transformer-gpu.md``. Without a CUDA device it says so in one line and exits
with status 1.

**CPU** (``--cpu``): the small model of the quality protocol (4 blocks, width 256, 4 heads,
context 128) on WikiText-2 (33k words), one training step after another of each head of
``--cpu-heads`` (the full softmax and the self-organized head) taking turns in one process on
one thread, so that both see the same load; each step is the loop's own (``sohsm.train.step.TrainStep``:
forward, backward, clipping, fused AdamW) on the run's own batches. Reported: the median step time
of ``--cpu-steps`` steps after ``--cpu-warmup``, tokens/s, and the ratio to the full softmax. The
self-organized head re-clusters every K steps (about 8 times an epoch); one re-clustering is timed
on its own after the steps and its cost spread over K steps in the last column. Writes
``docs/benchmarks/transformer.md``.

Usage::

    python benchmarks/transformer.py                                 # GPU: every head, WikiText-2 and Zipf 256k
    python benchmarks/transformer.py --heads full self_organized --gpu-tokens 400000 --compile
    OMP_NUM_THREADS=1 python benchmarks/transformer.py --cpu         # CPU: full vs self_organized, one thread
    OMP_NUM_THREADS=1 python benchmarks/transformer.py --cpu --batch-size 8 --cpu-steps 8   # a shorter CPU run
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _machine import machine, write_page

import sohsm

ROOT = Path(__file__).resolve().parent.parent
HEADS = ("full", "adaptive", "two_level_frequency", "self_organized")
CPU_HEADS = ("full", "self_organized")

#: GPT-2 small's shape, 8,192 tokens a step
GPU_MODEL = ["--model", "transformer", "--layers", "12", "--hidden-size", "768", "--attention-heads", "12",
             "--bptt", "512", "--batch-size", "16", "--dropout", "0.1"]
#: the small model of the CPU quality protocol (docs/results/transformer.md)
CPU_MODEL = {"model.architecture": "transformer", "model.layers": 4, "model.hidden_size": 256,
             "model.attention_heads": 4, "bptt": 128}


# -- GPU: whole runs of `sohsm lm train` ------------------------------------------------------------
def gpu_settings(args, tmp: Path) -> list[tuple[str, str, list[str]]]:
    """``(name, corpus, extra lm-train arguments)`` of each corpus: WikiText-2, then the Zipf corpus."""
    from gpu import write_zipf_corpus

    zipf = write_zipf_corpus(tmp / f"zipf-{args.zipf_words}", args.zipf_words, args.zipf_tokens, args.seed)
    return [("WikiText-2", "wikitext-2", []), (f"Zipf {args.zipf_words // 1000}k", str(zipf), ["--min-count", "1"])]


def steady_rate(run_dir: Path) -> tuple[float | None, float | None, int]:
    """``(tokens/s after the first log interval, tokens/s of the whole run, steps)`` from a run's train records."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        return None, None, 0
    last = train[-1]
    whole = last["tokens"] / last["elapsed_s"] if last["elapsed_s"] > 0 else None
    if len(train) < 2:
        return None, whole, last["step"]
    first = train[0]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    return ((last["tokens"] - first["tokens"]) / seconds if seconds > 0 else None), whole, last["step"]


def run_gpu(args) -> list[dict]:
    rows = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for setting, corpus, extra in gpu_settings(args, tmp):
            for head in args.heads:
                run_dir = tmp / f"{setting.split()[0]}-{head}"
                argv = ["lm", "train", "--corpus", corpus, "--head", head, "--run-dir", str(run_dir), *GPU_MODEL,
                        "--device", "cuda", "--amp", "bf16", "--max-tokens", str(args.gpu_tokens),
                        "--log-every", str(args.log_every), "--eval-every", "0", "--checkpoint-every", "0",
                        "--eval-batch-size", "4", "--seed", str(args.seed), "--quiet", *extra]
                if args.compile:
                    argv.append("--compile")
                done = subprocess.run([sys.executable, "-m", "sohsm", *argv], env=env, capture_output=True,
                                      text=True)
                shown = ["ZIPF_FOLDER" if a == corpus and extra else a for a in argv if a != str(run_dir)]
                row = {"setting": setting, "head": head, "command": "sohsm " + " ".join(shown).replace(
                    "--run-dir ", "--run-dir RUN ")}
                if done.returncode == 0:
                    row["tokens_per_s"], row["whole_tokens_per_s"], row["steps"] = steady_rate(run_dir)
                else:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    row["note"] = f"exit status {done.returncode}: {last[:160]}"
                rows.append(row)
                print(row, flush=True)
    return rows


def write_gpu_report(path: Path, args, rows: list[dict]) -> None:
    props = torch.cuda.get_device_properties(0)
    lines = [
        "# A transformer with each head on a GPU: whole-model training tokens/s", "",
        f"Device: {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, torch "
        f"{torch.__version__}, Python {platform.python_version()}, sohsm {sohsm.__version__}; "
        f"{datetime.date.today().isoformat()}.", "",
        f"Command: `python benchmarks/transformer.py {' '.join(sys.argv[1:])}`", "",
        "GPT-2 small's shape: 12 blocks, width 768, 12 heads, context 512, batch 16 (8,192 tokens a step), bf16 "
        f"autocast, fused AdamW, dropout 0.1{', torch.compile' if args.compile else ''}; every head with its "
        f"defaults; {args.gpu_tokens:,} training tokens per run, each run alone on the GPU; *tokens/s*: the training "
        f"clock after the first {args.log_every} steps, *whole run*: from the first step. Zipf: a synthetic corpus "
        f"of {args.zipf_words:,} words ({args.zipf_tokens:,} training tokens, every word at least once).", "",
        "| corpus | head | steps | tokens/s | whole run | vs full | vs adaptive | note |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        def ratio(other: str) -> str:
            peer = next((r for r in rows if r["setting"] == row["setting"] and r["head"] == other
                         and r.get("tokens_per_s")), None)
            return f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer and row.get("tokens_per_s") else "-"

        if row.get("tokens_per_s"):
            lines.append(f"| {row['setting']} | {row['head']} | {row['steps']} | {row['tokens_per_s']:,.0f} | "
                         f"{row['whole_tokens_per_s']:,.0f} | {ratio('full')} | {ratio('adaptive')} | |")
        else:
            lines.append(f"| {row['setting']} | {row['head']} | - | - | - | - | - | {row.get('note', '')} |")
    lines += ["", "Commands (`--head HEAD` each; ZIPF_FOLDER is the synthetic corpus' folder, RUN a fresh folder):", ""]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        first = next(r for r in rows if r["setting"] == setting)
        lines.append("- `" + first["command"].replace(f"--head {first['head']}", "--head HEAD") + "`")
    write_page(path, lines)


# -- CPU: training steps taking turns in one process ------------------------------------------------
def cpu_trainer(head_name: str, args):
    """The run's task, model, head and step (``TrainStep``) for ``head_name``, built as `sohsm lm train` builds them."""
    from sohsm.tasks.lm import LMConfig, LMTask
    from sohsm.train.distributed import Ranks
    from sohsm.train.step import TrainStep

    device = torch.device("cpu")
    config = LMConfig.from_overrides({**CPU_MODEL, "data.corpus": args.corpus, "head.name": head_name,
                                      "batch_size": args.batch_size, "seed": args.seed})
    task = LMTask.load(config, device)
    model, head = task.build(device)
    optimizer = task.build_optimizer(model, head)
    head.attach(optimizer)
    step = TrainStep(task, model, head, optimizer, Ranks(device=device), config.optim.clip)
    model.train()
    head.train()
    return config, task, model, head, step


def run_cpu(args) -> tuple[list[dict], dict]:
    from sohsm.heads import SelfOrganizingHead
    from sohsm.train.progress import parameter_count

    trainers = {name: cpu_trainer(name, args) for name in args.cpu_heads}
    batches = {name: trainer[1].batches(0, 0) for name, trainer in trainers.items()}
    times: dict[str, list[float]] = {name: [] for name in trainers}
    tokens = args.batch_size * trainers[args.cpu_heads[0]][0].bptt
    for i in range(args.cpu_warmup + args.cpu_steps):
        for name, (config, task, model, head, step) in trainers.items():  # the heads take turns
            batch, _ = next(batches[name])
            start = time.perf_counter()
            step(batch, i + 1)
            if i >= args.cpu_warmup:
                times[name].append(time.perf_counter() - start)
        if i >= args.cpu_warmup:
            print(f"step {i + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in times), flush=True)
    rows = []
    for name, (config, task, model, head, step) in trainers.items():
        row = {"head": name, "params": parameter_count(head), "model_params": parameter_count(model),
               "step_s": statistics.median(times[name]), "reclusterings": 0}
        if isinstance(head, SelfOrganizingHead):
            row["reclusterings"] = len(head.history)
            start = time.perf_counter()
            head.reassign()
            row["recluster_s"], row["K"] = time.perf_counter() - start, head.update_every
        rows.append(row)
    facts = {"vocab": len(trainers[args.cpu_heads[0]][1].vocab), "tokens": tokens}
    return rows, facts


def write_cpu_report(path: Path, args, rows: list[dict], facts: dict) -> None:
    full = next((r for r in rows if r["head"] == "full"), None)
    lines = [
        "# A transformer with each head on the CPU: training step tokens/s", "",
        f"Produced by `OMP_NUM_THREADS=1 python benchmarks/transformer.py {' '.join(sys.argv[1:])}` on "
        f"{datetime.date.today().isoformat()} ({machine()}, sohsm {sohsm.__version__}).", "",
        f"The small model of the CPU quality protocol: 4 blocks, width 256, 4 heads, context 128, batch "
        f"{args.batch_size} ({facts['tokens']:,} tokens a step), on {args.corpus} ({facts['vocab']:,} words); "
        "AdamW (fused), clipping 1, every head with its defaults, as `sohsm lm train --model transformer` builds "
        "them. The heads' training steps (forward, backward, clipping, optimizer step: the loop's own) take "
        f"turns in one process on one thread; median of {args.cpu_steps} steps after {args.cpu_warmup}. "
        "*with re-clustering*: one re-clustering of the self-organized head, timed on its own, spread over its K "
        "steps.", "",
        "| head | head parameters | model parameters | step s | tokens/s | vs full | re-clustering s (K) | "
        "tokens/s with re-clustering | vs full |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rate = facts["tokens"] / row["step_s"]
        versus = f"{full['step_s'] / row['step_s']:.2f}x" if full else "-"
        if "recluster_s" in row:
            amortised = row["step_s"] + row["recluster_s"] / row["K"]
            recluster = f"{row['recluster_s']:.2f} ({row['K']})"
            with_re = f"{facts['tokens'] / amortised:,.0f}"
            versus_re = f"{full['step_s'] / amortised:.2f}x" if full else "-"
        else:
            recluster, with_re, versus_re = "-", f"{rate:,.0f}", versus
        lines.append(f"| {row['head']} | {row['params'] / 1e6:.2f}M | {row['model_params'] / 1e6:.2f}M | "
                     f"{row['step_s']:.3f} | {rate:,.0f} | {versus} | {recluster} | {with_re} | {versus_re} |")
    write_page(path, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU section instead of the GPU runs")
    parser.add_argument("--heads", nargs="+", default=list(HEADS), help="heads of the GPU runs")
    parser.add_argument("--gpu-tokens", type=int, default=1_000_000, help="training tokens per GPU run")
    parser.add_argument("--log-every", type=int, default=10, help="GPU runs: steps of the first, untimed interval")
    parser.add_argument("--compile", action="store_true", help="GPU runs: torch.compile model and head")
    parser.add_argument("--zipf-words", type=int, default=256_000, help="vocabulary of the synthetic corpus")
    parser.add_argument("--zipf-tokens", type=int, default=4_000_000, help="training tokens of the synthetic corpus")
    parser.add_argument("--cpu-heads", nargs="+", default=list(CPU_HEADS), help="heads of the CPU section")
    parser.add_argument("--corpus", default="wikitext-2", help="CPU section: the corpus")
    parser.add_argument("--batch-size", type=int, default=32, help="CPU section: columns (x 128 tokens a step)")
    parser.add_argument("--cpu-steps", type=int, default=10, help="CPU section: timed steps per head")
    parser.add_argument("--cpu-warmup", type=int, default=2, help="CPU section: untimed steps first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, help="the page to write (default: docs/benchmarks/transformer.md "
                        "for --cpu, docs/benchmarks/transformer-gpu.md for the GPU)")
    args = parser.parse_args(argv)
    if args.cpu:
        torch.set_num_threads(1)
        rows, facts = run_cpu(args)
        write_cpu_report(args.output or ROOT / "docs" / "benchmarks" / "transformer.md", args, rows, facts)
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/transformer.py needs a CUDA device for its GPU runs and torch.cuda.is_available() is False: "
              "nothing measured, nothing written (--cpu runs the CPU section)", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name(0)}", flush=True)
    rows = run_gpu(args)
    write_gpu_report(args.output or ROOT / "docs" / "benchmarks" / "transformer-gpu.md", args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
