"""Summarise language-model runs into docs/results/: a table, the Figure-1 plot, learned clusters.

Reads each run directory written by `sohsm lm train` (config.json, metrics.jsonl,
best.pt), so every number in the output comes from the runs named on the
command line. Usage::

    python benchmarks/lm_results.py runs/wt2-full runs/wt2-self_organized ... \
        --title "WikiText-2, equal time" --output docs/results/lm-wikitext-2.md
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

from sohsm.plots import figure1
from sohsm.train.clusters import cluster_table
from sohsm.train.run import load_run


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summarise(run_dir: Path) -> dict:
    config = json.loads((run_dir / "config.json").read_text())
    records = read_metrics(run_dir)
    evals = [r for r in records if r["kind"] == "eval"]
    if not evals:
        raise SystemExit(f"{run_dir}: no dev evaluation in metrics.jsonl yet")
    last = max(records, key=lambda r: r["tokens"])
    final = evals[-1]
    best = min(evals, key=lambda r: r["ppl"])
    return {
        "run": run_dir.name,
        "head": config.get("head", {}).get("name") if isinstance(config.get("head"), dict) else config.get("head"),
        "tokens": last["tokens"],
        "epochs": last.get("epoch"),
        "train_s": last["elapsed_s"],
        "tokens_per_s": last["tokens"] / last["elapsed_s"] if last["elapsed_s"] else float("nan"),
        "ppl": final["ppl"],
        "best_ppl": best["ppl"],
        "ppl_cluster": final.get("ppl_cluster"),
        "ppl_in_cluster": final.get("ppl_in_cluster"),
        "reclusterings": sum(r["kind"] == "recluster" for r in records),
    }


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--title", default="Language models")
    parser.add_argument("--output", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--clusters", type=int, default=8, help="learned clusters to list")
    parser.add_argument("--words", type=int, default=10, help="words shown per cluster")
    args = parser.parse_args(argv)

    rows = [summarise(run) for run in args.runs]
    reference = next((r for r in rows if r["head"] == "full"), None)
    lines = [
        f"## {args.title}",
        "",
        "Produced by `python benchmarks/lm_results.py " + shlex.join(sys.argv[1:] if argv is None else argv) + "`.",
        "",
        "| run | head | tokens trained | epochs | training s | train tokens/s | speed vs full | dev ppl | "
        "ppl_cluster | ppl_in-cluster | re-clusterings |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speed = r["tokens_per_s"] / reference["tokens_per_s"] if reference else None
        lines.append(
            f"| {r['run']} | {r['head']} | {r['tokens']:,} | {fmt(r['epochs'], '.2f')} | {r['train_s']:.0f} | "
            f"{r['tokens_per_s']:.0f} | {fmt(speed, '.1f')}{'x' if speed else ''} | {r['ppl']:.1f} | "
            f"{fmt(r['ppl_cluster'], '.2f')} | {fmt(r['ppl_in_cluster'], '.2f')} | {r['reclusterings']} |"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    organized = [run for run, r in zip(args.runs, rows) if r["head"] == "self_organized"]
    if organized:
        run = organized[0]
        picture = args.output.with_name(args.output.stem + "-figure1.png")
        shutil.copyfile(figure1(args.runs, out=run / "figure1.png"), picture)
        lines += ["", f"Figure 1 (all runs; re-clusterings of the self-organized run): ![Figure 1]({picture.name})"]
        loaded = load_run(run, checkpoint="last")
        table = [s for s in cluster_table(loaded.head, loaded.vocab, words=args.words) if s.size > 0]
        lines += [
            "",
            f"Learned clusters of `{run.name}` (the {args.clusters} heaviest of {len(table)} non-empty; "
            f"most frequent words first), as `sohsm clusters show {run.name} --top {args.clusters}` prints them:",
            "",
            "| cluster | size | tf-mass | most frequent words |",
            "|---:|---:|---:|---|",
        ]
        for s in table[: args.clusters]:
            lines.append(f"| {s.cluster} | {s.size} | {s.tf_mass:.3f} | {' '.join(s.words)} |")
    text = "\n".join(lines) + "\n"
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
