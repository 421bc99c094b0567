"""Time of one re-clustering (Algorithm 1) by its two solvers, and the memory of the statistics it reads.

The self-organized head re-assigns its words from ``q``, an ``N x C`` matrix of
cluster statistics (``C`` learned clusters, float32). ``solver="sequential"`` takes
the words one by one on the host (``q`` is copied there first when it lives on a
GPU); ``solver="deferred_acceptance"`` runs rounds of tensor operations on ``q``'s
device. Both give the same assignment (checked here on every size). ``q`` is drawn
as a trained head's is shaped: each word prefers a few clusters; ``tf`` is Zipf.

*in the head* times one whole re-clustering of a :class:`~sohsm.heads.SelfOrganizedSoftmax` with the
same ``q`` (``head.reassign``, with its defaults, ``solver="auto"``: the sequential solver on the
CPU, deferred acceptance on a GPU): Algorithm 1 plus moving every moved word's vector, gradient
and Adagrad state, and the head's bookkeeping; each time from fresh random clusters, so most words move.

*q as a run has it*: the most frequent ``--seen`` share of the words (10%) trained as above, every other
word still on q's starting row (the uniform ``-log2 C``), as early in a run, when most words have not
been seen; beside the same sizes with every row trained. Rows that tie made deferred acceptance take a
round per cluster (about ``N / max_size``) before the tie order of Algorithm 1 spread them.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/recluster.py                    # CPU
    python benchmarks/recluster.py --device cuda                        # a GPU, when there is one

Writes ``docs/benchmarks/recluster.md`` (``--output`` to change it).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import math
import statistics
import time
from pathlib import Path

import torch

from _machine import machine, write_page
from sohsm.clustering import default_max_cluster_size, default_n_clusters, greedy_assignment
from sohsm.clustering.deferred_acceptance import greedy_assignment_deferred
from sohsm.heads import Reclustering, SelfOrganizedSoftmax


def statistics_of(n: int, n_clusters: int, generator: torch.Generator,
                  device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``q`` in log2 units where each word prefers a few clusters, and Zipf term frequencies."""
    q = torch.randn(n, n_clusters, generator=generator) - math.log2(n_clusters)
    favourite = torch.randint(0, n_clusters, (n, 3), generator=generator)
    q.scatter_add_(1, favourite, torch.tensor([4.0, 2.0, 1.0]).expand(n, 3).contiguous())
    tf = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    return q.to(device), (tf / tf.sum()).to(device)


