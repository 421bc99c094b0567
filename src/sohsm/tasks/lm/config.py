"""The configuration of a language-model run: typed dataclasses, strict overrides.

A run config composes four sections and the loop's own settings::

    LMConfig
      data:  DataConfig    which corpus, which vocabulary
      model: ModelConfig   the LSTM, or a decoder-only transformer (``architecture``)
      head:  HeadConfig    which output layer, and its options (shared by every task)
      optim: OptimConfig   optimizer, learning rate, clipping, weight decay (shared by every task)
      bptt, batch_size, eval_batch_size, amp, compile
      epochs, max_tokens, time_budget, eval_every, ..., seed, device   the loop's (shared by every task)

Defaults are the paper's text8 setting (Shen et al. 2017, §4). A config
is built from a dict (``config.json``) with :meth:`LMConfig.from_dict` and
changed with :func:`~sohsm.train.config.apply_overrides`; both reject unknown keys
and values of the wrong type, and nothing is ever evaluated as code.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from sohsm.data.subwords import bpe_size
from sohsm.fields import FieldError, escape, has
from sohsm.models.transformer_shape import POSITIONS, check_sizes
from sohsm.train.config import (
    AMP_CHOICES,
    CLUSTERS_FORMATS,
    STEP_GRAPH_CHOICES,
    HeadConfig,
    OptimConfig,
    RunConfig,
    check_clusters_source,
)

if typing.TYPE_CHECKING:  # the registry imports torch, which a command's --help does without
    from sohsm.heads import HeadDefaults

#: fields that may differ between a run and its resumption (budgets, logging, locations);
#: everything else must match the checkpoint
RESUMABLE_FIELDS = RunConfig.resumable_fields | {"data.data_dir", "data.cache_dir", "compile", "step_graph"}

@dataclass
class DataConfig:
    """Which corpus and vocabulary a run trains on."""

    #: a known corpus (ptb, wikitext-2, text8 (the paper's), ...) or your own text file or folder
    corpus: str = field(default="text8", metadata={"metavar": "NAME_OR_PATH", "required": True})
    #: where known corpora are; ``None``: ``$SOHSM_DATA``, else ``~/.cache/sohsm`` (a location, not an identity)
    data_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: where tokenised corpora are cached; ``None``: ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``
    cache_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    #: words seen fewer times become <unk>; ``None``: the corpus's own default (text8: the 44k most frequent
    #: words, the paper's vocabulary)
    min_count: int | None = None
    #: at most this many vocabulary entries; ``None``: the corpus's own default
    max_size: int | None = None
    #: your own text only: ``"lines"`` (an ``<eos>`` after each line) or ``"running"``; ``None``: ``"lines"``
    text_mode: str | None = field(default=None, metadata={"choices": ("lines", "running")})
    #: subwords: bpe:SIZE (a byte-level BPE trained on the training split; ``sohsm[hf]``), llama3 or o200k
    #: (Llama 3's 128,256 or o200k's 200,019 tokens, each a row of the head; ``sohsm[tokenizers]``) or a
    #: tokenizer.json file; ``None``: words
    tokenizer: str | None = field(default=None, metadata={"metavar": "bpe:SIZE|llama3|o200k|FILE"})
    #: the head's fixed clusters or tree: a hierarchy file (nested JSON lists of words, Brown paths
    #: 'bits<TAB>word<TAB>count', 'word<TAB>class') or a trained run; the 'tree' head takes the whole tree,
    #: two-level heads its clusters; vocabulary words it lacks go to a fallback node; ``None``: the head's own
    clusters_from: str | None = field(default=None, metadata={"metavar": "FILE|RUN"})
    #: format of clusters_from (``json``, ``brown``, ``tsv``, ``run``); ``None``: detected
    clusters_format: str | None = field(default=None, metadata={"choices": CLUSTERS_FORMATS})
    #: Brown paths: one cluster per this many leading bits (a two-level clustering); ``None``: the whole tree
    clusters_cut: int | None = field(default=None, metadata={"metavar": "BITS"})


#: the models that make hidden states: the paper's LSTM, or a decoder-only transformer
ARCHITECTURES = ("lstm", "transformer")

#: what an LSTM changes of the defaults of a new run: the paper's recipe (Adagrad at 0.1, a constant rate) with the
#: rate rising over its first 30 steps. Adagrad's first step moves every weight with a gradient by the whole rate
#: (its sum of squares holds only that gradient), 0.1 against word vectors of about +-0.05: the loss jumped to
#: 16-18 nats (uniform is 9.2) and a third of an epoch of PTB ended 14% worse (docs/results/lm.md, "The first steps")
LSTM_DEFAULTS = {"optim.warmup": 30}

#: what a transformer changes of the defaults of a new run (a field given explicitly wins): the recipe decoder-only
#: transformers are trained with (GPT-2's, nanoGPT's) in place of the paper's LSTM recipe, at the size of the
#: small model of docs/results/transformer.md but for its width (give --emb-size and --hidden-size together)
TRANSFORMER_DEFAULTS = {
    "model.layers": 4, "bptt": 128, "batch_size": 32, "optim.optimizer": "adamw", "optim.weight_decay": 0.1,
    "optim.clip": 1.0, "optim.lr_schedule": "cosine", "optim.warmup": 100,
}


@dataclass
class ModelConfig:
    """The model that makes hidden states: the paper's LSTM, or a decoder-only transformer."""

    #: lstm (the paper's) or transformer (decoder-only, pre-LayerNorm, causal attention; a new run then defaults to
    #: 4 layers, bptt 128, batch 32, adamw with weight decay 0.1 on its linear maps, clip 1, 100 warm-up steps and
    #: a cosine decay)
    architecture: str = field(default="lstm", metadata={"flag": "model", "choices": ARCHITECTURES})
    #: embedding size (the paper's text8 model: 512; a transformer's is its hidden size: a new run given one takes
    #: it for both)
    emb_size: int = 512
    #: hidden size = the head's input size (the paper's text8 model: 512; a transformer's width)
    hidden_size: int = 512
    #: LSTM layers (the paper's text8 model: one) or transformer blocks
    layers: int = 1
    #: transformer only: attention heads of each block (a divisor of hidden_size)
    attention_heads: int = 8
    #: transformer only: learned position vectors (GPT-2's, bptt of them) or rotary embeddings of queries and keys
    positions: str = field(default="learned", metadata={"choices": POSITIONS})
    #: dropout on the LSTM's input and output (a transformer: its embeddings, attention weights and residual
    #: branches); 0 is the paper's text8 model, 0.2 lowered PTB dev ppl for every head measured (docs/results/lm.md)
    dropout: float = field(default=0.2, metadata={"metavar": "P"})
    #: LSTM only: the word vectors of the embedding (tied or not) start uniform in +-init_range; 0.1 is the word LM's
    #: usual start (docs/results/first-steps.md), 1/sqrt(d) a head's own
    init_range: float = field(default=0.1, metadata={"metavar": "R"})
    #: share the embedding with the head's output word vectors (Press & Wolf 2017); needs emb_size = hidden_size and
    #: a head with word vectors (full, two-level, adaptive), not trees, sampled heads or dsoftmax
    tie_weights: bool = field(default=False, metadata={
        "default_help": "true for a new run that can be tied"})


