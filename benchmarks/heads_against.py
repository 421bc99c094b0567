"""The heads benchmark of this checkout against another revision, taking turns, so that both see the same load.

``benchmarks/heads.py`` measures the heads side by side inside one process; this script asks the same of two
versions of the code: a revision is checked out into a temporary worktree, then the two run
``benchmarks/heads.py`` one after the other, ``--rounds`` times (each its own process, one thread), and the
median of each figure over the rounds is reported with the ratio new / old. What a speed claim of a release
("no speed lost") needs: on a shared machine two runs minutes apart can differ by 2x, two interleaved ones
much less.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/heads_against.py 965619a          # writes docs/benchmarks/heads-against.md
    OMP_NUM_THREADS=1 python benchmarks/heads_against.py v0.1 --rounds 2 --heads full self_organized
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import machine, write_page

ROOT = Path(__file__).resolve().parent.parent
#: the columns of heads.py's speed table this report keeps: (column index, name)
COLUMNS = ((2, "fwd+bwd ms"), (4, "fwd+bwd + Adagrad step ms"))


def run_heads(tree: Path, args, output: Path) -> dict[tuple[int, str], list[float]]:
    """One run of ``tree``'s ``benchmarks/heads.py``: ``{(N, head): [figure per COLUMNS]}`` from its speed table."""
    command = [sys.executable, "benchmarks/heads.py", "--sizes", *map(str, args.sizes), "--repeats", str(args.repeats),
               "--large-size", "0", "--heads", *args.heads, "--output", str(output)]
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/heads.py failed in {tree}: {done.stderr.strip().splitlines()[-1:]}")
    figures = {}
    for line in output.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 9 and re.fullmatch(r"[\d,]+", cells[0]) and cells[1] in args.heads:
            figures[(int(cells[0].replace(",", "")), cells[1])] = [float(cells[i]) for i, _ in COLUMNS]
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the revision to compare with (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each version, taking turns (default: 3)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[44000])
    parser.add_argument("--repeats", type=int, default=3, help="heads.py's repetitions per run (default: 3)")
    parser.add_argument("--heads", nargs="+", default=["full", "adaptive", "two_level_frequency", "self_organized"])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks" / "heads-against.md")
    args = parser.parse_args(argv)
    rev = subprocess.run(["git", "rev-parse", "--short", args.revision], cwd=ROOT, capture_output=True, text=True)
    if rev.returncode != 0:
        parser.error(f"no such revision: {args.revision}")
    old_rev = rev.stdout.strip()
    new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    results: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old_tree), old_rev], cwd=ROOT, check=True)
        try:
            for round_ in range(1, args.rounds + 1):
                for which, tree in (("old", old_tree), ("new", ROOT)):
                    results[which].append(run_heads(tree, args, Path(tmp) / f"{which}-{round_}.md"))
                    print(f"round {round_}: {which} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT)
    keys = sorted(set(results["old"][0]) & set(results["new"][0]), key=lambda k: (k[0], args.heads.index(k[1])))
    header = ("| N | head | " + " | ".join(f"{name} {old_rev} | {name} {new_rev} | new / old" for _, name in COLUMNS)
              + " |")
    rows = [header, "|---:|---|" + "---:|---:|---:|" * len(COLUMNS)]
    for key in keys:
        cells = []
        for i in range(len(COLUMNS)):
            old = statistics.median(r[key][i] for r in results["old"])
            new = statistics.median(r[key][i] for r in results["new"])
            cells += [f"{old:.1f}", f"{new:.1f}", f"{new / old:.2f}"]
        rows.append(f"| {key[0]:,} | {key[1]} | " + " | ".join(cells) + " |")
    command = "python benchmarks/heads_against.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# The heads benchmark against an earlier revision", "",
        f"Produced by `OMP_NUM_THREADS=1 {command}` ({machine()}).", "",
        f"`benchmarks/heads.py --sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats}` of revision "
        f"{old_rev} and of {new_rev}, taking turns, {args.rounds} rounds, each its own process on one thread; "
        "the median of each figure over the rounds (milliseconds; new / old below 1 is faster now). Each head's "
        "medians are taken on their own, not paired: a head whose code did not change between the revisions shows "
        "the noise left (heads.py's own table, one process, is the one for ratios between heads).", "",
        *rows]
    print("\n".join(lines))
    write_page(args.output, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