def run_statistics(n: int, n_clusters: int, seen: float, generator: torch.Generator,
                   device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q as a run has it: the most frequent ``seen`` share of the words trained, the rest on the start row."""
    q, tf = statistics_of(n, n_clusters, generator, device)
    q[math.ceil(n * seen):] = -math.log2(n_clusters)  # tf is Zipf by word id: the rarest words were not seen
    return q, tf


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def in_head(q: torch.Tensor, tf: torch.Tensor, dim: int, device: str, repeats: int) -> float:
    """Median seconds of ``head.reassign`` with statistics ``q``, from fresh random clusters each time."""
    n, n_clusters = q.shape
    counts = (tf * 1e9).round().clamp(min=1).cpu()
    times = []
    for repeat in range(repeats + 1):  # the first one warms up
        head = SelfOrganizedSoftmax(dim, n, counts=counts, n_clusters=n_clusters, shortlist=0, seed=repeat,
                                    reclustering=Reclustering(update_every=0)).to(device)
        optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
        head.attach(optimizer)
        for p in head.parameters():  # the optimizer state and a gradient exist, as in training
            p.grad = torch.ones_like(p)
        optimizer.step()
        head.q.copy_(q)
        sync(device)
        start = time.perf_counter()
        head.reassign(optimizer)
        sync(device)
        if repeat:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 44000, 100000])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dim", type=int, default=512, help="hidden size d of the head timed in place")
    parser.add_argument("--run-sizes", type=int, nargs="*", default=[50000, 256000, 1000000],
                        help="sizes timed with q as a run has it, beside random q")
    parser.add_argument("--seen", type=float, default=0.1, help="share of the words with trained rows")
    parser.add_argument("--run-repeats", type=int, default=1, help="timings (after a warm-up) at the run sizes")
    parser.add_argument("--sequential-up-to", type=int, default=256000,
                        help="largest run size the sequential solver is timed at (slow beyond it on a CPU)")
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).resolve().parents[1] / "docs/benchmarks/recluster.md")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in args.sizes:
        n_clusters = default_n_clusters(n)
        max_size = default_max_cluster_size(n, 1.5)
        q, tf = statistics_of(n, n_clusters, generator, args.device)
        sequential, first = timed(functools.partial(greedy_assignment, q, tf, max_size, 0.1), args.device,
                                  args.repeats)
        deferred, second = timed(functools.partial(greedy_assignment_deferred, q, tf, max_size, 0.1), args.device,
                                 args.repeats)
        same = torch.equal(first.assignment.cpu(), second.assignment.cpu())
        q_mib = q.numel() * q.element_size() / 2**20
        whole = in_head(q, tf, args.dim, args.device, args.repeats)
        rows.append((n, n_clusters, sequential, deferred, same, q_mib, whole))
        print(f"N={n:>7} C={n_clusters:>4}  sequential {sequential * 1e3:8.1f} ms  deferred acceptance "
              f"{deferred * 1e3:8.1f} ms  same assignment: {same}  q {q_mib:.1f} MiB  in the head "
              f"{whole * 1e3:8.1f} ms", flush=True)
    run_rows = []
    for n in args.run_sizes:
        n_clusters = default_n_clusters(n)
        max_size = default_max_cluster_size(n, 1.5)
        cells = {}
        for kind in ("random", "run"):
            q, tf = (statistics_of(n, n_clusters, generator, args.device) if kind == "random" else
                     run_statistics(n, n_clusters, args.seen, generator, args.device))
            deferred, result = timed(functools.partial(greedy_assignment_deferred, q, tf, max_size, 0.1), args.device,
                                     args.run_repeats)
            sequential = None
            if n <= args.sequential_up_to:
                sequential, first = timed(functools.partial(greedy_assignment, q, tf, max_size, 0.1), args.device,
                                          args.run_repeats)
                assert torch.equal(first.assignment.cpu(), result.assignment.cpu()), "the solvers disagree"
            cells[kind] = (sequential, deferred, result.rounds)
            del q, tf, result
        run_rows.append((n, n_clusters, cells))
        print(f"N={n:>7} C={n_clusters:>4}  " + "  ".join(
            f"{kind} q: sequential {'-' if seq is None else f'{seq:.2f} s'}, deferred {dfr:.2f} s in {rounds} rounds"
            for kind, (seq, dfr, rounds) in cells.items()), flush=True)
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    command = (f"python benchmarks/recluster.py --device {args.device} --dim {args.dim} --sizes "
               f"{' '.join(map(str, args.sizes))} --run-sizes {' '.join(map(str, args.run_sizes))} --seen {args.seen} "
               f"--run-repeats {args.run_repeats} --sequential-up-to {args.sequential_up_to}")
    lines = [
        "# Re-clustering: Algorithm 1 by its two solvers",
        "",
        f"Produced by `{command}` on "
        f"{datetime.date.today().isoformat()} ({machine()}, device `{device}`).",
        "",
        "One re-assignment of N words to C = ceil(sqrt(N)) clusters (at most ceil(1.5 N / C) words and 10% of "
        "the token mass each) from statistics q shaped like a trained head's (each word prefers a few "
        "clusters; Zipf term frequencies); median of "
        f"{args.repeats} after a warm-up. *sequential*: the words one by one on the host (`solver=\"sequential\"`, "
        "what `solver=\"auto\"`, the default, picks on the CPU); *deferred acceptance*: rounds of tensor operations on "
        "q's device "
        "(`solver=\"deferred_acceptance\"`). q: the statistics' memory (float32), which the head keeps "
        "beside its weights. *in the head*: one whole `head.reassign` of a self-organized head of "
        f"d = {args.dim} with the same q (its default solver for the device, moving the words' vectors, gradients "
        "and Adagrad state), from fresh random clusters; *in head / solver*: that over its solver's time alone.",
        "",
        "| N | C | sequential ms | deferred acceptance ms | same assignment | q MiB | in the head ms | in head / "
        "solver |",
        "|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for n, c, seq, dfr, same, q_mib, whole in rows:
        solver = dfr if args.device.startswith("cuda") else seq
        lines.append(f"| {n:,} | {c} | {seq * 1e3:.1f} | {dfr * 1e3:.1f} | {'yes' if same else 'NO'} | {q_mib:.1f} | "
                     f"{whole * 1e3:.1f} | {whole / solver:.2f}x |")
    if run_rows:
        lines += [
            "",
            "## q as a run has it",
            "",
            f"Produced by `{command}` (with the table above). The most "
            f"frequent {args.seen:.0%} of the words with trained rows (as above), every other word on q's "
            "starting row, as early in a run; beside it the same size with every row trained (*random q*). "
            "Seconds of one re-assignment by each solver (median of "
            f"{args.run_repeats} after a warm-up; both give the same assignment, checked where both ran); *rounds*: "
            "deferred acceptance's rounds of proposals; *run / random*: deferred acceptance's time with the "
            "run's q over its time with random q. Before Algorithm 1's tie order spread the tied rows over the "
            "clusters, deferred acceptance took 144 rounds at 50k words (15.5 s against 0.4 s with random q, one "
            "thread of this machine) and, measured earlier, 331.9 s against 3.4 s at 256k.",
            "",
            "| N | C | random q: sequential s | deferred s | rounds | run's q: sequential s | deferred s | rounds "
            "| run / random |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for n, c, cells in run_rows:
            (rs, rd, rr), (ss, sd, sr) = cells["random"], cells["run"]
            seq = lambda t: "skipped" if t is None else f"{t:.2f}"  # noqa: E731
            lines.append(f"| {n:,} | {c} | {seq(rs)} | {rd:.2f} | {rr} | {seq(ss)} | {sd:.2f} | {sr} | "
                         f"{sd / rd:.2f}x |")
        if any(n > args.sequential_up_to for n in args.run_sizes):
            lines += ["", f"*skipped*: the sequential solver is not timed above {args.sequential_up_to:,} words "
                      "(`--sequential-up-to`), to keep the page's run short on one CPU thread (it reads q on the host "
                      "a block "
                      "of rows at a time); a run on a GPU takes deferred acceptance."]
    write_page(args.output, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