def ties_by_default(overrides: typing.Mapping[str, typing.Any]) -> bool:
    """Whether a new run ties its embedding to its head, for every head and model alike: where the head can lend
    its word vectors (:func:`~sohsm.heads.tying_refusal`, asked of the head and its options) and the embedding
    is as wide as the hidden state. A resumed run keeps the choice its config stored."""
    model, head = ModelConfig(), HeadConfig()
    emb, hidden = overrides.get("model.emb_size", model.emb_size), overrides.get("model.hidden_size", model.hidden_size)
    name, options = overrides.get("head.name", head.name), overrides.get("head.options") or {}
    from sohsm.heads import HeadSpec, head_names as registered  # the registry: imports torch

    if emb != hidden or name not in registered() or not isinstance(options, typing.Mapping):
        return False  # an unknown head or bad options are refused by validate(), with their own message
    return HeadSpec.of(name, options, check=False).tying_refusal(hidden) is None


def vocabulary_defaults(config: LMConfig, n_words: int, unseen_words: int = 0) -> HeadDefaults:
    """The head options a new run takes from its model and its vocabulary of ``n_words`` entries (``unseen_words``
    of them never in the training split) where its own leave them open, and why: the head's own defaults for that
    setting (:meth:`~sohsm.heads.HeadSpec.settle`; the self-organized head of a tied LSTM over 20,000 words or more
    scores rarer words in fewer dimensions)."""
    from sohsm.heads import HeadSetting  # the registry: imports torch

    model = config.model
    setting = HeadSetting(model=model.architecture, hidden_size=model.hidden_size, tied=model.tie_weights,
                          n_words=n_words, subwords=config.data.tokenizer is not None,
                          device=str(config.device).split(":")[0], unseen_words=unseen_words)
    return config.head.spec(check=False).settle(setting)[1]


