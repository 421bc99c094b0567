"""The files of a run directory, atomic writes, and checkpoints as dicts of state_dicts.

A run directory holds::

    config.json     the run config (written at the start; ``task`` names the task, absent in older language-model runs)
    .lock           held by the trainer writing the run (:mod:`sohsm.train.lock`)
    vocab.json      the vocabulary (also inside every checkpoint)
    tokenizer.json  a subword run's tokenizer (:mod:`sohsm.data.subwords`), read again to resume or use the run
    metrics.jsonl   one JSON record per line: kind = train / eval / recluster
    last.pt         the latest checkpoint (every checkpoint_every steps and at the end)
    best.pt         the checkpoint with the best dev perplexity so far

A checkpoint is a plain dict (``torch.load(..., weights_only=True)`` reads it)::

    format, model, head, optimizer       (state_dicts; best.pt has no optimizer: it is read to evaluate, decode and
                                          inspect, a resume reads last.pt; Adam's two moments were 2/3 of an s2s one)
    config, vocab                        (dicts)
    rng: {torch, cuda}                   position: {epoch, ...the task's: row and state for a language model}
    step, tokens, elapsed_s, best_ppl, log (the open train-record interval)
    signature: {head, clusters, K, vocab_size, corpus, seed, version}
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from sohsm.atomic_writes import ATOMIC_SUFFIX, write_atomic  # noqa: F401  (write_atomic: where run files are written)
from sohsm.data.subwords import TOKENIZER_FILE
from sohsm.data.vocab import Vocabulary, vocabulary_difference
from sohsm.train.early import CONFIG_FILE

#: the ``format`` of every sohsm checkpoint: ``sohsm.<task>-checkpoint/<version>``
_FORMAT = re.compile(r"sohsm\.([A-Za-z0-9_]+)-checkpoint/[0-9]+")
VOCAB_FILE = "vocab.json"
METRICS_FILE = "metrics.jsonl"
LAST = "last.pt"
BEST = "best.pt"
CHECKPOINTS = {"last": LAST, "best": BEST}
#: the files of a run directory that are written atomically (:func:`sohsm.atomic_writes.atomic_output`)
RUN_FILES = (CONFIG_FILE, VOCAB_FILE, TOKENIZER_FILE, METRICS_FILE, LAST, BEST)


def remove_orphans(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files a killed write left in ``run_dir``; returns what was removed.

    Only the temporary files of :data:`RUN_FILES` (``.last.pt.*.tmp``, ...) are touched, and the
    ``.part`` files that earlier versions wrote for ``vocab.json``. Call it only while holding the run's lock: a
    running trainer's
    temporary file is not an orphan.
    """
    removed = []
    for name in RUN_FILES:
        for suffix in (ATOMIC_SUFFIX.lstrip("."), "part"):
            for path in Path(run_dir).glob(f".{name}.*.{suffix}"):
                try:
                    path.unlink()
                    removed.append(path)
                except OSError:
                    pass
    return removed


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def save_checkpoint(path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> None:
    """Write a checkpoint dict atomically (temporary file + ``os.replace``)."""
    write_atomic(path, lambda handle: torch.save(checkpoint, handle))


def checkpoint_format(task: str) -> str:
    """The ``format`` of the checkpoints of task ``task``: ``sohsm.lm-checkpoint/1``."""
    return f"sohsm.{task}-checkpoint/1"


def format_task(format: Any) -> str | None:
    """The task a checkpoint ``format`` names (``"lm"``), ``None`` if it is not a sohsm checkpoint's."""
    match = _FORMAT.fullmatch(format) if isinstance(format, str) else None
    return match.group(1) if match else None


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu",
                    formats: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain containers only).

    Args:
        formats: the ``format`` values accepted; ``None``: the checkpoint of any task.

    Raises:
        ValueError: the file is missing, unreadable or not a sohsm checkpoint of one of ``formats``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise ValueError(f"{path}: not a readable checkpoint ({_load_failure(error)}){_other_checkpoint(path)}") \
            from None
    found = format_task(checkpoint.get("format")) if isinstance(checkpoint, dict) else None
    if found is None or (formats is not None and checkpoint["format"] not in formats):
        kind = f" {format_task(formats[0])}" if formats is not None and len(formats) == 1 else ""
        raise ValueError(f"{path}: not a sohsm{kind} checkpoint" + (f" (it is a {found} checkpoint)" if found else ""))
    return checkpoint


