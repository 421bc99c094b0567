"""Heads chosen by name: a small registry of factories, each of which says which options it takes.

Every factory takes ``(in_features, n_classes, counts=None, **options)``:
``counts`` are the training-corpus word counts (a ``[N]`` tensor), which
frequency-based heads need and the others ignore. The *options* are the
keyword arguments of the class the factory builds (``builds=`` at registration),
less those the factory sets itself (``fixed=``), a typed group among them (a dataclass, such as the
self-organized head's ``reclustering``) given by the names of its fields: :func:`head_options` lists
them, and :func:`build_head` refuses any other option, or a value of the wrong
type, with a ValueError naming the head, before the head is built. The CLI's
``--head`` choices come from :func:`head_names`, so library and command line
cannot drift apart.

A head's name and options resolve once into a :class:`~sohsm.heads.spec.HeadSpec` (every option typed in the head's own
frozen dataclass), which :func:`build_head` takes and which answers, before the head exists, what callers
outside ``heads/`` would otherwise decide by its name: whether it ties, what a step holds, the options a
run's setting adds, an earlier release's options and checkpoints, presets (the hooks given at
registration: :func:`register_head`).

Example::

    >>> sorted(head_options("two_level_random"))
    ['backend', 'cluster_bias', 'cutoffs', 'div_value', 'n_clusters', 'projection', 'seed', 'word_dim']
    >>> build_head("full", 8, 100, gamma=2.0)
    Traceback (most recent call last):
    ...
    ValueError: head 'full' has no option 'gamma'; its options: bias
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sohsm.fields import did_you_mean
from sohsm.heads.base import Head, HeadMemory, SelfOrganizingHead, check_counts, check_size
from sohsm.heads.factory import place
from sohsm.heads.options import (
    HeadDefaults,
    HeadOption,
    HeadSetting,
    class_of,
    describe,
    fits,
    option_of,
    options_class,
    options_of,
)

HeadFactory = Callable[..., Head]



#: what a head knows about itself beyond its options (given at registration, see :func:`register_head`)
@dataclass(frozen=True)
class _Hooks:
    defaults: Callable[[str, Mapping[str, Any], HeadSetting], HeadDefaults] | None = None
    legacy_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    resume_refusal: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None
    update_every: Callable[[Mapping[str, Any], int], int] | None = None
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class _Entry:
    factory: HeadFactory
    #: the head's options as one frozen dataclass (:func:`~sohsm.heads.options.options_class`); ``None``: the
    #: factory takes ``**options`` for a class it does not name, so options cannot be checked
    values: type | None
    #: the class the factory builds (``builds=``, else its return annotation); ``None`` when neither says
    head_class: type[Head] | None
    hooks: _Hooks = _Hooks()

    @functools.cached_property
    def options(self) -> dict[str, HeadOption] | None:
        """The fields of :attr:`values` as options (what :func:`head_options` and ``--help`` list)."""
        if self.values is None:
            return None
        hints = typing.get_type_hints(self.values)
        return {f.name: option_of(f, hints) for f in dataclasses.fields(self.values)}


_REGISTRY: dict[str, _Entry] = {}


def register_head(name: str, builds: type | None = None, fixed: Iterable[str] = (), *,
                  defaults: Callable[[str, Mapping[str, Any], HeadSetting], HeadDefaults] | None = None,
                  legacy_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
                  resume_refusal: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None,
                  update_every: Callable[[Mapping[str, Any], int], int] | None = None,
                  presets: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[HeadFactory], HeadFactory]:
    """Decorator: register ``factory`` under ``name``; a duplicate name is an error.

    Args:
        name: the head's name (``--head`` on the command line).
        builds: the class the factory passes its ``**options`` to; its constructor's
            keyword arguments become the head's options. Without it, only the
            factory's own keyword arguments are options (and, if it takes
            ``**options``, any option is passed through unchecked).
        fixed: arguments of ``builds`` that the factory sets itself (e.g. the
            ``assignment`` of a two-level head with frequency clusters).

    What the head knows of itself beyond its options, so that no caller needs its name (each optional):

        defaults: ``defaults(name, options, setting)`` -> :class:`HeadDefaults`, the options a new run in a
            :class:`HeadSetting` takes where its own leave them open (:func:`setting_defaults`).
        legacy_options: ``legacy_options(options)`` -> the options a run saved by an earlier release (a config
            without ``optim.fused``) was trained with (:func:`legacy_options`).
        resume_refusal: ``resume_refusal(options, head_state)`` -> why a checkpoint's head state, written by an
            earlier release, cannot be trained on (:func:`resume_refusal`).
        update_every: ``update_every(options, steps_per_epoch)`` -> the steps between re-clusterings of a run
            whose epoch is ``steps_per_epoch`` steps, ``options`` with every default filled in
            (:func:`update_every_for`).
        presets: named sets of options (``{"word2vec": {...}}``: :func:`preset`).

    The class built (``builds``, else the factory's return annotation) answers whether the
    head can be tied to a model's embedding (:func:`tying_refusal`).
    """
    hooks = _Hooks(defaults, legacy_options, resume_refusal, update_every, dict(presets or {}))

    def decorate(factory: HeadFactory) -> HeadFactory:
        if name in _REGISTRY:
            raise ValueError(f"a head named {name!r} is already registered")
        if not callable(factory):
            raise TypeError(f"head factory for {name!r} must be callable")
        options = options_of(factory, builds, frozenset(fixed))
        values = None if options is None else options_class(name, options)
        _REGISTRY[name] = _Entry(factory, values, class_of(factory, builds), hooks)
        return factory

    return decorate


def head_names() -> list[str]:
    """Names of all registered heads, sorted."""
    return sorted(_REGISTRY)


#: the heads a run that does not fit may be pointed to, in the order tried: the paper's, then the cheapest fixed ones
_SUGGESTED = ("self_organized", "two_level_frequency", "adaptive")


def suggested_heads() -> tuple[str, ...]:
    """Heads worth suggesting where a run's head does not fit in memory (:data:`_SUGGESTED`, those registered)."""
    return tuple(name for name in _SUGGESTED if name in _REGISTRY)


def head_options(name: str) -> dict[str, HeadOption] | None:
    """The options head ``name`` takes, by name; ``None`` when its factory does not say (any is passed on).

    Raises:
        ValueError: an unknown head name.
    """
    return _entry(name).options


def check_head_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse an option head ``name`` does not take, or a value whose type does not fit its annotation.

    Ranges (``gamma > 0``, ...) are the head's own checks, made when it is built.

    Raises:
        ValueError: naming the head, the option, and the valid options or the expected type.
    """
    valid = head_options(name)
    if valid is None:
        return
    for key, value in options.items():
        if key not in valid:
            hint = did_you_mean(key, valid)
            raise ValueError(f"head {name!r} has no option {key!r}; {hint + ' ' if hint else ''}"
                             f"its options: {', '.join(sorted(valid)) or 'none'}")
        hint = valid[key].type
        if hint is not None and not fits(value, hint):
            raise ValueError(f"head {name!r}: option {key} must be {describe(hint)}, got {value!r} "
                             f"({type(value).__name__})")


def tying_refusal(name: str, in_features: int, options: Mapping[str, Any]) -> str | None:
    """Why head ``name`` with ``options`` cannot lend its word vectors to a model's ``in_features``-wide input
    embedding, or ``None`` where it can (:meth:`Head.tying_refusal` of the class it builds), before any head is built.

    Raises:
        ValueError: an unknown head name.
    """
    head_class = _entry(name).head_class
    if head_class is None:
        return "its factory does not say which head class it builds"
    return head_class.tying_refusal(int(in_features), dict(options))


def learns_clusters(name: str) -> bool:
    """Whether head ``name`` re-learns its clusters while it trains (a :class:`~sohsm.heads.base.SelfOrganizingHead`),
    so that a run of it has learned clusters to show.

    Raises:
        ValueError: an unknown head name.
    """
    head_class = _entry(name).head_class
    return head_class is not None and issubclass(head_class, SelfOrganizingHead)


def memory_estimate(name: str, in_features: int, n_classes: int, options: Mapping[str, Any], rows: int) -> HeadMemory:
    """What head ``name`` with ``options`` holds in a training step over ``rows`` hidden states
    (:meth:`Head.memory_estimate` of the class it builds; its word vectors alone where the factory does not say).

    Raises:
        ValueError: an unknown head name.
    """
    head_class = _entry(name).head_class
    if head_class is None:
        return HeadMemory(parameters=int(n_classes) * int(in_features), word_vectors=int(n_classes) * int(in_features))
    return head_class.memory_estimate(int(in_features), int(n_classes), dict(options), int(rows))


def setting_defaults(name: str, options: Mapping[str, Any], setting: HeadSetting) -> HeadDefaults:
    """The options head ``name`` takes in ``setting`` (a model and a vocabulary) where ``options`` leave them open,
    and why: a new run writes them into its config (the self-organized head's ``div_value=4`` for a tied LSTM over
    20,000 words or more). Empty for a head that has no such defaults.

    Raises:
        ValueError: an unknown head name.
    """
    hook = _entry(name).hooks.defaults
    return HeadDefaults({}) if hook is None else hook(name, dict(options), setting)


def legacy_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` of a run saved by an earlier release (a config without ``optim.fused``) with what head ``name``
    was then built with where its defaults have changed since (the self-organized head had no shortlist), so that
    such a run resumes and evaluates as it was trained. An unknown name keeps its options (the config refuses it).
    """
    entry = _REGISTRY.get(name)
    hook = None if entry is None else entry.hooks.legacy_options
    return dict(options) if hook is None else hook(dict(options))


def resume_refusal(name: str, options: Mapping[str, Any], head_state: Mapping[str, Any]) -> str | None:
    """Why head ``name`` with ``options`` cannot train on from ``head_state`` (a checkpoint's, written by an
    earlier release), as the rest of a sentence naming the checkpoint; ``None`` where it can.

    Raises:
        ValueError: an unknown head name.
    """
    hook = _entry(name).hooks.resume_refusal
    return None if hook is None else hook(dict(options), head_state)


def update_every_for(name: str, options: Mapping[str, Any], steps_per_epoch: int) -> int | None:
    """The steps between re-clusterings head ``name`` takes in a run of ``steps_per_epoch`` steps an epoch
    (``options`` naming none), or ``None`` for a head that does not re-cluster.

    Raises:
        ValueError: an unknown head name.
    """
    entry = _entry(name)
    if entry.hooks.update_every is None:
        return None
    defaults = {key: option.default for key, option in (entry.options or {}).items()}
    return entry.hooks.update_every({**defaults, **options}, int(steps_per_epoch))


def preset(name: str, preset_name: str) -> dict[str, Any]:
    """Head ``name``'s options of the preset ``preset_name`` (``"word2vec"``: word2vec's negative sampling for
    ``pmi``, row-sparse gradients for the tree and sampled heads); empty where the head has none of that name.

    Raises:
        ValueError: an unknown head name.
    """
    return dict(_entry(name).hooks.presets.get(preset_name, {}))


def takes_tree(name: str) -> bool:
    """Whether head ``name`` takes a whole hierarchy (a ``tree`` option) rather than clusters.

    Raises:
        ValueError: an unknown head name.
    """
    return "tree" in (head_options(name) or {})


def tree_heads() -> list[str]:
    """The registered heads that take a whole hierarchy of any depth, sorted."""
    return [name for name in head_names() if takes_tree(name)]


def hierarchy_options(name: str, options: Mapping[str, Any], *, tree: list | None = None,
                      n_clusters: int | None = None) -> dict[str, Any]:
    """``options`` with what head ``name`` takes of a given hierarchy: the ``tree`` head its whole ``tree``, a
    two-level head its number of clusters (``n_clusters``; and no shortlist of its own, which would add clusters
    no word is in: the clusters given hold every word).

    Raises:
        ValueError: the head takes no such hierarchy, or has another number of clusters.
    """
    options, takes = dict(options), head_options(name) or {}
    others = " or ".join(f"the {head!r} head" for head in tree_heads())
    if tree is not None:
        if not takes_tree(name):
            raise ValueError(f"head {name!r} takes no tree; use {others}")
        options["tree"] = tree
    if n_clusters is not None:
        if "n_clusters" not in takes:
            raise ValueError(f"head {name!r} has no word clusters and takes no hierarchy; "
                             f"use {others} or a two-level head")
        if options.setdefault("n_clusters", n_clusters) != n_clusters:
            raise ValueError(f"head {name!r} has {options['n_clusters']} clusters but the hierarchy {n_clusters}")
        if "shortlist" in takes:
            options.setdefault("shortlist", 0)
    return options


def with_seed(name: str, options: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """``options`` with a run's ``seed`` where head ``name`` takes one (random clusters, noise, trees) and
    ``options`` set none."""
    options = dict(options)
    if "seed" not in options and "seed" in (head_options(name) or {}):
        options["seed"] = seed
    return options


def build_head(name: Any, in_features: int, n_classes: int, counts=None, *, device=None, dtype=None,
               **options) -> Head:
    """Build the head registered as ``name`` with ``options`` (see :func:`head_options`), or the head of a
    :class:`~sohsm.heads.spec.HeadSpec` given as ``name`` (with ``options`` given as well), on ``device`` in
    ``dtype`` as torch's modules take them (:func:`~sohsm.heads.factory.place`).

    ``counts`` are checked for every head (:func:`~sohsm.heads.base.check_counts`), also for
    heads that do not use them, so bad counts are refused alike whichever head is chosen.

    Raises:
        ValueError: an unknown name (listing the known ones), bad counts, an option the
            head does not take (listing its options), a value of the wrong type, or a
            value the head refuses.
    """
    if not isinstance(name, str):  # a HeadSpec (:mod:`sohsm.heads.spec`)
        name, options = name.name, {**name.given, **options}
    entry = _entry(name)
    in_features = check_size("in_features", in_features, 1)
    n_classes = check_size("n_classes", n_classes, 2)
    check_head_options(name, options)
    if counts is not None:
        counts = check_counts(counts, n_classes)
    try:
        head = entry.factory(in_features, n_classes, counts=counts, **options)
    except ValueError as error:  # a value the head refuses: say which head refused it
        message = str(error)
        raise ValueError(message if message.startswith(f"head {name!r}") else f"head {name!r}: {message}") from error
    if not isinstance(head, Head):
        raise TypeError(f"factory for {name!r} returned {type(head).__name__}, not a Head")
    place(head, device, dtype)
    return head


# -- introspection ---------------------------------------------------------------------------
def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        hint = did_you_mean(name, head_names())
        raise ValueError(f"unknown head {name!r}; {hint + ' ' if hint else ''}known heads: {', '.join(head_names())}")
    return _REGISTRY[name]


