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


def zipf_corpus(folder, words: int = 300, tokens: int = 5000):
    """A made-up corpus in ``folder`` (train.txt, valid.txt, test.txt): ``words`` word types drawn by Zipf's law,
    ``tokens`` training tokens, lines of 20 words; the same every time."""
    from pathlib import Path

    rng = np.random.default_rng(0)
    names = [f"w{i}" for i in range(words)]
    p = 1.0 / np.arange(1, words + 1)
    p /= p.sum()
    folder = Path(folder)
    for name, n in (("train.txt", tokens), ("valid.txt", 600), ("test.txt", 600)):
        ids = rng.choice(words, size=n, p=p)
        lines = [" ".join(names[i] for i in ids[k: k + 20]) for k in range(0, n, 20)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
