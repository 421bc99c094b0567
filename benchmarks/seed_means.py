"""Best dev perplexity of the same runs over several seeds, with the mean: one table, one command.

(`sohsm lm compare --seeds 1,2,3` trains and reports such a comparison in one command; this script
tabulates folders made by separate `lm compare --seed S` commands.)

Each folder is the ``--out`` of one ``sohsm lm compare`` (same settings, another ``--seed``); a run
missing from a folder, or one that has not yet trained as many epochs as the others, shows as "–" and
leaves that seed out of the mean of its row, which then says over how many seeds it was taken. Every
number is read from the run directories. Usage::

    python benchmarks/seed_means.py runs/wt2 runs/wt2-s2 runs/wt2-s3 \
        --runs self_organized,two_level_frequency --reference two_level_frequency
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sohsm.runs.report import seed_table


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
    lines = seed_table(args.folders, runs, args.reference)
    command = "python benchmarks/seed_means.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(f"Produced by `{command}`.\n\n" + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
