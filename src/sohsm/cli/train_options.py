"""The options of `sohsm lm train`, shared with `sohsm lm compare`: flags, their config fields, head options.

Both commands turn the same flags into the same dotted config fields with
:func:`training_overrides`, so a run that `lm compare` trains is the run
`lm train` would train from the same flags.
"""
from __future__ import annotations

import argparse
import json
import re
import textwrap
from typing import Any

from sohsm.cli.main import CommandError
from sohsm.heads import check_head_options, head_names, head_options
from sohsm.train.config import AMP_CHOICES, DEFAULT_LR, OPTIMIZERS

#: option dest -> config field it sets (options left out keep the config default, or the run's on --resume);
#: the head's fields (--head, --update-every, --head-option) are set by :func:`head_overrides`
TRAIN_FIELDS = {
    "corpus": "data.corpus", "data_dir": "data.data_dir", "cache_dir": "data.cache_dir",
    "min_count": "data.min_count", "max_size": "data.max_size", "text_mode": "data.text_mode",
    "clusters_from": "data.clusters_from", "clusters_format": "data.clusters_format", "clusters_cut": "data.clusters_cut",
    "emb_size": "model.emb_size", "hidden_size": "model.hidden_size", "layers": "model.layers",
    "dropout": "model.dropout", "tie_weights": "model.tie_weights",
    "optimizer": "optim.optimizer", "lr": "optim.lr", "clip": "optim.clip", "weight_decay": "optim.weight_decay",
    "lr_decay": "optim.lr_decay", "lr_decay_after": "optim.lr_decay_after", "anneal": "optim.anneal",
    "fused": "optim.fused",
    "bptt": "bptt", "batch_size": "batch_size", "eval_batch_size": "eval_batch_size", "epochs": "epochs",
    "max_tokens": "max_tokens", "time_budget": "time_budget", "eval_every": "eval_every",
    "checkpoint_every": "checkpoint_every", "log_every": "log_every", "seed": "seed", "device": "device",
    "amp": "amp", "compile": "compile",
}

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_head_option(text: str) -> tuple[str, Any]:
    """``"gamma=2"`` -> ``("gamma", 2)``: the value read as JSON where it is (numbers, true/false, null), else a string.

    Raises:
        ValueError: not KEY=VALUE with KEY a Python name.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.fullmatch(key):
        raise ValueError(f"expected KEY=VALUE (e.g. gamma=2 or init=frequency), got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def parse_option_list(text: str) -> dict[str, Any]:
    """``"gamma=2,init=frequency"`` -> ``{"gamma": 2, "init": "frequency"}`` (an empty text gives ``{}``).

    Raises:
        ValueError: an item that is not KEY=VALUE, or a key given twice.
    """
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, value = parse_head_option(item)
        if key in options:
            raise ValueError(f"option {key!r} given twice in {text!r}")
        options[key] = value
    return options


def add_clusters_options(g) -> None:
    """``--clusters-from FILE|RUN``, ``--clusters-format`` and ``--clusters-cut`` (shared by `lm train` and `s2s train`)."""
    from sohsm.train.config import CLUSTERS_FORMATS

    g.add_argument("--clusters-from", metavar="FILE|RUN",
                   help="the head's fixed clusters or tree: a hierarchy file (nested JSON lists of words, Brown "
                   "paths 'bits<TAB>word<TAB>count', 'word<TAB>class') or a trained run; the 'tree' head takes the "
                   "whole tree, two-level heads its clusters; vocabulary words it lacks go to a fallback node")
    g.add_argument("--clusters-format", choices=CLUSTERS_FORMATS, help="format of --clusters-from (default: detected)")
    g.add_argument("--clusters-cut", type=int, metavar="BITS",
                   help="Brown paths: one cluster per BITS-bit prefix (a two-level clustering)")


def add_training_options(p: argparse.ArgumentParser, *, compare: bool = False) -> None:
    """Add the options of `lm train` to ``p``; for `lm compare` without --head, --run-dir and --resume."""
    g = p.add_argument_group("data")
    g.add_argument("--corpus", metavar="NAME_OR_PATH", help="a known corpus (ptb, wikitext-2, text8, ...) "
                   "or your own text file or folder (required for a new run)")
    g.add_argument("--data-dir", metavar="DIR", help="data directory (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    g.add_argument("--cache-dir", metavar="DIR",
                   help="cache of tokenised corpora (default: $SOHSM_CACHE, else ~/.cache/sohsm/cache)")
    g.add_argument("--min-count", type=int, metavar="N", help="words seen fewer times become <unk>")
    g.add_argument("--max-size", type=int, metavar="N", help="at most N vocabulary entries")
    g.add_argument("--text-mode", choices=("lines", "running"),
                   help="your own text: 'lines' (an end-of-line token after each line, default) or 'running'")

    add_clusters_options(g)

    g = p.add_argument_group("model and head")
    if not compare:
        g.add_argument("--head", choices=head_names(), help="output layer (required for a new run)")
    which = "heads that take it" if compare else "the head"
    g.add_argument("--head-option", action="append", default=[], metavar="KEY=VALUE",
                   help=f"an option of {which} (repeatable): gamma=2, init=frequency, n_clusters=100, "
                   "projection=true; values are read as JSON where they are, else as text")
    g.add_argument("--update-every", type=int, metavar="K",
                   help="self-organized head: re-cluster every K optimizer steps (default: about 8 times per "
                   "epoch; 0 = never); same as --head-option update_every=K")
    g.add_argument("--emb-size", type=int, metavar="N", help="embedding size (default 512)")
    g.add_argument("--hidden-size", type=int, metavar="N", help="LSTM hidden size = head input size (default 512)")
    g.add_argument("--layers", type=int, metavar="N", help="LSTM layers (default 1)")
    g.add_argument("--dropout", type=float, metavar="P", help="dropout on the LSTM's input and output (default 0.2)")
    g.add_argument("--tie-weights", action="store_true", default=None,
                   help="share the embedding with the output word vectors (full head only, emb = hidden size)")

    g = p.add_argument_group("optimization")
    g.add_argument("--optimizer", choices=OPTIMIZERS,
                   help="default adagrad; default rates: " + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items()))
    g.add_argument("--lr", type=float, metavar="LR", help="learning rate (default: the optimizer's, see above)")
    g.add_argument("--lr-decay", type=float, metavar="F",
                   help="divide the rate by F after every epoch past --lr-decay-after (default 1: constant)")
    g.add_argument("--lr-decay-after", type=int, metavar="E", help="epochs at the full rate first (default 0)")
    g.add_argument("--anneal", type=float, metavar="F",
                   help="divide the rate by F whenever a dev evaluation is no better than the best so far "
                   "(default 1: never)")
    g.add_argument("--fused", action=argparse.BooleanOptionalAction, default=None,
                   help="the optimizer's fused step where torch has one (default: on)")
    g.add_argument("--clip", type=float, metavar="NORM", help="clip the gradient norm (default 0.25; 0 = no clipping)")
    g.add_argument("--weight-decay", type=float, metavar="W", help="weight decay on the LSTM parameters (default 1e-6)")
    g.add_argument("--bptt", type=int, metavar="T", help="truncated back-propagation length (default 20)")
    g.add_argument("--batch-size", type=int, metavar="B", help="columns per batch (default 128)")
    g.add_argument("--seed", type=int, help="seed of initialisation, dropout and random clusters (default 1)")

    g = p.add_argument_group("budgets, evaluation and files")
    if not compare:
        g.add_argument("--run-dir", required=True, metavar="DIR", help="where the run's files go")
        g.add_argument("--resume", action="store_true",
                       help="continue the run in --run-dir from last.pt (budgets and logging may change; "
                       "other options must match the run)")
    g.add_argument("--epochs", type=int, metavar="N", help="passes over the training data (default 5)")
    g.add_argument("--max-tokens", type=int, metavar="N", help="stop after N training tokens (all sessions)")
    g.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop after this much training time (all sessions, evaluation excluded)")
    g.add_argument("--eval-every", type=int, metavar="STEPS",
                   help="dev evaluation every STEPS steps, and at each epoch's end (default 1000; 0 = epochs only)")
    g.add_argument("--eval-batch-size", type=int, metavar="B", help="columns of the dev evaluation (default 32)")
    g.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                   help="save last.pt every STEPS steps, and at the end (default 1000; 0 = end only)")
    g.add_argument("--log-every", type=int, metavar="STEPS", help="a train record every STEPS steps (default 100)")
    g.add_argument("--device", metavar="DEVICE", help="cpu (default), cuda, cuda:1, ...; under torchrun cpu or "
                   "cuda (each process takes the GPU of its LOCAL_RANK)")
    g.add_argument("--amp", choices=AMP_CHOICES,
                   help="mixed precision: autocast the forward in bf16, or in fp16 with loss scaling (default: fp32)")
    g.add_argument("--compile", action="store_true", default=None,
                   help="run model and head through torch.compile (the head's target check is dropped)")
    g.add_argument("--quiet", action="store_true", help="no start-up lines, progress bar or evaluation lines")


def head_options_help() -> str:
    """An epilog paragraph listing each registered head's options, from the registry (so it cannot go stale)."""
    lines = ["head options (--head-option KEY=VALUE; see each head's docstring for their meaning):"]
    width = max(map(len, head_names()))
    for name in head_names():
        options = head_options(name)
        listed = "any (not checked)" if options is None else ", ".join(options) or "none"
        lines.append(textwrap.fill(listed, 100, initial_indent=f"  {name:<{width}}  ",
                                   subsequent_indent=" " * (width + 4)))
    return "\n".join(lines) + "\n"


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the training flags set (the head's fields excepted), as dotted paths."""
    overrides = {field: getattr(args, dest) for dest, field in TRAIN_FIELDS.items() if getattr(args, dest) is not None}
    if overrides.get("optim.clip") == 0:
        overrides["optim.clip"] = None
    return overrides


def requested_head_options(args: argparse.Namespace) -> tuple[dict[str, Any], int | None]:
    """The ``--head-option`` pairs as a dict and the K of ``--update-every`` (or of ``--head-option update_every``).

    Raises:
        CommandError: a malformed or repeated option, or two different values of K.
    """
    options: dict[str, Any] = {}
    for text in args.head_option:
        try:
            key, value = parse_head_option(text)
        except ValueError as error:
            raise CommandError(f"--head-option: {error}") from None
        if key in options:
            raise CommandError(f"--head-option {key} is given twice")
        options[key] = value
    update_every = args.update_every
    if "update_every" in options:
        value = options.pop("update_every")
        if update_every is not None and value != update_every:
            raise CommandError(f"--update-every {update_every} and --head-option update_every={value} disagree")
        update_every = value
    return options, update_every


def heads_with(option: str) -> list[str]:
    """The registered heads that take ``option``."""
    return [name for name in head_names() if option in (head_options(name) or {})]


def check_update_every(head: str, update_every: int | None) -> None:
    """Refuse ``--update-every`` for a head that never re-clusters.

    Raises:
        CommandError: naming the flag, its value, the head and the heads that take it.
    """
    if update_every is not None and "update_every" not in (head_options(head) or {"update_every": None}):
        raise CommandError(f"--update-every ({update_every}) means nothing for head {head!r}: it never re-clusters "
                           f"(heads that do: {', '.join(heads_with('update_every'))})")


def head_overrides(head: str, options: dict[str, Any], update_every: int | None) -> dict[str, Any]:
    """The config fields of a head with its options, checked against the head's signature.

    Raises:
        CommandError: an option the head does not take, or a value of the wrong type.
    """
    check_update_every(head, update_every)
    try:
        check_head_options(head, options)
    except ValueError as error:
        raise CommandError(str(error)) from None
    overrides: dict[str, Any] = {"head.name": head}
    if options:
        overrides["head.options"] = dict(options)
    if update_every is not None:
        overrides["head.update_every"] = update_every
    return overrides
