"""Best dev perplexity of the same runs over several seeds, with the mean: one table, one command.

Each folder is the ``--out`` of one ``sohsm lm compare`` (same settings, another ``--seed``); a run
missing from a folder, or one that has not yet trained as many epochs as the others, shows as "–" and leaves that seed out of the mean of its row, which then says
over how many seeds it was taken. Every number is read from the run directories. Usage::

    python benchmarks/seed_means.py runs/wt2 runs/wt2-s2 runs/wt2-s3 \
        --runs self_organized,two_level_frequency --reference two_level_frequency
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from statistics import mean

from sohsm.runs.report import summarise_run


def best_ppl(folder: Path, run: str, epochs: float) -> float | None:
    """The best dev perplexity of ``folder/run``; ``None`` when the run is missing or has not trained ``epochs``."""
    if not (folder / run / "metrics.jsonl").is_file():
        return None
    summary = summarise_run(folder / run)
    if summary.epochs is None or summary.epochs < epochs - 1e-6:
        return None  # still training (or stopped early): not comparable at equal tokens
    return summary.best_ppl


def _budget_epochs(folders: list[Path], runs: list[str]) -> float:
    """The most epochs any of the runs trained: the budget they all share."""
    done = [summarise_run(f / r).epochs or 0.0 for f in folders for r in runs if (f / r / "metrics.jsonl").is_file()]
    return max(done, default=0.0)


def table(folders: list[Path], runs: list[str], reference: str | None) -> list[str]:
    """Markdown rows: one per run, one column per folder, then the mean and its distance to ``reference``."""
    epochs = _budget_epochs(folders, runs)
    values = {run: [best_ppl(f, run, epochs) for f in folders] for run in runs}
    ref_values = values.get(reference) if reference else None
    header = "| run | " + " | ".join(f.name for f in folders) + " | mean | seeds |"
    if reference:
        header += f" mean of paired differences vs {reference} |"
    lines = [header, "|---" * (len(folders) + 3 + bool(reference)) + "|"]
    for run, vals in values.items():
        known = [v for v in vals if v is not None]
        cells = ["–" if v is None else f"{v:.2f}" for v in vals]
        row = f"| {run} | " + " | ".join(cells) + f" | {mean(known):.2f} | {len(known)} |" if known else \
            f"| {run} | " + " | ".join(cells) + " | – | 0 |"
        if reference and ref_values is not None:
            pairs = [(v, r) for v, r in zip(vals, ref_values) if v is not None and r is not None]
            row += f" {mean(100 * (v / r - 1) for v, r in pairs):+.2f}% over {len(pairs)} |" if pairs else " – |"
        lines.append(row)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="`sohsm lm compare --out` folders, one per seed")
    parser.add_argument("--runs", required=True, help="run names, comma-separated, in table order")
    parser.add_argument("--reference", help="a run to compare the others with, seed by seed")
    parser.add_argument("--output", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    if args.reference and args.reference not in runs:
        parser.error(f"--reference {args.reference} is not one of --runs")
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder")
    lines = table(args.folders, runs, args.reference)
    command = "python benchmarks/seed_means.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(f"Produced by `{command}`.\n\n" + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
