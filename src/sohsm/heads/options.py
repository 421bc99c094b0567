"""A head's options read from its signature, the typed values they resolve to, and what a run's setting adds.

The registry (:mod:`sohsm.heads.registry`) reads a factory's keyword arguments, and those of the class it
builds, as the head's options (:class:`HeadOption`: name, default, annotated type; a parameter annotated with a
dataclass, such as the self-organized head's ``Reclustering``, stands for its fields), and makes of them one
frozen dataclass per head (:func:`options_class`): the typed values a :class:`~sohsm.heads.HeadSpec` holds.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

from sohsm.heads.base import Head

#: arguments every factory gets from the caller: never options
CALL_ARGUMENTS = frozenset({"self", "in_features", "n_classes", "counts"})


@dataclass(frozen=True)
class HeadOption:
    """One keyword argument a head takes: its name, default and annotated type (``None`` when not annotated)."""

    name: str
    default: Any
    type: Any


@dataclass(frozen=True)
class HeadSetting:
    """What a new run's head options may follow from: the model that feeds the head and the words it scores.

    Attributes:
        model: the model's kind (``"lstm"``, ``"transformer"``, ...: ``model.architecture`` where a task has one).
        hidden_size: the width of the hidden states the head scores (``in_features``).
        tied: whether the model's input embedding is the head's word vectors.
        n_words: the vocabulary's size (``n_classes``).
        subwords: whether the vocabulary is a subword tokenizer's rather than words.
        device: the type of device the run trains on (``"cpu"``, ``"cuda"``, ...).
        unseen_words: how many of the words the training split never shows (count 0: the rows of a tokenizer's
            vocabulary that the corpus does not use).
    """

    model: str
    hidden_size: int
    tied: bool
    n_words: int
    subwords: bool = False
    device: str = "cpu"
    unseen_words: int = 0


class HeadDefaults(NamedTuple):
    """Options a head takes in a setting where a run's own leave them open, and why (a sentence for the run's
    start; empty when there are none)."""

    options: dict[str, Any]
    reason: str = ""


#: torch's factory kwargs, which every head's constructor takes (:mod:`sohsm.heads.factory`): where a head is made,
#: not one of its options (:func:`~sohsm.heads.build_head` takes them itself)
FACTORY_KWARGS = frozenset({"device", "dtype"})


def keyword_parameters(func: Callable, skip: frozenset[str]) -> tuple[dict[str, HeadOption], bool]:
    """The keyword arguments of ``func`` not in ``skip`` (nor :data:`FACTORY_KWARGS`) with their resolved type hints,
    and whether it takes ``**``."""
    skip = skip | FACTORY_KWARGS
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
            group = option_group(hints.get(p.name))
            if group is not None:  # a typed group of options (the self-organized head's Reclustering): its fields
                types_ = typing.get_type_hints(group)
                out.update({f.name: HeadOption(f.name, f.default, types_.get(f.name))
                            for f in dataclasses.fields(group)})
                continue
            default = None if p.default is p.empty else p.default
            out[p.name] = HeadOption(p.name, default, hints.get(p.name))
    return out, open_


def option_group(hint: Any) -> type | None:
    """The dataclass a parameter annotated ``Group`` or ``Group | None`` takes, whose fields are options by name."""
    candidates = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    groups = [c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return groups[0] if len(groups) == 1 else None


def class_of(factory: Callable[..., Head], builds: type | None) -> type[Head] | None:
    """The head class ``factory`` builds: ``builds``, else its return annotation where that is a :class:`Head`."""
    if builds is None:
        try:
            builds = typing.get_type_hints(factory).get("return")
        except Exception:  # an annotation that does not resolve
            return None
    return builds if isinstance(builds, type) and issubclass(builds, Head) else None


def options_of(factory: Callable[..., Head], builds: type[Any] | None,
               fixed: frozenset[str]) -> dict[str, HeadOption] | None:
    options, open_ = keyword_parameters(factory, CALL_ARGUMENTS)
    if not open_:
        return options
    if builds is None:
        return None
    built, _ = keyword_parameters(builds.__init__, CALL_ARGUMENTS | fixed)
    return {**built, **options}


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint``; annotations other than int/float/bool/str accept anything."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return any(fits(value, arg) for arg in typing.get_args(hint))
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


def describe(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(describe(arg) for arg in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def options_class(name: str, options: dict[str, HeadOption]) -> type:
    """A frozen dataclass of head ``name``'s options, each typed as annotated (``Any`` where not) with its default:
    the values of one head's options, given or not (``SelfOrganizedOptions(gamma=2.0, ...)``)."""
    fields = []
    for option in options.values():
        default = option.default
        if isinstance(default, (list, dict, set)):  # a mutable default: each instance its own copy
            spec = dataclasses.field(default_factory=functools.partial(copy.deepcopy, default))
        else:
            spec = dataclasses.field(default=default)
        fields.append((option.name, Any if option.type is None else option.type, spec))
    title = "".join(part.capitalize() for part in name.split("_")) + "Options"
    values = dataclasses.make_dataclass(title, fields, frozen=True)
    values.__module__ = __name__
    return values


def option_of(field: dataclasses.Field, hints: dict[str, Any]) -> HeadOption:
    """The :class:`HeadOption` a field of an :func:`options_class` stands for."""
    if field.default is dataclasses.MISSING:
        assert callable(field.default_factory)  # an option has a default or a factory (options_class)
        default = field.default_factory()
    else:
        default = field.default
    hint = hints.get(field.name)
    return HeadOption(field.name, default, None if hint is Any else hint)
