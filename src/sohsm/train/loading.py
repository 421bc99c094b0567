"""Loading a finished (or running) run: one reader for every task.

The checkpoint is read once; its config names the task (``"task"``, absent in
older language-model runs), and the task builds the model and head that its
state dicts are loaded into::

    best.pt --load_checkpoint--> {config, vocab, model, head, ...} --task_of_dict(config)--> task
            --task.build_saved(config, vocab, head state)--> (model, head) <--load_state_dict-- state dicts
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head
from sohsm.train.builders import resolve_device
from sohsm.train.checkpoint import checkpoint_path, load_checkpoint, reading_checkpoint
from sohsm.train.config import RunConfig
from sohsm.train.guard import check_loaded_parameters
from sohsm.train.task import Task, task_of_dict


@dataclass
class LoadedRun:
    """A run's model and head as saved in one checkpoint, in evaluation mode.

    Attributes:
        run_dir: the run directory.
        path: the checkpoint file read.
        task: the task that trained it.
        config: the run's configuration.
        vocab: its vocabulary.
        model, head: the trained modules.
        step, tokens: training steps and tokens when the checkpoint was written.
        best_ppl: best dev perplexity when it was written.
        signature: head, clusters, K, vocabulary, corpus, seed, version.
    """

    run_dir: Path
    path: Path
    task: type[Task]
    config: RunConfig
    vocab: Vocabulary
    model: nn.Module
    head: Head
    step: int
    tokens: int
    best_ppl: float | None
    signature: dict[str, Any]


def load_run(run_dir: str | os.PathLike[str], checkpoint: str = "best", device: str = "cpu",
             task: str | None = None) -> LoadedRun:
    """Load ``best.pt`` (or ``last.pt``) of a run of any task; ``best`` falls back to ``last`` before any evaluation.

    Torch's global random state is left as it was.

    Args:
        run_dir: a run directory.
        checkpoint: ``"best"`` or ``"last"``.
        device: where to load the modules.
        task: refuse a run of another task than this one (``"lm"``, ``"s2s"``, ``"w2v"``); ``None``: any.

    Raises:
        ValueError: not a run directory, no such checkpoint, an unreadable, damaged or
            foreign one, one of another task than ``task``, or one whose weights are
            not finite (a diverged model).
    """
    run_dir = Path(run_dir)
    path = checkpoint_path(run_dir, checkpoint)
    dev = resolve_device(device)
    data = load_checkpoint(path, map_location=dev)
    with reading_checkpoint(path, values=True):
        task_class = task_of_dict(data["config"])
        format_ok = data["format"] == task_class.checkpoint_format
    if not format_ok:
        raise ValueError(f"{path}: its format {data['format']!r} is not that of the {task_class.name} task its "
                         "config names")
    if task is not None and task_class.name != task:
        raise ValueError(f"{path} holds a run of the {task_class.name} task, not of the {task} task")
    with reading_checkpoint(path, values=True):
        config = task_class.config_class.from_saved(data["config"])
        vocab = Vocabulary.from_dict(data["vocab"])
    with reading_checkpoint(path):
        with torch.random.fork_rng(devices=[]):
            model, head = task_class.build_saved(config, vocab, data["head"], dev)
        model.load_state_dict(data["model"])
        head.load_state_dict(data["head"])
        loaded = LoadedRun(run_dir=run_dir, path=path, task=task_class, config=config, vocab=vocab, model=model,
                           head=head, step=int(data["step"]), tokens=int(data.get("tokens", 0)),
                           best_ppl=data.get("best_ppl"), signature=dict(data["signature"]))
    check_loaded_parameters((model, head), path)
    model.eval()
    head.eval()
    return loaded
