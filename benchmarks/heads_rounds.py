"""The heads benchmark run several times, each run its own process: how far a ratio between two heads moves.

``benchmarks/heads.py`` times its heads side by side in one process, and its table gives the ratios of that one
process. Where the output layer is bound by memory (an Adagrad step over a weight of N x d floats), a ratio also
moves with the process's history: which heads ran before, what the allocator kept of their buffers. This script
runs ``heads.py`` ``--rounds`` times (each its own process, one thread) and reports, round by round, each head's time
against the reference head's (default: adaptive softmax), and the median and range over the rounds: what a claim
such as "1.5x adaptive softmax's layer" should be read against.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/heads_rounds.py              # writes docs/benchmarks/heads-rounds.md
    OMP_NUM_THREADS=1 python benchmarks/heads_rounds.py --rounds 3 --heads full adaptive self_organized
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _machine import command_line, machine, write_page
from heads_against import COLUMNS, ROOT, run_heads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of heads.py, each its own process (default: 5)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[44000])
    parser.add_argument("--repeats", type=int, default=5, help="heads.py's repetitions per run (default: 5)")
    parser.add_argument("--heads", nargs="+",
                        default=["full", "adaptive", "self_organized", "self_organized-banded"])
    parser.add_argument("--reference", default="adaptive", help="the head every ratio is taken against")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks" / "heads-rounds.md")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.reference not in args.heads:
        parser.error(f"--reference {args.reference!r} is not among --heads")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            rounds.append(run_heads(ROOT, args, Path(tmp) / f"round-{round_}.md"))
            print(f"round {round_} of {args.rounds} done", flush=True)

    names = [name for name in args.heads if name != args.reference]
    per_round = ["| N | round | head | " + " | ".join(f"{c} | {args.reference} / head" for _, c in COLUMNS) + " |",
                 "|---:|---:|---|" + "---:|---:|" * len(COLUMNS)]
    summary = ["| N | head | " + " | ".join(f"{args.reference} / head, {c}: median (min - max)" for _, c in COLUMNS)
               + " |", "|---:|---|" + "---:|" * len(COLUMNS)]
    for n in args.sizes:
        reference = [r[(n, args.reference)] for r in rounds]
        for i, figures in enumerate(reference, 1):
            per_round.append(f"| {n:,} | {i} | {args.reference} | "
                             + " | ".join(f"{value:.1f} | 1.00" for value in figures) + " |")
        for name in names:
            ratios = [[ref[c] / r[(n, name)][c] for c in range(len(COLUMNS))] for ref, r in zip(reference, rounds)]
            for i, r in enumerate(rounds, 1):
                per_round.append(f"| {n:,} | {i} | {name} | "
                                 + " | ".join(f"{r[(n, name)][c]:.1f} | {ratios[i - 1][c]:.2f}"
                                              for c in range(len(COLUMNS))) + " |")
            cells = []
            for c in range(len(COLUMNS)):
                column = [ratio[c] for ratio in ratios]
                cells.append(f"{statistics.median(column):.2f}x ({min(column):.2f} - {max(column):.2f})")
            summary.append(f"| {n:,} | {name} | " + " | ".join(cells) + " |")

    command = "python benchmarks/heads_rounds.py " + command_line(argv if argv is not None else sys.argv[1:])
    lines = [
        "# The heads benchmark, run after run", "",
        f"Produced by `OMP_NUM_THREADS=1 {command.strip()}` ({machine()}).", "",
        f"`benchmarks/heads.py --sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats} --heads "
        f"{' '.join(args.heads)}`, {args.rounds} times, each its own process on one thread. Each round's ratio is "
        f"{args.reference}'s time over the head's, both from that round's process (above 1: the head is faster).", "",
        *summary, "", "Round by round (milliseconds):", "", *per_round]
    print("\n".join(lines))
    write_page(args.output, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
