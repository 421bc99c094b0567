"""Using a finished (or running) run: load its checkpoint, evaluate it, continue a text with it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sohsm.data.loading import load_corpus
from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head
from sohsm.models.generate import generate
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.train.builders import build_model_and_head, resolve_device
from sohsm.train.checkpoint import checkpoint_path, load_checkpoint, reading_checkpoint
from sohsm.train.config import TrainConfig
from sohsm.train.evaluation import EvalResult, evaluate
from sohsm.train.guard import check_loaded_parameters
from sohsm.train.lm_task import check_vocabulary


@dataclass
class LoadedRun:
    """A run's model and head as saved in one checkpoint, in evaluation mode.

    Attributes:
        run_dir: the run directory.
        path: the checkpoint file read.
        config: the run's configuration.
        vocab: its vocabulary.
        model, head: the trained modules.
        step, tokens: training steps and tokens when the checkpoint was written.
        best_ppl: best dev perplexity when it was written.
        signature: head, clusters, K, vocabulary, corpus, seed, version.
    """

    run_dir: Path
    path: Path
    config: TrainConfig
    vocab: Vocabulary
    model: LSTMLanguageModel
    head: Head
    step: int
    tokens: int
    best_ppl: float | None
    signature: dict[str, Any]


def load_run(run_dir: str | os.PathLike[str], checkpoint: str = "best", device: str = "cpu") -> LoadedRun:
    """Load ``best.pt`` (or ``last.pt``) of a run; ``best`` falls back to ``last`` before any evaluation.

    Torch's global random state is left as it was.

    Raises:
        ValueError: not a run directory, no such checkpoint, an unreadable, damaged or
            foreign one, or one whose weights are not finite (a diverged model).
    """
    run_dir = Path(run_dir)
    path = checkpoint_path(run_dir, checkpoint)
    dev = resolve_device(device)
    data = load_checkpoint(path, map_location=dev)
    with reading_checkpoint(path, values=True):
        config = TrainConfig.from_dict(data["config"])
        vocab = Vocabulary.from_dict(data["vocab"])
    with reading_checkpoint(path):
        with torch.random.fork_rng(devices=[]):
            model, head = build_model_and_head(config, vocab, dev, saved_head=data["head"])
        model.load_state_dict(data["model"])
        head.load_state_dict(data["head"])
        loaded = LoadedRun(run_dir=run_dir, path=path, config=config, vocab=vocab, model=model, head=head,
                           step=int(data["step"]), tokens=int(data["tokens"]), best_ppl=data.get("best_ppl"),
                           signature=dict(data["signature"]))
    check_loaded_parameters((model, head), path)
    model.eval()
    head.eval()
    return loaded


def evaluate_run(run_dir: str | os.PathLike[str], split: str = "valid", checkpoint: str = "best", *,
                 data_dir: str | None = None, cache_dir: str | None = None, device: str = "cpu",
                 batch_size: int | None = None) -> tuple[EvalResult, LoadedRun]:
    """Perplexity, cluster and in-cluster perplexity of a run's checkpoint on a split of its corpus.

    Args:
        run_dir: the run directory.
        split: ``"valid"`` or ``"test"``.
        checkpoint: ``"best"`` or ``"last"``.
        data_dir, cache_dir: where the corpus and its cache are, if not where the run found them.
        device: where to evaluate.
        batch_size: evaluation columns; default: the run's ``eval_batch_size``.

    Raises:
        ValueError: a bad split, a corpus without that split, or a corpus whose
            vocabulary differs from the checkpoint's.
        sohsm.data.DataError: the corpus is missing or corrupt.
    """
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    run = load_run(run_dir, checkpoint, device)
    d = run.config.data
    corpus = load_corpus(d.corpus, data_dir if data_dir is not None else d.data_dir, min_count=d.min_count,
                         max_size=d.max_size, cache_dir=cache_dir if cache_dir is not None else d.cache_dir,
                         text_mode=d.text_mode)
    check_vocabulary(corpus, run.vocab, run.signature["corpus"], run.path)
    ids = getattr(corpus, split)
    if ids is None:
        raise ValueError(f"corpus {corpus.name!r} has no {split} split")
    result = evaluate(run.model, run.head, ids, batch_size or run.config.eval_batch_size, run.config.bptt)
    return result, run


@dataclass
class Generation:
    """A continued text.

    Attributes:
        prompt: the prompt's words as the model saw them (unknown words as ``<unk>``).
        unknown: prompt words not in the vocabulary.
        words: the continuation.
        eos: the vocabulary's end-of-line token (``None`` for running text).
    """

    prompt: list[str]
    unknown: list[str]
    words: list[str]
    eos: str | None

    def text(self, include_prompt: bool = False) -> str:
        """The continuation (after the prompt if ``include_prompt``) as text: words joined by spaces,
        a new line for each end-of-line token."""
        lines: list[list[str]] = [[]]
        for word in (self.prompt + self.words if include_prompt else self.words):
            if word == self.eos:
                lines.append([])
            else:
                lines[-1].append(word)
        return "\n".join(" ".join(line) for line in lines).strip("\n")


def generate_text(run_dir: str | os.PathLike[str], prompt: str, length: int = 30, *, greedy: bool = False,
                  temperature: float = 1.0, seed: int | None = None, checkpoint: str = "best",
                  device: str = "cpu") -> Generation:
    """Continue ``prompt`` (whitespace-separated words) with a run's model.

    An empty prompt starts a new line (for corpora with ``<eos>``). Sampling with
    the same ``seed`` gives the same text.

    Raises:
        ValueError: an empty prompt for running text, a bad length or temperature.
    """
    run = load_run(run_dir, checkpoint, device)
    vocab = run.vocab
    words = prompt.split()
    if not words:
        if vocab.eos_id is None:
            raise ValueError("the prompt is empty and this vocabulary has no end-of-line token to start from")
        words = [vocab.eos]
    ids = vocab.encode(words)
    unknown = [w for w in words if w not in vocab]
    dev = next(run.model.parameters()).device
    generator = torch.Generator(dev)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    out = generate(run.model, run.head, ids, length, greedy=greedy, temperature=temperature, generator=generator)
    return Generation(prompt=vocab.decode(ids), unknown=unknown, words=vocab.decode(out), eos=vocab.eos)
