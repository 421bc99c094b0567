"""The configuration of a language-model training run: typed dataclasses, strict overrides.

A run config composes four sections and the loop's own settings::

    TrainConfig
      data:  DataConfig    which corpus, which vocabulary
      model: ModelConfig   the LSTM
      head:  HeadConfig    which output layer, and its options
      optim: OptimConfig   optimizer, learning rate, clipping, weight decay
      bptt, batch_size, epochs, max_tokens, time_budget, eval_every, ... , seed, device, amp, compile

Defaults are the paper's text8 setting (Shen et al. 2017, §4). A config
is built from a dict (``config.json``) with :meth:`TrainConfig.from_dict` and
changed with :func:`apply_overrides`; both reject unknown keys and values of the
wrong type, and nothing is ever evaluated as code.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

import torch

from sohsm.heads import head_names

#: optimizers a run can use
OPTIMIZERS = ("adagrad", "adam", "sgd")

#: the learning rate each optimizer gets when none is set: Adagrad 0.1 (the paper's text8 setting),
#: Adam 1e-3 (the paper's Gigaword setting), SGD 1.0 (the PMI-LM paper's PTB setting)
DEFAULT_LR = {"adagrad": 0.1, "adam": 1e-3, "sgd": 1.0}

#: fields that may differ between a run and its resumption (budgets, logging, locations);
#: everything else must match the checkpoint
RESUMABLE_FIELDS = frozenset({
    "data.data_dir", "data.cache_dir", "epochs", "max_tokens", "time_budget", "eval_every",
    "checkpoint_every", "log_every", "device", "compile",
})

#: mixed-precision settings of a run (``None``: float32)
AMP_CHOICES = ("bf16", "fp16")


@dataclass
class DataConfig:
    """Which corpus and vocabulary a run trains on."""

    #: a known corpus name or the path of your own text: text8 is the paper's LM corpus
    corpus: str = "text8"
    #: where known corpora are; ``None``: ``$SOHSM_DATA``, else ``~/.cache/sohsm`` (a location, not an identity)
    data_dir: str | None = None
    #: where tokenised corpora are cached; ``None``: ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``
    cache_dir: str | None = None
    #: ``None``: the corpus's own default (text8: the 44k most frequent words, the paper's vocabulary)
    min_count: int | None = None
    #: ``None``: the corpus's own default
    max_size: int | None = None
    #: your own text only: ``"lines"`` (an ``<eos>`` after each line) or ``"running"``; ``None``: ``"lines"``
    text_mode: str | None = None
    #: a hierarchy file (json, brown, tsv) or a trained run whose clusters or tree the head takes, fixed
    clusters_from: str | None = None
    #: its format (``json``, ``brown``, ``tsv``, ``run``); ``None``: detected
    clusters_format: str | None = None
    #: brown paths files: a two-level clustering by this many leading bits; ``None``: the whole tree
    clusters_cut: int | None = None


@dataclass
class ModelConfig:
    """The LSTM that makes hidden states."""

    #: the paper's text8 model: embedding 512
    emb_size: int = 512
    #: the paper's text8 model: hidden 512 (= the head's in_features)
    hidden_size: int = 512
    #: the paper's text8 model: one layer
    layers: int = 1
    #: dropout on the LSTM's input and output: PTB dev ppl fell for every head measured (LSTM 256, seed 1: full
    #: 129.1 -> 121.8, self-organized 135.0 -> 123.1, frequency binning 135.0 -> 125.8); 0 is the paper's text8 model
    dropout: float = 0.2
    #: off: only the full softmax can tie, and the comparison between heads must be like for like
    tie_weights: bool = False


@dataclass
class HeadConfig:
    """Which output layer, built by :func:`sohsm.build_head`."""

    #: the paper's method
    name: str = "self_organized"
    #: K, optimizer steps between re-clusterings; ``None``: the head's default (1000, the paper's)
    update_every: int | None = None
    #: further keyword arguments of the head (``gamma``, ``freq_budget``, ``init``, ...); empty: its defaults
    options: dict = field(default_factory=dict)


@dataclass
class OptimConfig:
    """How the parameters are updated."""

    #: the paper's optimizer for text8
    optimizer: str = "adagrad"
    #: ``None``: the optimizer's usual rate (:data:`DEFAULT_LR`; Adagrad 0.1 is the paper's)
    lr: float | None = None
    #: the paper clips the gradient norm at 0.25; ``None`` for no clipping
    clip: float | None = 0.25
    #: the paper's weight decay, on the LSTM's parameters only
    weight_decay: float = 1e-6
    #: divide the rate by this once per epoch after the first ``lr_decay_after`` (1: a constant rate, the paper's)
    lr_decay: float = 1.0
    #: epochs trained at the full rate before the decay starts
    lr_decay_after: int = 0
    #: divide the rate by this whenever a dev evaluation is no better than the best so far (pytorch/examples'
    #: language model divides by 4); 1: never
    anneal: float = 1.0
    #: the optimizer's fused kernel where torch has one (one pass over each weight: on the CPU the Adagrad step
    #: of a 44k x 512 weight takes 31 ms instead of 206); false: torch's default step (equal to 1e-6)
    fused: bool = True

    @property
    def learning_rate(self) -> float:
        """``lr``, or the optimizer's default rate when ``lr`` is ``None``."""
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr

    def rate_in_epoch(self, epoch: int) -> float:
        """The rate of the (0-based) ``epoch``: :attr:`learning_rate` divided by :attr:`lr_decay` once per
        epoch past the first :attr:`lr_decay_after` (Zaremba et al.'s schedule; it depends on the epoch
        alone, so a resumed run follows it exactly).

        >>> OptimConfig(optimizer="sgd", lr=1.0, lr_decay=2.0, lr_decay_after=2).rate_in_epoch(3)
        0.25
        """
        return self.learning_rate / self.lr_decay ** max(0, epoch + 1 - self.lr_decay_after)


