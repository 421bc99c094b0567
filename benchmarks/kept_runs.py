"""The frame every results table shares: train (or resume) one ``sohsm lm train`` run, evaluate its best checkpoint,
and keep what a table needs in the repository (never checkpoints).

``fair_quality.py``, ``subword.py`` and ``tuning.py`` each decide which runs a protocol has and how its table reads;
this module is how any one of those runs is trained and kept, so that resuming, failures and what is kept behave the
same in all of them.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

#: the files of a run a table reads (besides the evaluations, written as ``SPLIT.json``)
KEPT = ("config.json", "metrics.jsonl")


def sohsm(*args: str) -> subprocess.CompletedProcess:
    """``python -m sohsm ARGS`` in this interpreter, its output captured."""
    return subprocess.run([sys.executable, "-m", "sohsm", *args], check=False, capture_output=True, text=True)


def _last_line(done: subprocess.CompletedProcess) -> list[str]:
    return done.stderr.strip().splitlines()[-1:]


def train(run: Path, new_run: list[str], label: str) -> bool:
    """Train the run in ``run`` (``sohsm lm train NEW_RUN --run-dir RUN``), or resume it where a checkpoint is there
    already; False (with one line saying why) where it failed."""
    args = (["lm", "train", "--run-dir", str(run), "--resume"] if (run / "last.pt").exists() else
            ["lm", "train", *new_run, "--run-dir", str(run)])
    print(f"{label}: sohsm {' '.join(args)}", flush=True)
    done = sohsm(*args)
    if done.returncode != 0:
        print(f"  {label} failed ({done.returncode}): {_last_line(done)}", flush=True)
    return done.returncode == 0


def evaluate(run: Path, split: str, label: str, device: str = "cpu") -> dict | None:
    """``sohsm lm eval RUN --split SPLIT --json`` of the run's best checkpoint, with the checkpoint's file name only
    (no machine's path in the repository); None (with one line saying why) where it failed."""
    done = sohsm("lm", "eval", str(run), "--split", split, "--device", device, "--json")
    if done.returncode != 0:
        print(f"  {label} {split} evaluation failed: {_last_line(done)}", flush=True)
        return None
    result = json.loads(done.stdout)
    result["checkpoint"] = Path(result["checkpoint"]).name
    return result


def keep(run: Path, kept: Path, evaluations: dict[str, dict]) -> None:
    """Copy the run's ``config.json`` and ``metrics.jsonl`` to ``kept``, and each evaluation as ``SPLIT.json``."""
    kept.mkdir(parents=True, exist_ok=True)
    for file in KEPT:
        shutil.copyfile(run / file, kept / file)
    for split, result in evaluations.items():
        (kept / f"{split}.json").write_text(json.dumps(result, indent=1) + "\n")
