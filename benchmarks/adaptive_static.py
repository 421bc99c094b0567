"""Adaptive softmax's training step in its two forms: the peak memory each adds, on the CPU.

A CUDA graph replays a step whose shapes never change, so in a static step (:meth:`sohsm.heads.AdaptiveSoftmax.
set_static`) adaptive softmax scores every row against every tail cluster, where torch's module scores only the
rows whose target a tail holds (picked with ``nonzero``, a read back). This measures, for each vocabulary size, the
memory one training step of the head alone adds (forward, backward, a fused Adagrad step; the weights, gradients and
optimizer state already allocated by a step before) in each form, and the seconds a step takes, each in a fresh
process (peak resident memory, reset before the step). ``step_graph="auto"`` captures the step only where one copy of
the static form's tail scores stays within :data:`sohsm.heads.adaptive.STATIC_SCORE_BYTES`; the table says which it
takes. Writes docs/benchmarks/adaptive-static.md. Usage::

    OMP_NUM_THREADS=1 python benchmarks/adaptive_static.py            # N = 33,278 and 256,000; 2,560 rows; d = 512
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _machine import command_line, machine, write_page

SIZES = (33_278, 256_000)


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def one(n: int, rows: int, d: int, static: bool) -> dict:
    """In this process: the memory and seconds of one training step of the head (after one that allocated)."""
    import time

    import torch

    from sohsm import build_head
    from sohsm.heads.adaptive import STATIC_SCORE_BYTES

    torch.manual_seed(0)
    p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    p /= p.sum()
    head = build_head("adaptive", d, n, counts=(p * 1e9).round())
    head.set_static(static)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1, fused=True)
    hidden = torch.randn(rows, d)
    target = torch.multinomial(p.float(), rows, replacement=True)

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        head(hidden, target).loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    step()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as handle:  # the peak starts again from here
        handle.write("5")
    seconds = step()
    return {"n": n, "static": static, "rows": rows, "d": d, "added_bytes": _status("VmHWM") - before,
            "seconds": seconds, "overhead": head.static_overhead(), "cutoffs": head.cutoffs[:-1],
            "one_copy_bytes": rows * (head.cutoffs[-1] - head.cutoffs[0]) * 4,
            "auto_captures": head.static_decline(rows) is None, "budget_bytes": STATIC_SCORE_BYTES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="vocabulary sizes")
    parser.add_argument("--rows", type=int, default=2560, help="rows a step (batch 128 x 20 tokens)")
    parser.add_argument("--d", type=int, default=512, help="hidden size")
    parser.add_argument("--one", nargs=2, metavar=("N", "FORM"), help=argparse.SUPPRESS)  # a child process's cell
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
                        / "adaptive-static.md", help="where the table is written")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.rows, args.d, args.one[1] == "static")))
        return 0
    cells = []
    for n in args.sizes:
        for form in ("ordinary", "static"):
            out = subprocess.run([sys.executable, __file__, "--one", str(n), form, "--rows", str(args.rows),
                                  "--d", str(args.d)], capture_output=True, text=True, env=os.environ, check=True)
            cells.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(cells[-1], flush=True)
    import torch

    from sohsm.version import __version__

    lines = ["# Adaptive softmax's step: ordinary and static (a CUDA graph's form)", "",
             "Measured by `benchmarks/adaptive_static.py` (each cell in a fresh process) on "
             f"{machine()}, sohsm {__version__}. Command:", "",
             f"    {command_line(sys.argv)}", "",
             f"One training step of the head alone over {args.rows:,} rows, d = {args.d}, float32, Zipf counts "
             "(exponent 1), stock cutoffs. *Added* is the peak resident memory the step adds to the weights, "
             "gradients and optimizer state already there; *one copy* is a `[rows, sum n_i]` float32 buffer of "
             "every tail's scores, which the static form holds several of (scores, log-softmax, gradient).", "",
             "| N | cutoffs | form | added (MiB) | one copy (MiB) | s a step | static / ordinary scores | "
             "auto captures |", "|---|---|---|---|---|---|---|---|"]
    by = {(c["n"], c["static"]): c for c in cells}
    for n in args.sizes:
        for static in (False, True):
            c = by[(n, static)]
            lines.append(f"| {n:,} | {', '.join(f'{x:,}' for x in c['cutoffs'])} | "
                         f"{'static' if static else 'ordinary'} | {c['added_bytes'] / 2**20:,.0f} | "
                         f"{c['one_copy_bytes'] / 2**20:,.0f} | {c['seconds']:.3f} | {c['overhead']:.1f}x | "
                         f"{'yes' if c['auto_captures'] else 'no (eager)'} |")
    ratios = ", ".join(f"{by[(n, True)]['added_bytes'] / max(by[(n, False)]['added_bytes'], 1):.1f}x at {n:,}"
                       for n in args.sizes)
    lines += ["", f"The static form adds {ratios} the ordinary step's peak. `step_graph=\"auto\"` captures adaptive "
              f"softmax's step where one copy stays within {cells[0]['budget_bytes'] / 2**30:g} GiB "
              "(`sohsm.heads.adaptive.STATIC_SCORE_BYTES`) and keeps it eager beyond, where a graph would hold "
              "several copies for the whole run; `--step-graph on` captures it anyway. Whether the captured form is "
              "faster on a GPU at 33k words (its launches saved against a full softmax's arithmetic in the tails) "
              "is for `benchmarks/step_graph_gpu.sh` to measure; no GPU has run it yet.", "",
              f"torch {torch.__version__}."]
    write_page(args.output, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
