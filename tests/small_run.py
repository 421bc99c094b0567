"""A small vocabulary and a small language-model config, for tests of what is built from a run config."""
from __future__ import annotations

import numpy as np

from sohsm.data import Vocabulary
from sohsm.tasks.lm import LMConfig
from sohsm.train import apply_overrides

#: 50 words; the counts fall with the id
WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(48)]


def small_vocab() -> Vocabulary:
    """:data:`WORDS` with counts 150, 147, ..., 3."""
    return Vocabulary(WORDS, np.arange(len(WORDS), 0, -1) * 3)


def small_config(**overrides) -> LMConfig:
    """An LM config with embedding and hidden size 8 and the full softmax, ``overrides`` (dotted) applied."""
    base = {"model.emb_size": 8, "model.hidden_size": 8, "head.name": "full"}
    base.update(overrides)
    return apply_overrides(LMConfig(), base)


def run_files(run_dir) -> dict[str, bytes]:
    """Every file under a run directory (its subfolders too: ``tensorboard/`` where that package is installed), by
    relative path: what a step that must write nothing is compared with."""
    from pathlib import Path

    root = Path(run_dir)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
