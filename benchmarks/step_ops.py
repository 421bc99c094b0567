"""How many torch ops one ordinary training step issues, head by head: a GPU's launch-bound cost, counted on a CPU.

A small model's step on a GPU is bound by the host: each op costs it tens of microseconds to issue (Python, dispatch,
launch) whatever the op's size, so the ops a step issues, not its arithmetic, set its time (on an H200, LSTM 512 at
33k words: the full softmax, adaptive softmax and the banded default took 34-40 us of step per op counted here,
docs/benchmarks/gpu.md). This runs ``sohsm lm train`` in-process for each ``--head`` given (the other arguments are
passed on), profiles steps 6-21 (after the start; a run first re-clusters at its step K, later than these) and prints
the ops that do work per step (views, aliases and allocations left out), by stage. ``--fold-every`` sets how many
batches the sync-free path folds into ``q`` at once (``device_statistics``; 1: every batch, as before it kept them
waiting): a row each. Writes the table to docs/benchmarks/step-ops.md. Usage::

    OMP_NUM_THREADS=1 python benchmarks/step_ops.py --corpus wikitext-2 --batch-size 128 \\
        --head "self_organized --head-option backend=grouped_torch" \\
        --head "self_organized --head-option backend=grouped_torch --head-option div_value=null" \\
        --head adaptive --head full --fold-every 1 8

``backend=grouped_torch`` is the sync-free path a GPU takes (in plain torch where the GPU runs Triton kernels), so the
count is the GPU step's shape, not its CPU time.
"""
from __future__ import annotations

import argparse
import collections
import shlex
import sys
import tempfile
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

#: ops that launch no kernel: views, aliases, allocations, metadata
FREE = {"aten::as_strided", "aten::resolve_conj", "aten::alias", "aten::view", "aten::lift_fresh", "aten::detach",
        "aten::detach_", "aten::_nnz", "aten::sparse_dim", "aten::dense_dim", "aten::empty", "aten::empty_strided",
        "aten::resize_", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze", "aten::t", "aten::transpose",
        "aten::expand", "aten::slice", "aten::select", "aten::_local_scalar_dense", "aten::permute", "aten::narrow",
        "aten::reshape", "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::is_nonzero",
        "aten::item", "aten::_unsafe_view", "aten::result_type", "aten::_values", "aten::_indices",
        "aten::is_coalesced", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::flatten", "aten::movedim",
        "aten::conj", "aten::_conj", "aten::set_"}
PROFILED = range(6, 22)  # sixteen steps: two folds of the statistics on the sync-free path (device_statistics)


class _Enough(Exception):
    """Raised after the last profiled step: the rest of the run is not needed."""


def _stage(event) -> str:
    """``optimizer``, ``backward`` or ``forward`` (and the rest of the step) by the event's outermost scope."""
    names = []
    parent = event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    for name in reversed(names):
        if name.startswith("Optimizer.step"):
            return "optimizer"
        if name.startswith("autograd::engine"):
            return "backward"
    return "forward"


def count(train_args: list[str]) -> tuple[float, collections.Counter]:
    """Ops per profiled step, and per stage, of one ``sohsm lm train`` run."""
    from sohsm.cli.main import main
    from sohsm.train.step import TrainStep

    original, profiles = TrainStep.__call__, []

    def profiled(self, batch, step):
        if step > PROFILED[-1]:
            raise _Enough
        if step not in PROFILED:
            return original(self, batch, step)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = original(self, batch, step)
        profiles.append(prof.events())
        return out

    TrainStep.__call__ = profiled
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            rc = main(["lm", "train", *train_args, "--run-dir", str(Path(run_dir) / "run"), "--quiet"])
    except _Enough:
        rc = 0
    finally:
        TrainStep.__call__ = original
    if rc != 0 or len(profiles) != len(PROFILED):
        raise SystemExit(f"sohsm lm train {' '.join(train_args)}: exit {rc}, {len(profiles)} steps profiled")
    stages = collections.Counter()
    for events in profiles:
        for e in events:
            if e.name.startswith("aten::") and e.name not in FREE and not any(
                    c.name.startswith("aten::") and c.name not in FREE for c in e.cpu_children):
                stages[_stage(e)] += 1
    return sum(stages.values()) / len(profiles), collections.Counter(
        {k: v / len(profiles) for k, v in stages.items()})


def main() -> int:
    from sohsm.heads.two_level.self_organizing import device_statistics

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", action="append", required=True,
                        help="a head and its options as on the command line (repeat for each row)")
    parser.add_argument("--fold-every", type=int, nargs="+", default=[device_statistics.FOLD_EVERY],
                        help="batches folded into q at once on the sync-free path: a row of each self-organized "
                             f"head for each value (default: the library's, {device_statistics.FOLD_EVERY})")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
                        / "step-ops.md", help="where the table is written (default: docs/benchmarks/step-ops.md)")
    args, rest = parser.parse_known_args()
    common = [*rest, "--eval-every", "0", "--checkpoint-every", "0"]
    rows = []
    for head in args.head:
        for fold in (args.fold_every if head.split()[0] == "self_organized" else [None]):
            if fold is not None:
                device_statistics.FOLD_EVERY = fold
            total, stages = count([*common, "--head", *shlex.split(head)])
            rows.append((head, fold, total, stages))
            print(f"{head} (q folded every {fold}): {total:.0f} ops a step", file=sys.stderr, flush=True)
    lines = [f"# Torch ops a training step, head by head\n",
             f"`python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}`\n",
             f"`sohsm lm train {' '.join(rest)}`, steps {PROFILED.start}-{PROFILED.stop - 1}: ops that do work "
             "(views, aliases and allocations left out), by stage. A GPU launches a kernel for about each; on the CPU "
             "clipping and the optimizer are counted per parameter, where a GPU groups them (foreach).\n",
             "| head | q folded every | ops a step | forward | backward | optimizer |",
             "|---|---:|---:|---:|---:|---:|"]
    for head, fold, total, stages in rows:
        lines.append(f"| `{head}` | {fold or '-'} | {total:.0f} | {stages['forward']:.0f} | {stages['backward']:.0f} | "
                     f"{stages['optimizer']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
