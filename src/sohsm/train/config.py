"""What every run config shares: the head and optimizer sections, strict parsing, strict overrides.

Each task's config (:class:`sohsm.tasks.lm.LMConfig`, :class:`sohsm.tasks.s2s.S2SConfig`) is a dataclass derived
from :class:`RunConfig` that composes its own ``data`` and ``model`` sections with the shared ones below; the loop's
settings are declared once, in :class:`LoopSettings`, and a task gives them other defaults where it needs to::

    <Task>Config(RunConfig(LoopSettings))
      epochs, max_tokens, time_budget, eval_every, checkpoint_every, log_every, seed, device, threads
      task:  "lm" | "s2s" | ...   names the task in config.json
      data, model                 the task's own sections
      head:  HeadConfig           which output layer, and its options
      optim: OptimConfig          optimizer, learning rate, clipping, weight decay
      ...                         the task's own settings

A config is built from a dict (``config.json``) with :meth:`RunConfig.from_dict` and changed with
:func:`apply_overrides`; both reject unknown keys and values of the wrong type, and nothing is ever evaluated as
code. The command-line flags of every task are generated from these dataclasses (:mod:`sohsm.cli.config_flags`): a
field's ``#:`` comment is its help, its default the flag's default.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from sohsm.fields import FieldError, FieldText, escape
from sohsm.head_catalogue import DEFAULT_HEAD, head_names

if typing.TYPE_CHECKING:  # the registry imports torch, which a command's --help does without
    from sohsm.heads import HeadSpec

#: optimizers a run can use
OPTIMIZERS = ("adagrad", "adam", "adamw", "sgd")

#: the learning rate each optimizer gets when none is set: Adagrad 0.1 (the paper's text8 setting),
#: Adam 1e-3 (the paper's Gigaword setting), AdamW 1e-3 (small transformers' usual peak rate), SGD 1.0
#: (the PMI-LM paper's PTB setting)
DEFAULT_LR = {"adagrad": 0.1, "adam": 1e-3, "adamw": 1e-3, "sgd": 1.0}

#: how the rate moves over a run, after the warm-up (:mod:`sohsm.train.schedule`)
LR_SCHEDULES = ("constant", "cosine")

#: mixed-precision settings of a run (``None``: float32)
AMP_CHOICES = ("bf16", "fp16")
#: values of a run's ``step_graph`` setting (:mod:`sohsm.train.step_graph`)
STEP_GRAPH_CHOICES = ("auto", "on", "off")


@dataclass
class HeadConfig:
    """Which output layer, built by :func:`sohsm.build_head`."""

    #: the output layer (self_organized is the paper's method)
    name: str = field(default=DEFAULT_HEAD, metadata={"choices": head_names, "required": True})
    #: self-organized head: K, optimizer steps between re-clusterings (0: never); ``None``: about 8 times per
    #: epoch (the epoch length follows from the counts and the batch; the paper's K is 1000)
    update_every: int | None = field(default=None, metadata={"metavar": "K"})
    #: an option of the head (repeatable): gamma=2, init=frequency, n_clusters=100, projection=true; values are
    #: read as JSON where they are, else as text
    options: dict = field(default_factory=dict)

    def spec(self, check: bool = True) -> HeadSpec:
        """The head resolved once (:class:`~sohsm.heads.HeadSpec`): its options, ``update_every`` among them where it
        is set, which every question before the head exists and its building read. ``check=False``: a question a
        config asks before its options are checked (building the head checks them)."""
        from sohsm.heads import HeadSpec  # the registry: imports torch

        options = dict(self.options)
        if self.update_every is not None:
            options["update_every"] = self.update_every
        return HeadSpec.of(self.name, options, check=check)


@dataclass
class OptimConfig:
    """How the parameters are updated."""

    #: the optimizer (Adagrad is the paper's for text8)
    optimizer: str = field(default="adagrad", metadata={"choices": OPTIMIZERS})
    #: the learning rate; ``None``: the optimizer's usual rate (adagrad 0.1, the paper's; adam and adamw 0.001; sgd 1)
    lr: float | None = field(default=None, metadata={"metavar": "LR"})
    #: clip the gradient norm (the paper: 0.25); ``None`` or 0 for no clipping
    clip: float | None = field(default=0.25, metadata={"metavar": "NORM", "none_if": 0})
    #: weight decay on the LSTMs' parameters only (the paper's), or on a transformer's linear maps (adamw: decoupled)
    weight_decay: float = field(default=1e-6, metadata={"metavar": "W"})
    #: divide the rate by this once per epoch after the first ``lr_decay_after`` (1: a constant rate, the paper's)
    lr_decay: float = field(default=1.0, metadata={"metavar": "F"})
    #: epochs trained at the full rate before the decay starts
    lr_decay_after: int = field(default=0, metadata={"metavar": "E"})
    #: divide the rate by this whenever a dev evaluation is no better than the best so far (pytorch/examples'
    #: language model divides by 4); 1: never
    anneal: float = field(default=1.0, metadata={"metavar": "F"})
    #: take the optimizer's fused step where torch has one for that optimizer and device (one pass over each
    #: weight, several times faster: docs/results/lm.md); false: torch's default step, equal to within 1e-6
    fused: bool = True
    #: the rate over the run: ``constant`` (the paper's; lr_decay and anneal still apply) or ``cosine``, falling from
    #: lr to lr / 10 along half a cosine over the planned steps (epochs, max_tokens) after the warm-up
    lr_schedule: str = field(default="constant", metadata={"choices": LR_SCHEDULES})
    #: steps whose rate rises linearly from lr / warmup to lr, before the schedule; 0: none
    warmup: int = field(default=0, metadata={"metavar": "STEPS"})

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


#: the loop's settings that a resume may change (budgets, intervals, the device); a task adds its own
LOOP_RESUMABLE_FIELDS = frozenset({
    "epochs", "max_tokens", "time_budget", "eval_every", "checkpoint_every", "log_every", "device", "threads",
})


@dataclass
class LoopSettings:
    """The training loop's settings, the same fields in every task's config (top-level keys of ``config.json``).

    A task that needs another default declares the field again with it (``epochs: int = 10``), with a ``#:``
    comment where its help differs (the summariser's and word2vec's ``eval_every``, which cannot be unset);
    the checks stay these (:meth:`RunConfig._check_head_optim_budgets`).
    """

    #: passes over the training data
    epochs: int = 5
    #: stop after this many training tokens (all sessions together); ``None``: no limit
    max_tokens: int | None = None
    #: stop after this many seconds of training (all sessions; evaluation and compiling excluded); ``None``: no limit
    time_budget: float | None = field(default=None, metadata={"metavar": "SECONDS"})
    #: evaluate on dev every this many steps (and at each epoch's end); ``None``: four times an epoch (a curve
    #: from the first epoch on); 0: at epochs' ends only
    eval_every: int | None = field(default=None, metadata={"metavar": "STEPS"})
    #: save ``last.pt`` every this many steps (and at the end); 0: only at the end
    checkpoint_every: int = 1000
    #: write a train record (mean loss, tokens/s) every this many steps; each is a device sync
    log_every: int = 100
    #: seeds every random draw (initialisation, dropout, data order, clusters)
    seed: int = 1
    #: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; torchrun: cpu or cuda (its LOCAL_RANK's GPU)
    device: str = field(default="cpu", metadata={"metavar": "DEVICE"})
    #: CPU threads; ``None``: OMP_NUM_THREADS, else the cores free at the start
    threads: int | None = field(default=None, metadata={"metavar": "N"})


class RunConfig(LoopSettings):
    """What every run config shares: the loop's settings (:class:`LoopSettings`), dicts, dotted paths, strict parsing.

    A subclass is a dataclass of sections and settings with a ``validate()`` method; the training loop reads the
    loop's settings, ``head``, ``optim.clip`` and ``optim.fused``, and ``amp`` and ``compile``, which a subclass may
    declare as fields (else the defaults below hold).
    """

    #: fields that may differ between a run and its resumption
    resumable_fields: typing.ClassVar[frozenset[str]] = LOOP_RESUMABLE_FIELDS
    #: fields whose metadata says ``required`` but whose default this task's new runs may take
    defaulted_fields: typing.ClassVar[frozenset[str]] = frozenset()
    #: a flag's help for a field (dotted path) where this task's meaning differs from the field's ``#:`` comment
    field_help: typing.ClassVar[dict[str, str]] = {}

    #: defaults that follow from the value of one field, ``{path: {value: {path: default}}}`` (the language model's
    #: ``model.architecture``: a transformer trains with another recipe than an LSTM); a new run's config takes them
    #: under the fields it is given (:meth:`from_overrides`), the field's own default choosing where it is not given
    choice_defaults: typing.ClassVar[dict[str, dict[Any, dict[str, Any]]]] = {}

    head: HeadConfig  # the two sections every task's config declares as fields, with its own defaults
    optim: OptimConfig
    task: str  # a field of every task's config too: the task's name in config.json ("lm", "s2s", "w2v")

    # The training step's precision and compilation. A task whose config declares them as fields
    # (the language model's) lets its users choose; any other trains in float32, eagerly.
    #: autocast the forward in ``"bf16"`` or ``"fp16"``; ``None``: float32
    amp: str | None = None
    #: run model and head through ``torch.compile``
    compile: bool = False
    #: capture the ordinary training step as one CUDA graph (:mod:`sohsm.train.step_graph`)
    step_graph: str = "off"

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

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any], *, draft: bool = False) -> Any:
        """A new run's config from dotted ``overrides``: the defaults, then those that the overrides' choices
        bring (:attr:`choice_defaults`), then the overrides themselves (a field given always wins).

        ``draft``: checked by :meth:`check_values` alone, without importing torch (what a command refuses at
        once); a task may leave open there what it settles with torch.

        Raises:
            ValueError: as :func:`apply_overrides`.
        """
        chosen: dict[str, Any] = {}
        defaults = cls()
        for path, by_value in cls.choice_defaults.items():  # a choice not given is its default's
            chosen.update(by_value.get(overrides.get(path, defaults.get(path)), {}))
        if not draft:
            return apply_overrides(defaults, {**chosen, **overrides})
        config = _from_mapping(cls, _overridden(defaults, {**chosen, **overrides}), "")
        config.check_values()
        return config

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> Any:
        """:meth:`from_dict` for a run's own saved config (``config.json``, a checkpoint's ``config``).

        A config saved before ``optim.fused`` existed was trained with torch's default optimizer
        step and with its head's defaults of that release (the self-organized head had no shortlist:
        :func:`~sohsm.heads.legacy_options`, the head's own migration): it keeps them, so such a run
        resumes and evaluates as it was trained.
        """
        optim = data.get("optim") if isinstance(data, Mapping) else None
        if isinstance(optim, Mapping) and "fused" not in optim:
            data = {**data, "optim": {**optim, "fused": False}}
            head = data.get("head")
            options = head.get("options") or {} if isinstance(head, Mapping) else None
            if isinstance(head, Mapping) and isinstance(options, Mapping) and isinstance(head.get("name"), str):
                from sohsm.heads import legacy_options  # the registry: imports torch

                then = legacy_options(head["name"], options)
                if then != dict(options):
                    data["head"] = {**head, "options": then}
        return cls.from_dict(data)

    def _check_at_least(self, low: int, *paths: str) -> None:
        """Check ``value >= low`` for the fields at dotted ``paths``, in order (``None``, an unset optional
        field, passes); a FieldError names the first below."""
        for path in paths:
            value = self.get(path)
            if value is not None and value < low:
                raise FieldError.on(path, f"must be >= {low}, got {value}")

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

    def validate(self) -> None:
        """Check every value: :meth:`check_values`, then what needs the head registry and torch (the head is
        registered, the device is one torch can name); raises ValueError naming the field."""
        self.check_values()
        from sohsm.heads import head_names as registered  # the registry: heads a library user registered too

        if self.head.name not in registered():
            raise ValueError(f"unknown head {self.head.name!r}; known heads: {', '.join(registered())}")
        import torch

        try:
            torch.device(self.device)
        except (RuntimeError, ValueError):
            raise FieldError.on("device", "must name a torch device ('cpu', 'cuda', 'cuda:0', ...), got "
                                          f"{self.device!r}") from None

    def check_values(self) -> None:  # pragma: no cover - every subclass has its own
        """The checks of :meth:`validate` that need neither torch nor the head registry (ranges, choices, fields
        that go together): a command makes them before it imports torch, so that a mistake is refused at once."""
        raise NotImplementedError

    def _check_head_optim_budgets(self) -> None:
        """The value checks every run config shares: the head's K, optimizer, the loop's settings."""
        if self.head.update_every is not None and self.head.update_every < 0:
            raise FieldError.on("head.update_every", f"must be >= 0, got {self.head.update_every}")
        if self.optim.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optim.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
        for path in ("optim.lr", "optim.clip", "optim.weight_decay", "optim.lr_decay", "optim.anneal", "time_budget"):
            value = self.get(path)
            if value is not None and not math.isfinite(value):  # inf passes ``> 0`` and diverges at the first step
                raise FieldError.on(path, f"must be a finite number, got {value}")
        if self.optim.lr is not None and not self.optim.lr > 0:
            raise FieldError.on("optim.lr",
                                f"must be positive (or none: the optimizer's usual rate), got {self.optim.lr}")
        if self.optim.clip is not None and not self.optim.clip > 0:
            raise FieldError.on("optim.clip", f"must be positive (or none: no clipping), got {self.optim.clip}")
        if not self.optim.weight_decay >= 0:
            raise FieldError.on("optim.weight_decay", f"must be >= 0, got {self.optim.weight_decay}")
        if not self.optim.lr_decay >= 1:
            raise FieldError.on("optim.lr_decay", f"must be >= 1 (1 = a constant rate), got {self.optim.lr_decay}")
        if not self.optim.anneal >= 1:
            raise FieldError.on("optim.anneal", f"must be >= 1 (1 = never), got {self.optim.anneal}")
        if self.optim.lr_schedule not in LR_SCHEDULES:
            raise FieldError.on("optim.lr_schedule", f"must be one of {', '.join(LR_SCHEDULES)}, "
                                f"got {self.optim.lr_schedule!r}")
        if self.optim.warmup < 0:
            raise FieldError.on("optim.warmup", f"must be >= 0, got {self.optim.warmup}")
        if self.optim.lr_decay_after < 0:
            raise FieldError.on("optim.lr_decay_after", f"must be >= 0, got {self.optim.lr_decay_after}")
        self._check_at_least(1, "epochs", "log_every")
        self._check_at_least(0, "eval_every", "checkpoint_every")
        if self.threads is not None and self.threads < 1:
            raise FieldError.on("threads", f"must be >= 1 (or none: the cores free at the start), got {self.threads}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise FieldError.on("max_tokens", f"must be >= 1 (or none: no limit), got {self.max_tokens}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise FieldError.on("time_budget", f"must be positive (or none: no limit), got {self.time_budget}")


def apply_overrides(config: RunConfig, overrides: Mapping[str, Any]) -> Any:
    """A copy of ``config`` with dotted-path overrides (``{"optim.lr": 0.2, "epochs": 1}``).

    Raises:
        ValueError: an unknown path, a value of the wrong type, or a value out of range.
    """
    return type(config).from_dict(_overridden(config, overrides))


def _overridden(config: RunConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``config.to_dict()`` with the dotted-path ``overrides`` set; raises FieldError for an unknown path."""
    data = config.to_dict()
    valid = config.flat()
    for path, value in overrides.items():
        if path not in valid:
            raise FieldError(f"unknown config field {escape(repr(path))}; known fields: "
                             f"{escape(', '.join(sorted(valid)))}")
        section, _, leaf = path.rpartition(".")
        (data[section] if section else data)[leaf] = value
    return data