def _load_failure(error: Exception) -> str:
    """torch's reason a checkpoint did not load, in one line: its first sentence, without its advice to load with
    ``weights_only=False`` (unsafe for a file one did not write, and no help for a damaged one); a file cut short
    (a write that never finished, a full disk, a copy stopped) said as such."""
    text = str(error)
    if "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if found:
            return (f"it holds Python objects ({found.group(1)}) besides tensors and plain containers, which a sohsm "
                    "checkpoint never does")
        found = re.search(r"WeightsUnpickler error: (.+?)\s*(?:Check the documentation|$)", " ".join(text.split()))
        return "not a file torch.save wrote" + (f": {found.group(1)}" if found else "")
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    if isinstance(error, EOFError) or "zip archive" in first:
        return f"the file is cut short or damaged: {first or 'it ends too early'}"
    if isinstance(error, OSError):  # the machine's reason (permissions, a folder in its place)
        return error.strerror or first or type(error).__name__
    return f"not a file torch.save wrote, or a damaged one ({type(error).__name__}{': ' + first if first else ''})"


def _step_of(path: Path) -> int | None:
    """The step of a readable checkpoint at ``path``, read without its weights; ``None`` if it does not read."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # torch raises many types for a damaged file
        return None


def _other_checkpoint(path: Path) -> str:
    """``"; best.pt beside it is intact (step 800)"``: the run's other checkpoint, where ``path`` is one of a
    run's and the other reads."""
    other = {LAST: BEST, BEST: LAST}.get(path.name)
    if other is None or not (path.parent / other).is_file():
        return ""
    step = _step_of(path.parent / other)
    return (f"; {other} beside it is intact (step {step:,})" if step is not None
            else f"; {other} beside it is damaged too")


def check_same_data(where: str | os.PathLike[str], trained_vocab: Vocabulary, trained_on: str, vocab: Vocabulary,
                    signature: str, data: str = "the data") -> None:
    """Refuse data whose vocabulary or files differ from those a checkpoint was trained on.

    Args:
        where: the checkpoint or run, for the message.
        trained_vocab: the checkpoint's vocabulary.
        trained_on: the checkpoint's corpus signature (``signature["corpus"]``).
        vocab: the vocabulary of the data as read now.
        signature: the corpus signature of the data as read now.
        data: what the data is called in the message (``"corpus 'ptb'"``).

    Raises:
        ValueError: naming what differs.
    """
    if trained_vocab != vocab:
        raise ValueError(
            f"the vocabulary of {where} differs from that of {data} as read now "
            f"({vocabulary_difference(trained_vocab, vocab)}); the data or its vocabulary options changed "
            "since the run started"
        )
    if trained_on != signature:
        raise ValueError(f"{where} was trained on [{trained_on}] but the data is now [{signature}]")


@contextmanager
def reading_checkpoint(path: str | os.PathLike[str], values: bool = False) -> Iterator[None]:
    """Turn the errors of using a hand-edited or foreign checkpoint's contents into one ValueError.

    A checkpoint that passes :func:`load_checkpoint` can still lack a key, hold a
    value of the wrong type, or tensors of the wrong shape for its config
    (``load_state_dict`` then raises a many-line RuntimeError). With ``values``, a
    ValueError (a config or vocabulary inside that does not parse) is one of them.
    """
    errors: tuple[type[Exception], ...] = (KeyError, TypeError, AttributeError, IndexError, RuntimeError)
    try:
        yield
    except errors + ((ValueError,) if values else ()) as error:  # noqa: B030 (a tuple of exception classes)
        detail = " ".join(str(error).split())
        if len(detail) > 200:
            detail = detail[:200] + " ..."
        what = f"missing {detail}" if isinstance(error, KeyError) else detail
        raise ValueError(f"{path}: a damaged or foreign checkpoint, not one this run wrote ({what})") from None


def checkpoint_path(run_dir: str | os.PathLike[str], which: str = "best") -> Path:
    """``run_dir/best.pt`` or ``run_dir/last.pt``; ``best`` falls back to ``last`` before any evaluation.

    Raises:
        ValueError: ``which`` is neither, or the run has no checkpoint.
    """
    if which not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {', '.join(CHECKPOINTS)}, got {which!r}")
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINTS[which]
    if not path.is_file() and which == "best" and (run_dir / LAST).is_file():
        path = run_dir / LAST
    if not path.is_file():
        if run_dir.exists() and not run_dir.is_dir():
            raise ValueError(f"{run_dir} is a file, not a run directory (a folder written by training)")
        if not run_dir.is_dir():
            raise ValueError(f"{run_dir} is not a run directory (it does not exist)")
        raise ValueError(f"{run_dir} holds no checkpoint ({CHECKPOINTS[which]}); is it a training run directory?")
    return path


def format_signature(signature: dict[str, Any]) -> str:
    """One line in sacrebleu's spirit: ``head:self_organized|clusters:100|K:1000|vocab:10000|...``."""
    return "|".join(f"{key}:{value}" for key, value in signature.items())