class RunConfig:
    """What every run config shares: dicts, dotted paths, strict parsing (the loop's settings are fields of each).

    A subclass is a dataclass of sections and settings with a ``validate()`` method;
    the training loop reads ``epochs``, ``max_tokens``, ``time_budget``, ``eval_every``,
    ``checkpoint_every``, ``log_every``, ``seed``, ``device``, ``head`` and ``optim.clip``.
    """

    #: fields that may differ between a run and its resumption
    resumable_fields: typing.ClassVar[frozenset[str]] = frozenset()

    # -- dicts -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict; :meth:`from_dict` reverses it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Build from a nested dict; missing keys take their defaults.

        Raises:
            ValueError: an unknown key, or a value of the wrong type.
        """
        config = _from_mapping(cls, data, "")
        config.validate()
        return config

    def get(self, path: str) -> Any:
        """The value at a dotted path (``"optim.lr"``)."""
        obj: Any = self
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    def flat(self) -> dict[str, Any]:
        """``{dotted path: value}`` of every leaf field."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                for g in dataclasses.fields(value):
                    out[f"{f.name}.{g.name}"] = getattr(value, g.name)
            else:
                out[f.name] = value
        return out

    def validate(self) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def _validate_head_optim_budgets(self) -> None:
        """The checks every run config shares: head, optimizer, budgets and device (fields of the subclasses)."""
        if self.head.name not in head_names():
            raise ValueError(f"unknown head {self.head.name!r}; known heads: {', '.join(head_names())}")
        if self.head.update_every is not None and self.head.update_every < 0:
            raise ValueError(f"head.update_every must be >= 0, got {self.head.update_every}")
        if self.optim.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optim.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        if self.optim.lr is not None and not self.optim.lr > 0:
            raise ValueError(f"optim.lr must be positive or None, got {self.optim.lr}")
        if self.optim.clip is not None and not self.optim.clip > 0:
            raise ValueError(f"optim.clip must be positive or None, got {self.optim.clip}")
        if not self.optim.weight_decay >= 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.optim.weight_decay}")
        if not self.optim.lr_decay >= 1:
            raise ValueError(f"optim.lr_decay must be >= 1 (1 = a constant rate), got {self.optim.lr_decay}")
        if not self.optim.anneal >= 1:
            raise ValueError(f"optim.anneal must be >= 1 (1 = never), got {self.optim.anneal}")
        if self.optim.lr_decay_after < 0:
            raise ValueError(f"optim.lr_decay_after must be >= 0, got {self.optim.lr_decay_after}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be positive or None, got {self.time_budget}")
        try:
            torch.device(self.device)
        except (RuntimeError, ValueError):
            raise ValueError(
                f"device must name a torch device ('cpu', 'cuda', 'cuda:0', ...), got {self.device!r}"
            ) from None


