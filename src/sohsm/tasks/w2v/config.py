"""The configuration of a word-embedding run (``sohsm w2v train``): typed dataclasses, strict overrides.

    W2VConfig
      task:  "w2v"              names the task in config.json
      data:  W2VDataConfig       which corpus, min-count, sub-sampling, dev rows
      model: W2VModelConfig      CBOW or skip-gram, vector size, window
      head:  HeadConfig          which output layer (word2vec's: tree_huffman or pmi = negative sampling)
      optim: OptimConfig         SGD at word2vec's rate, falling linearly to zero
      row_cap, batch_words, fast_path, kernel, update_rows, update_row_cap
      epochs, max_tokens, time_budget, eval_every, ..., seed, device   the loop's (shared by every task)

Defaults are word2vec's (Mikolov et al. 2013, the ``word2vec.c`` defaults for CBOW):
dimension 100, window 5, ``min_count`` 5, sub-sampling 1e-3, 5 epochs, rate 0.05; the input vectors
start as gensim's (uniform in +-1/dim, twice word2vec.c's range: better on text8's analogies).
"""
from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sohsm.fields import FieldError
from sohsm.head_catalogue import NEGATIVE_SAMPLING_HEAD, WORD2VEC_HEAD
from sohsm.train.config import HeadConfig, OptimConfig, RunConfig

#: fields that may differ between a run and its resumption; ``epochs`` may not (the rate falls over them)
W2V_RESUMABLE_FIELDS = (RunConfig.resumable_fields - {"epochs"}) | {"data.data_dir", "data.cache_dir"}

#: word2vec's starting rates: 0.05 for CBOW, 0.025 for skip-gram
DEFAULT_RATES = {"cbow": 0.05, "skipgram": 0.025}

#: model names: predict the centre from the mean of its context, or from each context word
ARCHITECTURES = ("cbow", "skipgram")


@dataclass
class W2VDataConfig:
    """Which text the vectors are trained on."""

    #: a known corpus name or the path of your own text (the training split is used)
    corpus: str = field(default="text8-small", metadata={"metavar": "NAME_OR_PATH", "required": True})
    #: where known corpora are; ``None``: ``$SOHSM_DATA``, else ``~/.cache/sohsm`` (a location, not an identity)
    data_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: where tokenised corpora are cached; ``None``: ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``
    cache_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: word2vec's floor: rarer words are dropped from the text
    min_count: int = 5
    #: word2vec's sub-sampling threshold (``-sample``); 0 keeps every word
    sample: float = 1e-3
    #: your own text only: ``"lines"`` (an ``<eos>`` after each line) or ``"running"``; ``None``: ``"lines"``
    text_mode: str | None = field(default=None, metadata={"choices": ("lines", "running")})
    #: rows of the dev split scored at each evaluation (full windows, no sub-sampling)
    eval_rows: int = 10_000


@dataclass
class W2VModelConfig:
    """The embedding model."""

    #: ``"cbow"`` (the mean of the context predicts the centre) or ``"skipgram"`` (flag ``--model``)
    architecture: str = field(default="cbow", metadata={"choices": ARCHITECTURES, "flag": "model"})
    #: word2vec's default vector size
    dim: int = 100
    #: word2vec's default window: each centre word draws its own in 1..window
    window: int = 5
    #: CBOW: back-propagate the mean exactly instead of word2vec's undivided update
    exact_mean_gradient: bool = False
    #: ``"zeros"``: the head's weights start at 0, as word2vec's output layer; ``"head"``: the head's own start
    head_init: str = field(default="zeros", metadata={"choices": ("zeros", "head")})
    #: the input vectors start uniform in +-init_range/dim: 1 is gensim's start, 0.5 word2vec.c's (text8, CBOW with
    #: the tree, seeds 1-9: analogy accuracy 0.0667 against 0.0654, rho 0.445 against 0.450; docs/results/word2vec.md)
    init_range: float = 1.0

    @property
    def hidden_size(self) -> int:
        """The head's ``in_features``: the vector size (what :func:`sohsm.tasks.heads.build_run_head` reads)."""
        return self.dim


