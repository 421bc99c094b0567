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

Example::

    >>> sorted(head_options("two_level_random"))
    ['backend', 'cutoffs', 'div_value', 'n_clusters', 'projection', 'seed', 'word_dim']
    >>> build_head("full", 8, 100, gamma=2.0)
    Traceback (most recent call last):
    ...
    ValueError: head 'full' has no option 'gamma'; its options: bias
"""
from __future__ import annotations

import dataclasses
import inspect
import numbers
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

from sohsm.fields import did_you_mean
from sohsm.heads.base import Head, HeadMemory, SelfOrganizingHead, check_counts, check_size

HeadFactory = Callable[..., Head]

#: arguments every factory gets from the caller: never options
_CALL_ARGUMENTS = frozenset({"self", "in_features", "n_classes", "counts"})


@dataclass(frozen=True)
class HeadOption:
    """One keyword argument a head takes: its name, default and annotated type (``None`` when not annotated)."""

    name: str
    default: Any
    type: Any


@dataclass(frozen=True)
class _Entry:
    factory: HeadFactory
    #: ``None``: the factory takes ``**options`` for a class it does not name, so options cannot be checked
    options: dict[str, HeadOption] | None
    #: the class the factory builds (``builds=``, else its return annotation); ``None`` when neither says
    head_class: type[Head] | None


_REGISTRY: dict[str, _Entry] = {}


def register_head(name: str, builds: type | None = None,
                  fixed: Iterable[str] = ()) -> Callable[[HeadFactory], HeadFactory]:
    """Decorator: register ``factory`` under ``name``; a duplicate name is an error.

    Args:
        name: the head's name (``--head`` on the command line).
        builds: the class the factory passes its ``**options`` to; its constructor's
            keyword arguments become the head's options. Without it, only the
            factory's own keyword arguments are options (and, if it takes
            ``**options``, any option is passed through unchecked).
        fixed: arguments of ``builds`` that the factory sets itself (e.g. the
            ``assignment`` of a two-level head with frequency clusters).

    The class built (``builds``, else the factory's return annotation) answers whether the
    head can be tied to a model's embedding (:func:`tying_refusal`).
    """

    def decorate(factory: HeadFactory) -> HeadFactory:
        if name in _REGISTRY:
            raise ValueError(f"a head named {name!r} is already registered")
        if not callable(factory):
            raise TypeError(f"head factory for {name!r} must be callable")
        _REGISTRY[name] = _Entry(factory, _options_of(factory, builds, frozenset(fixed)), _class_of(factory, builds))
        return factory

    return decorate


def head_names() -> list[str]:
    """Names of all registered heads, sorted."""
    return sorted(_REGISTRY)


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
        if hint is not None and not _fits(value, hint):
            raise ValueError(f"head {name!r}: option {key} must be {_describe(hint)}, got {value!r} "
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


def build_head(name: str, in_features: int, n_classes: int, counts=None, **options) -> Head:
    """Build the head registered as ``name`` with ``options`` (see :func:`head_options`).

    ``counts`` are checked for every head (:func:`~sohsm.heads.base.check_counts`), also for
    heads that do not use them, so bad counts are refused alike whichever head is chosen.

    Raises:
        ValueError: an unknown name (listing the known ones), bad counts, an option the
            head does not take (listing its options), a value of the wrong type, or a
            value the head refuses.
    """
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
    return head


# -- introspection ---------------------------------------------------------------------------
def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        hint = did_you_mean(name, head_names())
        raise ValueError(f"unknown head {name!r}; {hint + ' ' if hint else ''}known heads: {', '.join(head_names())}")
    return _REGISTRY[name]


def _keyword_parameters(func: Callable, skip: frozenset[str]) -> tuple[dict[str, HeadOption], bool]:
    """The keyword arguments of ``func`` not in ``skip`` with their resolved type hints, and whether it takes ``**``."""
    signature = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # an annotation that does not resolve: no type checks, names still known
        hints = {}
    out, open_ = {}, False
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            open_ = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip:
            group = _option_group(hints.get(p.name))
            if group is not None:  # a typed group of options (the self-organized head's Reclustering): its fields
                types_ = typing.get_type_hints(group)
                out.update({f.name: HeadOption(f.name, f.default, types_.get(f.name)) for f in dataclasses.fields(group)})
                continue
            default = None if p.default is p.empty else p.default
            out[p.name] = HeadOption(p.name, default, hints.get(p.name))
    return out, open_


def _option_group(hint: Any) -> type | None:
    """The dataclass a parameter annotated ``Group`` or ``Group | None`` takes, whose fields are options by name."""
    candidates = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    groups = [c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return groups[0] if len(groups) == 1 else None


def _class_of(factory: HeadFactory, builds: type | None) -> type[Head] | None:
    """The head class ``factory`` builds: ``builds``, else its return annotation where that is a :class:`Head`."""
    if builds is None:
        try:
            builds = typing.get_type_hints(factory).get("return")
        except Exception:  # an annotation that does not resolve
            return None
    return builds if isinstance(builds, type) and issubclass(builds, Head) else None


def _options_of(factory: HeadFactory, builds: type | None, fixed: frozenset[str]) -> dict[str, HeadOption] | None:
    options, open_ = _keyword_parameters(factory, _CALL_ARGUMENTS)
    if not open_:
        return options
    if builds is None:
        return None
    built, _ = _keyword_parameters(builds.__init__, _CALL_ARGUMENTS | fixed)
    return {**built, **options}


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint``; annotations other than int/float/bool/str accept anything."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))