@dataclass
class TrainConfig(RunConfig):
    """A whole training run: the sections above plus the loop's settings.

    Example::

        >>> config = TrainConfig(data=DataConfig(corpus="ptb"), head=HeadConfig(name="full"))
        >>> config = apply_overrides(config, {"optim.lr": 0.2, "max_tokens": 100_000})
        >>> TrainConfig.from_dict(config.to_dict()) == config
        True
    """

    resumable_fields: typing.ClassVar[frozenset[str]] = RESUMABLE_FIELDS

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    #: the paper truncates back-propagation after 20 steps
    bptt: int = 20
    #: the paper's batch size
    batch_size: int = 128
    #: dev evaluation columns: the LSTM state restarts per column, 32 keeps the restarts rare and the batch wide
    eval_batch_size: int = 32
    #: the paper trains 5 epochs
    epochs: int = 5
    #: stop after this many training tokens (all sessions together); ``None``: no limit
    max_tokens: int | None = None
    #: stop after this many seconds of training (all sessions, evaluation excluded); ``None``: no limit
    time_budget: float | None = None
    #: evaluate on dev every this many steps (and at each epoch's end); 1000 = K gives a point per re-clustering
    eval_every: int = 1000
    #: save ``last.pt`` every this many steps (and at the end); 0: only at the end
    checkpoint_every: int = 1000
    #: write a train record (mean loss, tokens/s) every this many steps; each is a device sync
    log_every: int = 100
    #: seeds the model's initialisation, dropout and the heads' random clusters
    seed: int = 1
    #: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    device: str = "cpu"
    #: autocast the forward in ``"bf16"`` or ``"fp16"`` (with loss scaling); ``None``: float32, the paper's
    amp: str | None = None
    #: run model and head through ``torch.compile`` (speed only; the head's target check is dropped)
    compile: bool = False

    # -- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        """Check every value's range; raises ValueError naming the field."""
        self._validate_head_optim_budgets()
        positive = {"model.emb_size": self.model.emb_size, "model.hidden_size": self.model.hidden_size,
                    "model.layers": self.model.layers, "bptt": self.bptt, "batch_size": self.batch_size,
                    "eval_batch_size": self.eval_batch_size, "epochs": self.epochs, "log_every": self.log_every}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("eval_every", "checkpoint_every"):
            if self.get(name) < 0:
                raise ValueError(f"{name} must be >= 0, got {self.get(name)}")
        if not 0.0 <= self.model.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.model.dropout}")
        if "update_every" in self.head.options:
            raise ValueError("set head.update_every, not head.options['update_every']")
        if self.amp is not None and self.amp not in AMP_CHOICES:
            raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)} or None, got {self.amp!r}")
        if self.data.min_count is not None and self.data.min_count < 1:
            raise ValueError(f"data.min_count must be >= 1 or None, got {self.data.min_count}")
        if self.data.text_mode not in (None, "lines", "running"):
            raise ValueError(f"data.text_mode must be 'lines', 'running' or None, got {self.data.text_mode!r}")
        if self.data.max_size is not None and self.data.max_size < 2:
            raise ValueError(f"data.max_size must be >= 2 or None, got {self.data.max_size}")
        check_clusters_source(self.data)
        if self.model.tie_weights and self.model.emb_size != self.model.hidden_size:
            raise ValueError(f"model.tie_weights needs model.emb_size == model.hidden_size, got "
                             f"{self.model.emb_size} and {self.model.hidden_size}")


def apply_overrides(config: RunConfig, overrides: Mapping[str, Any]) -> Any:
    """A copy of ``config`` with dotted-path overrides (``{"optim.lr": 0.2, "epochs": 1}``).

    Raises:
        ValueError: an unknown path, a value of the wrong type, or a value out of range.
    """
    data = config.to_dict()
    valid = config.flat()
    for path, value in overrides.items():
        if path not in valid:
            raise ValueError(f"unknown config field {path!r}; known fields: {', '.join(sorted(valid))}")
        section, _, leaf = path.rpartition(".")
        (data[section] if section else data)[leaf] = value
    return type(config).from_dict(data)


def config_differences(saved: RunConfig, requested: Mapping[str, Any]) -> list[str]:
    """The fields of ``requested`` (dotted paths) that differ from ``saved`` and may not change on resume."""
    out = []
    for path, value in requested.items():
        if path in saved.resumable_fields:
            continue
        old = saved.get(path)
        if path == "optim.lr":  # compare the rates in effect: unset means the optimizer's default
            old = saved.optim.learning_rate
            value = old if value is None else value
        if _normalise(old) != _normalise(value):
            out.append(f"{path} is {old!r} in the run, {value!r} requested")
    return out


def _normalise(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


# -- strict conversion from dicts ----------------------------------------------------------
def _from_mapping(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(prefix + u for u in unknown)}; "
                         f"known: {', '.join(prefix + n for n in sorted(names))}")
    kwargs = {}
    for name in names & set(data):
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _from_mapping(hint, data[name], f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(data[name], hint, prefix + name)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            if type(None) in args:
                return None
            raise ValueError(f"{name} must not be None")
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, name)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is dict or origin is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
    else:  # pragma: no cover - a field type this module does not know
        raise TypeError(f"unsupported config field type {hint!r} for {name}")
    kind = getattr(hint, "__name__", str(hint))
    raise ValueError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")


#: formats of ``data.clusters_from``: hierarchy files, or ``run`` (a run directory)
CLUSTERS_FORMATS = ("json", "brown", "tsv", "run")


def check_clusters_source(data: Any) -> None:
    """Check ``clusters_format`` and ``clusters_cut`` of a data section; raises ValueError naming the field."""
    if data.clusters_format not in (None, *CLUSTERS_FORMATS):
        raise ValueError(f"data.clusters_format must be one of {', '.join(CLUSTERS_FORMATS)} or None, "
                         f"got {data.clusters_format!r}")
    if data.clusters_cut is not None:
        if data.clusters_cut < 1:
            raise ValueError(f"data.clusters_cut must be >= 1 or None, got {data.clusters_cut}")
        if data.clusters_from is None:
            raise ValueError("data.clusters_cut needs data.clusters_from (a brown paths file)")
        if data.clusters_format not in (None, "brown"):
            raise ValueError(f"data.clusters_cut applies to brown paths files, not to {data.clusters_format}")
    if data.clusters_format is not None and data.clusters_from is None:
        raise ValueError("data.clusters_format needs data.clusters_from")
