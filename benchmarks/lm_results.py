"""Summarise language-model runs into docs/results/: a table, the Figure-1 plot, learned clusters.

A thin wrapper around :mod:`sohsm.runs.report` for runs trained one by one
with `sohsm lm train`; `sohsm lm compare` trains a set of heads and writes the
same report itself. Every number comes from the run directories named on the
command line. Usage::

    python benchmarks/lm_results.py runs/wt2-full runs/wt2-self_organized ... \
        --title "WikiText-2, equal time" --output docs/results/lm-wikitext-2.md
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from sohsm.runs.plots import figure1
from sohsm.runs.report import cluster_lines, results_table, summarise_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--title", default="Language models")
    parser.add_argument("--output", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--clusters", type=int, default=8, help="learned clusters to list")
    parser.add_argument("--words", type=int, default=10, help="words shown per cluster")
    args = parser.parse_args(argv)

    try:
        rows = [summarise_run(run) for run in args.runs]
    except ValueError as error:
        parser.error(str(error))
    lines = [
        f"## {args.title}",
        "",
        "Produced by `python benchmarks/lm_results.py " + shlex.join(sys.argv[1:] if argv is None else argv) + "`.",
        "",
        *results_table(rows),
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    organized = [run for run, r in zip(args.runs, rows) if r.head == "self_organized"]
    if organized:
        picture = args.output.with_name(args.output.stem + "-figure1.png")
        shutil.copyfile(figure1(args.runs, out=organized[0] / "figure1.png"), picture)
        lines += ["", f"Figure 1 (all runs; re-clusterings of the self-organized run): ![Figure 1]({picture.name})",
                  "", "Learned clusters of the self-organized run:", "",
                  *cluster_lines(organized[0], top=args.clusters, words=args.words)]
    text = "\n".join(lines) + "\n"
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
