"""The metrics log of a run: ``metrics.jsonl``, and TensorBoard when it is installed.

One JSON object per line, each with ``kind``, ``step``, ``tokens`` (training
tokens so far) and ``elapsed_s`` (training seconds so far, evaluation excluded),
then values whose names carry their units:

* ``train``: ``nll_nats``, ``ppl`` (mean over the ``interval_steps`` steps since
  the previous train record), ``tokens_per_s``, ``lr``, ``epoch``; a head trained
  on a sampled objective writes ``objective`` (its name) and ``loss`` instead of
  ``nll_nats`` and ``ppl`` (its evaluation records are exact NLL and ppl);
* ``eval``: ``split``, ``nll_nats``, ``ppl``, ``ppl_cluster``, ``ppl_in_cluster``
  (``null`` for heads without clusters), ``eval_tokens``, ``tokens_per_s``;
* ``recluster``: ``change_rate``, ``moved_tf_mass``, ``empty_clusters``,
  ``fallback_words`` (one per re-assignment of a self-organized head).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from sohsm.atomic_writes import WriteError
from sohsm.train.checkpoint import METRICS_FILE, write_atomic


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file, in order; a torn last line (a crash mid-write) is skipped.

    Raises:
        ValueError: the file is not UTF-8 text (naming it).
    """
    records = []
    with open(path, encoding="utf-8") as handle:
        try:
            for line in handle:
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not a metrics log (not UTF-8 text: {error.reason} at byte "
                             f"{error.start} of a block after record {len(records)})") from None
    return records


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends records to ``metrics.jsonl`` (flushed per record) and mirrors numbers to TensorBoard.

    Args:
        run_dir: the run directory.
        keep_until_step: on resume, records past this step (written after the
            checkpoint being resumed) are dropped first, so the log continues
            exactly where the checkpoint stopped.
        tensorboard: mirror scalars to ``run_dir/tensorboard`` if the
            ``tensorboard`` package is importable; silently skipped otherwise.
    """

    def __init__(self, run_dir: str | os.PathLike[str], keep_until_step: int | None = None,
                 tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if keep_until_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= keep_until_step]
            text = "".join(json.dumps(r) + "\n" for r in kept)
            write_atomic(self.path, lambda handle: handle.write(text.encode("utf-8")))
        try:
            self._handle = open(self.path, "a", encoding="utf-8")
        except OSError as error:
            raise WriteError(error.errno, error.strerror, str(self.path)) from None
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception:  # tensorboard not installed (or broken): no mirror
                pass
            else:
                self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        record = {key: _clean(value) for key, value in record.items()}
        try:
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()
        except OSError as error:  # a full disk: name the file
            raise WriteError(error.errno, error.strerror, str(self.path)) from None
        if self._writer is not None:
            kind, step = record.get("kind", "record"), int(record.get("step", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step",):
                    self._writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        self._handle.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