def _sgd() -> OptimConfig:
    """word2vec's optimizer: plain SGD, no clipping, no decay; ``lr=None`` is the architecture's rate."""
    return OptimConfig(optimizer="sgd", lr=None, clip=None, weight_decay=0.0)


@dataclass
class W2VConfig(RunConfig):
    """A whole word-embedding run: the sections above plus the loop's settings.

    Example::

        >>> config = W2VConfig(head=HeadConfig(update_every=0))
        >>> W2VConfig.from_dict(config.to_dict()) == config
        True
        >>> config.learning_rate
        0.05
    """

    resumable_fields: typing.ClassVar[frozenset[str]] = W2V_RESUMABLE_FIELDS
    #: word2vec's own output layer is the default head: a new run need not name one
    defaulted_fields: typing.ClassVar[frozenset[str]] = frozenset({"head.name"})
    #: the flags' help where a shared field means something else here
    field_help: typing.ClassVar[dict[str, str]] = {
        "head.name": f"the output layer (word2vec's hierarchical softmax, {WORD2VEC_HEAD}, by default; "
                     f"{NEGATIVE_SAMPLING_HEAD} is its negative sampling)",
        "optim.optimizer": "the optimizer: word vectors take sgd only (word2vec's rate, falling linearly to zero)",
        "optim.lr": "the starting rate per word; None: word2vec's for the architecture (cbow 0.05, skipgram 0.025)",
        "optim.clip": "word vectors take none (row_cap bounds a row's update)",
        "optim.weight_decay": "word vectors take 0 (word2vec's SGD has no decay)",
        "optim.lr_decay": "word vectors take 1 (the rate falls linearly to zero over the run instead)",
        "optim.anneal": "word vectors take 1 (the rate falls linearly to zero over the run instead)",
        "optim.lr_schedule": "word vectors take constant (the rate falls linearly to zero over the run instead)",
        "optim.warmup": "word vectors take 0 (the rate falls linearly to zero over the run instead)",
        "max_tokens": "stop after this many training rows (all sessions together); none: no limit",
    }

    #: the task this config trains (fixed)
    task: str = "w2v"
    data: W2VDataConfig = field(default_factory=W2VDataConfig)
    model: W2VModelConfig = field(default_factory=W2VModelConfig)
    head: HeadConfig = field(default_factory=lambda: HeadConfig(name=WORD2VEC_HEAD))
    optim: OptimConfig = field(default_factory=_sgd)
    #: the generic path: a parameter row moves by at most this many rows' worth of update per step (the Huffman
    #: root, frequent words); ``None``: summed gradients uncapped (unstable: the tree's root diverges)
    row_cap: float | None = 4.0
    #: corpus words per step (before sub-sampling); windows stop at a step's borders, as at word2vec's sentences
    batch_words: int = 1000
    #: train a binary tree (``tree_huffman``, ...) or ``pmi`` (negative sampling) by word2vec's own per-row update,
    #: written by hand (no autograd), ``update_rows`` rows at a time, on the CPU; any other head or device: the
    #: generic path (autograd and the optimizer, ``batch_words`` words a step)
    fast_path: bool = True
    #: the hand-written path's loop: ``"numba"``, word2vec's per-row loop compiled by Numba (one row at a time, no
    #: row cap; ``pip install 'sohsm[w2v]'``); ``"torch"``, torch operations on ``update_rows`` rows at a time;
    #: ``"auto"``: numba where it can be imported, else torch (a run resumed where Numba is missing goes on with the
    #: torch loop; the plan line says which loop runs)
    kernel: str = field(default="auto", metadata={"choices": ("auto", "numba", "torch")})
    #: the hand-written path: rows per in-place update (word2vec: 1; 64 matched gensim's quality on text8)
    update_rows: int = 64
    #: the hand-written path: a parameter row moves by at most this many rows' worth of update at once (the
    #: Huffman root is on every row's path; a word repeated in a piece); ``None``: uncapped (diverged on text8)
    update_row_cap: float | None = 32.0
    # the loop's settings are RunConfig's (train/config.py: LoopSettings); these take other defaults here
    #: evaluate on dev every this many steps (and at each epoch's end); 0: at epochs' ends only
    eval_every: int = 0
    checkpoint_every: int = 2000
    log_every: int = 200

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> W2VConfig:
        """A run's own saved config; one saved before ``fast_path`` existed trained by the generic path and keeps it,
        one saved before ``kernel`` existed by the torch loop, so it resumes as it was trained."""
        if isinstance(data, Mapping) and "fast_path" not in data:
            data = {**data, "fast_path": False}
        if isinstance(data, Mapping) and "kernel" not in data:
            data = {**data, "kernel": "torch"}
        return super().from_saved(data)

    @property
    def learning_rate(self) -> float:
        """The starting per-word rate: ``optim.lr``, else word2vec's for the architecture."""
        return DEFAULT_RATES[self.model.architecture] if self.optim.lr is None else self.optim.lr

    def check_values(self) -> None:
        """Check every value's range, without torch; raises :class:`~sohsm.fields.FieldError` naming the field."""
        self._check_head_optim_budgets()
        if self.task != "w2v":
            raise FieldError.on("task", f"must be 'w2v' for a word-embedding config, got {self.task!r}")
        if self.model.architecture not in ARCHITECTURES:
            raise FieldError.on("model.architecture", f"must be one of {', '.join(ARCHITECTURES)}, "
                                                     f"got {self.model.architecture!r}")
        if self.model.head_init not in ("zeros", "head"):
            raise FieldError.on("model.head_init", f"must be 'zeros' or 'head', got {self.model.head_init!r}")
        self._check_at_least(1, "model.dim", "model.window", "data.min_count", "data.eval_rows")
        if not self.model.init_range > 0:
            raise FieldError.on("model.init_range", f"must be positive, got {self.model.init_range}")
        if self.row_cap is not None and not self.row_cap > 0:
            raise FieldError.on("row_cap", f"must be positive (or none: uncapped), got {self.row_cap}")
        if self.kernel not in ("auto", "numba", "torch"):
            raise FieldError.on("kernel", f"must be 'auto', 'numba' or 'torch', got {self.kernel!r}")
        self._check_at_least(1, "update_rows")
        if self.update_row_cap is not None and not self.update_row_cap > 0:
            raise FieldError.on("update_row_cap", f"must be positive (or none: uncapped), got {self.update_row_cap}")
        self._check_at_least(2, "batch_words")
        if not 0 <= self.data.sample < 1:
            raise FieldError.on("data.sample", f"must be in [0, 1), got {self.data.sample}")
        if self.data.text_mode not in (None, "lines", "running"):
            raise FieldError.on("data.text_mode",
                                f"must be 'lines' or 'running' (or none: 'lines'), got {self.data.text_mode!r}")
        if self.optim.optimizer != "sgd":
            raise FieldError.on("optim.optimizer", f"must be 'sgd' for word vectors (word2vec's linearly "
                                                  f"falling rate), got {self.optim.optimizer!r}")
        if self.optim.lr_decay != 1.0:
            raise FieldError.on("optim.lr_decay", f"must be 1: the rate falls linearly to zero over the run, "
                                                f"got {self.optim.lr_decay}")
        # word2vec's SGD (LinearDecaySGD) sets its own rate and caps rows by row_cap: settings of the other
        # optimizers would be silently ignored, so they are refused
        if self.optim.clip is not None:
            raise FieldError.on("optim.clip", f"must be None for word vectors (row_cap bounds a row's update), "
                                              f"got {self.optim.clip}")
        if self.optim.weight_decay != 0:
            raise FieldError.on("optim.weight_decay", f"must be 0 for word vectors (word2vec's SGD has none), "
                                                      f"got {self.optim.weight_decay}")
        if self.optim.anneal != 1:
            raise FieldError.on("optim.anneal", f"must be 1 for word vectors: the rate falls linearly to zero "
                                                f"over the run, got {self.optim.anneal}")
        if self.optim.lr_schedule != "constant" or self.optim.warmup:
            raise FieldError("{} must be 'constant' and {} 0 for word vectors: the rate falls linearly to zero "
                             "over the run", "optim.lr_schedule", "optim.warmup")
        if "update_every" in self.head.options:
            raise FieldError.on("head.options", "must not hold update_every: set head.update_every")
