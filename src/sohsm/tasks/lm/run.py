"""Using a finished (or running) language-model run: evaluate it on a split, continue a text with it.

Runs are loaded by :func:`sohsm.train.loading.load_run`, for every task. A subword run
(:mod:`sohsm.data.subwords`) reads and writes text with its own ``tokenizer.json``.

An evaluation gives the perplexity per token of the run's vocabulary, and per word and bits per byte, which
compare across vocabularies (:mod:`sohsm.tasks.lm.scores`).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass

import torch
from tqdm import tqdm

from sohsm.data.subwords import Subwords
from sohsm.models.generation import MAX_LENGTH, generate
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.models.transformer_lm import TransformerLM
from sohsm.tasks.lm.config import LMConfig
from sohsm.tasks.lm.evaluation import evaluate_stream
from sohsm.tasks.lm.scores import SplitEvalResult, split_scores  # noqa: F401  (SplitEvalResult: exported)
from sohsm.tasks.lm.task import check_vocabulary, load_lm_corpus, run_tokenizer
from sohsm.train.loading import LoadedRun, load_run


def evaluate_run(run_dir: str | os.PathLike[str], split: str = "valid", checkpoint: str = "best", *,
                 data_dir: str | None = None, cache_dir: str | None = None, device: str = "cpu",
                 batch_size: int | None = None) -> tuple[SplitEvalResult, LoadedRun]:
    """Perplexity (per token, per word), bits per byte, cluster and in-cluster perplexity of a run's checkpoint
    on a split of its corpus.

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
    run = load_run(run_dir, checkpoint, device, task="lm")
    assert isinstance(run.config, LMConfig)  # a language model's run
    corpus = load_lm_corpus(run.config, data_dir=data_dir, cache_dir=cache_dir, run_dir=run.run_dir)
    check_vocabulary(corpus, run.vocab, run.signature["corpus"], run.path)
    ids = getattr(corpus, split)
    if ids is None:
        raise ValueError(f"corpus {corpus.name!r} has no {split} split")
    result = evaluate_stream(run.model, run.head, ids, batch_size or run.config.eval_batch_size, run.config.bptt)
    return split_scores(result, ids.numel(), corpus.words.get(split), corpus.text_bytes.get(split),
                        corpus.tokenizer is not None), run


@dataclass
class Generation:
    """A continued text.

    Attributes:
        prompt: the prompt's tokens as the model saw them (unknown words as ``<unk>``).
        unknown: prompt words not in the vocabulary.
        lower_case: the prompt with each unknown word whose lower-case form is in the vocabulary written so (a
            capitalised prompt on a lower-case corpus); ``None`` where no word is.
        words: the continuation's tokens (words, or subwords).
        eos: the vocabulary's end-of-line token (``None`` for running text).
        subwords: the tokenizer of a subword run, which writes its tokens as text; ``None`` for words.
    """

    prompt: list[str]
    unknown: list[str]
    words: list[str]
    eos: str | None
    subwords: Subwords | None = None
    lower_case: str | None = None

    def text(self, include_prompt: bool = False) -> str:
        """The continuation (after the prompt if ``include_prompt``) as text: words joined by spaces (subwords:
        the tokenizer's decoding), a new line for each end-of-line token."""
        tokens = self.prompt + self.words if include_prompt else self.words
        if self.subwords is not None:
            return self.subwords.decode(tokens).strip("\n")
        lines: list[list[str]] = [[]]
        for word in tokens:
            if word == self.eos:
                lines.append([])
            else:
                lines[-1].append(word)
        return "\n".join(" ".join(line) for line in lines).strip("\n")


#: seconds of silence after which ``sohsm lm generate`` says what it is doing (loading the run, then a bar of words)
SLOW_START_S = 2.0


@contextlib.contextmanager
def _notice_after(seconds: float, line: str, enabled: bool):
    """Write ``line`` to stderr if the block is still running after ``seconds`` (only where ``enabled``)."""
    timer = threading.Timer(seconds, lambda: print(line, file=sys.stderr, flush=True)) if enabled else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def generate_text(run_dir: str | os.PathLike[str], prompt: str, length: int = 30, *, greedy: bool = False,
                  temperature: float = 1.0, seed: int | None = None, checkpoint: str = "best",
                  device: str = "cpu", progress: bool = False) -> Generation:
    """Continue ``prompt`` (whitespace-separated words) with a run's model by ``length`` tokens (words, or the
    subwords of a subword run, whose tokenizer cuts the prompt and writes the continuation).

    An empty prompt starts a new line (for corpora with ``<eos>``). Sampling with
    the same ``seed`` gives the same text. ``progress`` shows a bar of tokens on stderr
    when the continuation is long (over a thousand) or slow (silent for 2 s), and one line saying the run is being
    loaded where that takes over 2 s.

    Raises:
        ValueError: an empty prompt for running text, a bad length or temperature.
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_LENGTH:
        raise ValueError(f"length must be an integer in [0, {MAX_LENGTH}] (words added in one call), got {length!r}")
    with _notice_after(SLOW_START_S, f"generate: loading the run in {os.fspath(run_dir)} (its vocabulary, model "
                       f"and head, {checkpoint} checkpoint)...", progress):
        run = load_run(run_dir, checkpoint, device, task="lm")
    assert isinstance(run.config, LMConfig) and isinstance(run.model, (LSTMLanguageModel, TransformerLM))
    vocab = run.vocab
    subwords = run_tokenizer(run.run_dir) if run.config.data.tokenizer is not None else None
    words = prompt.split()
    if not words:
        if vocab.eos_id is None:
            raise ValueError("the prompt is empty and this vocabulary has no end-of-line token to start from")
        assert vocab.eos is not None  # it has an id
        words = [vocab.eos]
    elif subwords is not None:
        words = subwords.tokens(" ".join(words))
    ids = vocab.encode(words)
    unknown = [w for w in words if w not in vocab]
    dev = next(run.model.parameters()).device
    generator = torch.Generator(dev)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    with tqdm(total=length, unit="token" if subwords is not None else "word", desc="generate", file=sys.stderr,
              disable=not progress, delay=0 if length > 1000 else SLOW_START_S) as bar:
        out = generate(run.model, run.head, ids, length, greedy=greedy, temperature=temperature, generator=generator,
                       on_word=bar.update)
    lowered = [w.lower() if w in unknown and w.lower() in vocab else w for w in words]
    return Generation(prompt=vocab.decode(ids), unknown=unknown, words=vocab.decode(out), eos=vocab.eos,
                      subwords=subwords, lower_case=" ".join(lowered) if lowered != words else None)
