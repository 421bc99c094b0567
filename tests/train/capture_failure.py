"""A CUDA run whose capture fails, then what the failure left behind, in a process of its own (an abort takes only it).

``python tests/train/capture_failure.py KIND CORPUS WORK``: KIND ``python`` (the head raises a Python-level error
while capturing: torch's capture ends successfully) or ``cuda`` (it reads a value back: a CUDA error invalidates
the capture). Then the failed graph is collected, ``empty_cache`` must free the default pool's cache (not while the
allocator still thinks a capture is under way), no private pool may keep memory, and a second run in the same
process must capture and replay. Prints one line; exits 0 where all of that holds.
"""
from __future__ import annotations

import gc
import sys

import torch

from sohsm.cli.main import main
from sohsm.heads.full import FullSoftmax
from sohsm.train import step_graph as step_graph_module

SMALL = ["--device", "cuda", "--emb-size", "32", "--hidden-size", "32", "--batch-size", "8", "--bptt", "6",
         "--quiet", "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "1", "--seed", "3",
         "--head", "full", "--dropout", "0.2", "--max-tokens", str(30 * 48), "--step-graph", "on"]


def _failing(kind: str):
    forward = FullSoftmax.forward

    def fails_while_capturing(self, hidden, target):
        if torch.cuda.is_current_stream_capturing():
            if kind == "python":
                raise ValueError("a check that fails only while capturing")
            out = forward(self, hidden, target)
            float(out.loss.detach())  # a host read: a CUDA error, the capture invalidated
            return out
        return forward(self, hidden, target)

    return forward, fails_while_capturing


def main_(kind: str, corpus: str, work: str) -> int:
    made = []
    init = step_graph_module.StepGraph.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    step_graph_module.StepGraph.__init__ = keep
    forward, failing = _failing(kind)
    FullSoftmax.forward = failing
    first = main(["lm", "train", "--corpus", corpus, "--run-dir", f"{work}/failed", *SMALL])
    FullSoftmax.forward = forward
    failed = made[0].failed
    made.clear()
    gc.collect()  # the failed graph's destructor (kept alive by the error's traceback until the run ended)
    torch.cuda.synchronize()
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del block
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    freed = reserved - torch.cuda.memory_reserved()
    pools = sorted({tuple(s.get("segment_pool_id", (0, 0))) for s in torch.cuda.memory._snapshot()["segments"]}
                   - {(0, 0)})
    second = main(["lm", "train", "--corpus", corpus, "--run-dir", f"{work}/next", *SMALL])
    graph = made[0]
    ok = (first == 0 and bool(failed) and freed >= 64 << 20 and not pools and second == 0 and graph.failed is None
          and graph.captures == 1 and graph.replays > 0)
    print(f"{kind}: first run rc {first} ({failed}); empty_cache freed {freed / 2**20:.0f} MiB; private pools with "
          f"memory {pools}; next run rc {second}, captures {graph.captures}, replays {graph.replays}, "
          f"failed {graph.failed}: {'ok' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main_(*sys.argv[1:4]))