def config_differences(saved: RunConfig, requested: Mapping[str, Any]) -> list[FieldText]:
    """The fields of ``requested`` (dotted paths) that differ from ``saved`` and may not change on resume,
    each as ``"{field} is {old} in the run, {new} requested"``."""
    out = []
    for path, value in requested.items():
        if path in saved.resumable_fields:
            continue
        old = saved.get(path)
        if path == "head.options" and isinstance(old, Mapping) and isinstance(value, Mapping):
            # the options named must match; one not named keeps the run's (an option its vocabulary settled, too)
            old = {key: old[key] for key in value if key in old}
            old, value = ({key: _normalise(v) for key, v in d.items()} for d in (old, value))
        if path == "optim.lr":  # compare the rates in effect: unset means the optimizer's default
            old = saved.optim.learning_rate
            value = old if value is None else value
        if _normalise(old) != _normalise(value):
            out.append(FieldText.on(path, f"is {old!r} in the run, {value!r} requested"))
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
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
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
            raise FieldError.on(name, "must not be None")
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
    raise FieldError.on(name, f"must be {kind}, got {value!r} ({type(value).__name__})")


#: formats of ``data.clusters_from``: hierarchy files, or ``run`` (a run directory)
CLUSTERS_FORMATS = ("json", "brown", "tsv", "run")


def check_clusters_source(data: Any) -> None:
    """Check ``clusters_format`` and ``clusters_cut`` of a data section; raises ValueError naming the field."""
    if data.clusters_format not in (None, *CLUSTERS_FORMATS):
        raise FieldError.on("data.clusters_format", f"must be one of {', '.join(CLUSTERS_FORMATS)} (or none: "
                            f"detected), got {data.clusters_format!r}")
    if data.clusters_cut is not None:
        if data.clusters_cut < 1:
            raise FieldError.on("data.clusters_cut", f"must be >= 1 (or none: the whole tree), got {data.clusters_cut}")
        if data.clusters_from is None:
            raise FieldError("{} needs {} (a brown paths file)", "data.clusters_cut", "data.clusters_from")
        if data.clusters_format not in (None, "brown"):
            raise FieldError.on("data.clusters_cut", f"applies to brown paths files, not to {data.clusters_format}")
    if data.clusters_format is not None and data.clusters_from is None:
        raise FieldError("{} needs {}", "data.clusters_format", "data.clusters_from")
