"""The configuration of a summariser's training run (``sohsm s2s train``): typed dataclasses, strict overrides.

    S2SConfig
      task:  "s2s"               names the task in config.json
      data:  S2SDataConfig        which pairs, which vocabulary, clusters from a language model
      model: S2SModelConfig       embedding and LSTM sizes
      head:  HeadConfig           which output layer (shared with the language model)
      optim: OptimConfig          Adam lr 1e-3, weight decay 1e-6, no clipping
      batch_size, eval_batch_size
      epochs, max_tokens, time_budget, eval_every, ..., seed, device   the loop's (shared by every task)

Defaults are the paper's Gigaword setting (Shen et al. 2017, §5.2)
where it gives one; :func:`sohsm.train.config.apply_overrides` changes a config.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field

from sohsm.fields import FieldError, escape, suggest
from sohsm.train.config import CLUSTERS_FORMATS, HeadConfig, OptimConfig, RunConfig, check_clusters_source

#: fields that may differ between a summariser's run and its resumption
S2S_RESUMABLE_FIELDS = RunConfig.resumable_fields | {"data.data_dir"}


@dataclass
class S2SDataConfig:
    """Which pairs the summariser trains on, and its vocabulary."""

    #: the data set: ``gigaword`` (headlines) or ``reverse`` (the synthetic reverse task, :mod:`sohsm.data.reverse`)
    dataset: str = field(default="gigaword", metadata={"choices": ("gigaword", "reverse")})
    #: reverse task: the alphabet's size V (= the head's classes, less ``<eos>`` and ``<unk>``)
    symbols: int = 1000
    #: reverse task: training pairs (the tutorial's 3000)
    train_pairs: int = 3000
    #: reverse task: held-out pairs
    valid_pairs: int = 200
    #: reverse task: seed of the pairs (the run's ``seed`` draws the model, the batches and random trees)
    pairs_seed: int = 0
    #: where the data sets are; ``None``: ``$SOHSM_DATA``, else ``~/.cache/sohsm`` (a location, not an identity)
    data_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: a folder of headline pairs made from your own English Gigaword (``sohsm s2s pairs``: train.article.txt,
    #: train.title.txt, valid.article.txt, valid.title.txt) to train on instead of the data directory's pairs
    #: (``extra`` does not apply to it); ``None``: those
    pairs: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: add the two extra subsets of Rush's validation split (less pairs whose article is in the test or dev set):
    #: 10k pairs become about 35k, all the real pairs there are
    extra: bool = True
    #: title words seen fewer times become ``<unk>`` (1: every word of the training titles)
    min_count: int = 1
    #: the paper's 69k most frequent title words (more than these titles hold); ``None``: every title word
    max_size: int | None = 69_000
    #: a ``sohsm lm train`` run on the training titles whose clusters the head takes and keeps fixed; ``None``: the
    #: head's own
    clusters_from: str | None = field(default=None, metadata={"metavar": "FILE|RUN"})
    #: its format (``json``, ``brown``, ``tsv``, ``run``); ``None``: detected (a folder is a run)
    clusters_format: str | None = field(default=None, metadata={"choices": CLUSTERS_FORMATS})
    #: brown paths files: a two-level clustering by this many leading bits; ``None``: the whole tree
    clusters_cut: int | None = field(default=None, metadata={"metavar": "BITS"})


@dataclass
class S2SModelConfig:
    """The attention encoder-decoder."""

    #: the paper's model: embedding 512
    emb_size: int = 512
    #: the paper's model: one-layer LSTMs of 512 (= the head's in_features)
    hidden_size: int = 512


def _adam() -> OptimConfig:
    """The paper's Gigaword optimizer: Adam, lr 1e-3, weight decay 1e-6, no clipping."""
    return OptimConfig(optimizer="adam", lr=None, clip=None, weight_decay=1e-6)


@dataclass
class S2SConfig(RunConfig):
    """A whole summariser run: the sections above plus the loop's settings.

    Example::

        >>> config = S2SConfig(max_tokens=100_000)
        >>> S2SConfig.from_dict(config.to_dict()) == config
        True
    """

    resumable_fields: typing.ClassVar[frozenset[str]] = S2S_RESUMABLE_FIELDS

    #: the task this config trains (fixed)
    task: str = "s2s"
    data: S2SDataConfig = field(default_factory=S2SDataConfig)
    model: S2SModelConfig = field(default_factory=S2SModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    optim: OptimConfig = field(default_factory=_adam)
    #: the paper's batch size (pairs per batch)
    batch_size: int = 128
    #: pairs per batch of the dev evaluation
    eval_batch_size: int = 128
    # the loop's settings are RunConfig's (train/config.py: LoopSettings); these take other defaults here
    #: the paper gives none; 10 passes over ~35k pairs (choose by the dev perplexity)
    epochs: int = 10
    #: evaluate on dev every this many steps (and at each epoch's end); 0: at epochs' ends only
    eval_every: int = 500
    checkpoint_every: int = 500
    log_every: int = 50

    def check_values(self) -> None:
        """Check every value's range, without torch; raises ValueError naming the field."""
        self._check_head_optim_budgets()
        if self.task != "s2s":
            raise FieldError.on("task", f"must be 's2s' for a summariser config, got {self.task!r}")
        self._check_at_least(1, "model.emb_size", "model.hidden_size", "batch_size", "eval_batch_size",
                             "data.min_count")
        if self.data.dataset not in ("gigaword", "reverse"):
            raise FieldError.on("data.dataset", f"must be 'gigaword' or 'reverse', got {self.data.dataset!r}")
        self._check_at_least(2, "data.symbols")
        self._check_at_least(1, "data.train_pairs", "data.valid_pairs")
        if self.data.pairs is not None and self.data.dataset != "gigaword":
            raise FieldError("{} is a folder of headline pairs: it needs {}, got " + escape(repr(self.data.dataset)),
                             "data.pairs", suggest("data.dataset", "gigaword"))
        if self.data.max_size is not None and self.data.max_size < 3:
            raise FieldError.on("data.max_size", f"must be >= 3 (or none: no cap), got {self.data.max_size}")
        check_clusters_source(self.data)