def vocabulary_head_options(config: LMConfig, n_words: int, unseen_words: int = 0) -> dict[str, typing.Any]:
    """The options of :func:`vocabulary_defaults` alone."""
    return vocabulary_defaults(config, n_words, unseen_words).options


def with_vocabulary_options(config: LMConfig, n_words: int, unseen_words: int = 0) -> tuple[LMConfig, HeadDefaults]:
    """``(config with the options of :func:`vocabulary_defaults` added, those defaults)``: what a new run over
    ``n_words`` words is written and built with (a copy where any are added; ``config`` itself is not changed)."""
    added = vocabulary_defaults(config, n_words, unseen_words)
    if not added.options:
        return config, added
    head = dataclasses.replace(config.head, options={**config.head.options, **added.options})
    return dataclasses.replace(config, head=head), added


@dataclass
class LMConfig(RunConfig):
    """A whole training run: the sections above plus the loop's settings.

    Example::

        >>> from sohsm.train.config import apply_overrides
        >>> config = LMConfig(data=DataConfig(corpus="ptb"))
        >>> config = apply_overrides(config, {"optim.lr": 0.2, "max_tokens": 100_000})
        >>> LMConfig.from_dict(config.to_dict()) == config
        True
    """

    resumable_fields: typing.ClassVar[frozenset[str]] = RESUMABLE_FIELDS
    choice_defaults: typing.ClassVar[dict] = {"model.architecture": {"lstm": LSTM_DEFAULTS,
                                                                         "transformer": TRANSFORMER_DEFAULTS}}

    #: the task this config trains (fixed; runs written before it was stored have none and are language models)
    task: str = "lm"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    #: the paper truncates back-propagation after 20 steps; a transformer's context (each window read on its own)
    bptt: int = 20
    #: the paper's batch size
    batch_size: int = 128
    #: dev evaluation columns: the LSTM state restarts per column, 32 keeps the restarts rare and the batch wide (a
    #: transformer reads each column in disjoint windows of bptt tokens)
    eval_batch_size: int = 32
    #: autocast the forward in ``"bf16"`` or ``"fp16"`` (with loss scaling); ``None``: float32, the paper's
    amp: str | None = field(default=None, metadata={"choices": AMP_CHOICES})
    #: run model and head through ``torch.compile`` (speed only; the head's target check is dropped)
    compile: bool = False
    #: capture the ordinary training step (model, head, backward, clipping, optimizer) as one CUDA graph and replay
    #: it: ``auto`` where CUDA is and the head and optimizer allow it, ``on`` (refused where they do not), ``off``
    step_graph: str = field(default="auto", metadata={"choices": STEP_GRAPH_CHOICES})

    @classmethod
    def from_overrides(cls, overrides: typing.Mapping[str, typing.Any], *, draft: bool = False) -> LMConfig:
        """:meth:`RunConfig.from_overrides`; a transformer given only one of ``model.emb_size`` and
        ``model.hidden_size`` takes it for both (its embedding is its residual stream: one width); ``model.tie_weights``
        not given follows :func:`ties_by_default` (a draft's is false: the head registry imports torch, and a run
        tied by default is one that can be)."""
        overrides = dict(overrides)
        if overrides.get("model.architecture") == "transformer":
            for given, other in (("model.emb_size", "model.hidden_size"), ("model.hidden_size", "model.emb_size")):
                if given in overrides and other not in overrides:
                    overrides[other] = overrides[given]
        if "model.tie_weights" not in overrides:
            overrides["model.tie_weights"] = False if draft else ties_by_default(overrides)
        return super().from_overrides(overrides, draft=draft)

    # -- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        """Check every value's range; raises ValueError naming the field."""
        super().validate()
        if self.model.tie_weights:
            refusal = self.head.spec(check=False).tying_refusal(self.model.hidden_size)
            if refusal is not None:
                raise FieldError(escape(f"head {self.head.name!r} cannot be tied (") + "{}" + escape(f"): {refusal}"),
                                 "model.tie_weights")

    def check_values(self) -> None:
        """The checks of :meth:`validate` that need no torch (:meth:`RunConfig.check_values`)."""
        self._check_head_optim_budgets()
        if self.task != "lm":
            raise FieldError.on("task", f"must be 'lm' for a language-model config, got {self.task!r}")
        self._check_at_least(1, "model.emb_size", "model.hidden_size", "model.layers", "model.attention_heads", "bptt",
                             "batch_size", "eval_batch_size")
        if not 0.0 <= self.model.dropout < 1.0:
            raise FieldError.on("model.dropout", f"must be in [0, 1), got {self.model.dropout}")
        if "update_every" in self.head.options:
            raise FieldError("set {}, not head.options['update_every']", "head.update_every")
        if self.amp is not None and self.amp not in AMP_CHOICES:
            raise FieldError.on("amp", f"must be one of {', '.join(AMP_CHOICES)} (or none: float32), got {self.amp!r}")
        if self.step_graph not in STEP_GRAPH_CHOICES:
            raise FieldError.on("step_graph",
                                f"must be one of {', '.join(STEP_GRAPH_CHOICES)}, got {self.step_graph!r}")
        if self.step_graph == "on" and not str(self.device).startswith("cuda"):
            raise FieldError.on("step_graph", f"'on' captures a CUDA graph, and the run's device is {self.device}; "
                                              "use auto or off")
        if self.data.min_count is not None and self.data.min_count < 1:
            raise FieldError.on("data.min_count",
                                f"must be >= 1 (or none: the corpus's default), got {self.data.min_count}")
        if self.data.text_mode not in (None, "lines", "running"):
            raise FieldError.on("data.text_mode",
                                f"must be 'lines' or 'running' (or none: 'lines'), got {self.data.text_mode!r}")
        if self.data.max_size is not None and self.data.max_size < 2:
            raise FieldError.on("data.max_size",
                                f"must be >= 2 (or none: the corpus's default), got {self.data.max_size}")
        self._validate_tokenizer()
        check_clusters_source(self.data)
        self._validate_model()
        if self.model.tie_weights and self.model.emb_size != self.model.hidden_size:
            raise FieldError(f"{{}} needs {{}} == {{}}, got {self.model.emb_size} and {self.model.hidden_size}",
                             "model.tie_weights", "model.emb_size", "model.hidden_size")

    def _validate_tokenizer(self) -> None:
        """A ``bpe:SIZE`` tokenizer's SIZE, and no word-vocabulary cut beside a tokenizer (a file is looked for
        when the corpus is read: a run keeps its own copy)."""
        d = self.data
        if d.tokenizer is None:
            return
        if not d.tokenizer.strip():
            raise FieldError.on("data.tokenizer", "must be bpe:SIZE, llama3, o200k or a tokenizer.json file, got an "
                                "empty value")
        try:
            bpe_size(d.tokenizer)
        except FieldError as error:
            raise FieldError(error.template, *(f._replace(path="data.tokenizer") for f in error.fields)) from None
        for cut in ("data.min_count", "data.max_size"):
            if self.get(cut) is not None:
                raise FieldError("{} cuts rare words of a word vocabulary; a subword vocabulary ({}) keeps every "
                                 "token of its tokenizer", cut, has("data.tokenizer", d.tokenizer))

    def _validate_model(self) -> None:
        """The architecture and, for a transformer, sizes it can be built with."""
        m = self.model
        if m.architecture not in ARCHITECTURES:
            raise FieldError.on("model.architecture", f"must be one of {', '.join(ARCHITECTURES)}, "
                                f"got {m.architecture!r}")
        if m.positions not in POSITIONS:
            raise FieldError.on("model.positions", f"must be one of {', '.join(POSITIONS)}, got {m.positions!r}")
        if m.architecture != "transformer":
            return
        if m.hidden_size % m.attention_heads:
            raise FieldError("{} must be a multiple of {}: each attention head takes hidden_size / "
                             "attention_heads", has("model.hidden_size", m.hidden_size),
                             has("model.attention_heads", m.attention_heads))
        problem = check_sizes(m.hidden_size, m.attention_heads, m.positions)
        if problem:
            raise FieldError(escape(problem))
        if m.emb_size != m.hidden_size:
            raise FieldError("a transformer's {} must equal its {}: its embedding is its residual stream "
                             "(give both)", has("model.emb_size", m.emb_size), has("model.hidden_size", m.hidden_size))
