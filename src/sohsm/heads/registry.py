"""Heads chosen by name: a small registry of factories with one signature.

Every factory takes ``(in_features, n_classes, counts=None, seed=0, **options)``:
``counts`` are the training-corpus word counts (a ``[N]`` tensor), which
frequency-based heads need, and ``seed`` seeds random structure (random
clusters); heads without such structure ignore both. The CLI's ``--head`` choices come
from :func:`head_names`, so library and command line cannot drift apart.
"""
from __future__ import annotations

from typing import Callable

from sohsm.heads.base import Head, check_counts, check_size

HeadFactory = Callable[..., Head]
_REGISTRY: dict[str, HeadFactory] = {}


def register_head(name: str) -> Callable[[HeadFactory], HeadFactory]:
    """Decorator: register ``factory`` under ``name``; a duplicate name is an error."""

    def decorate(factory: HeadFactory) -> HeadFactory:
        if name in _REGISTRY:
            raise ValueError(f"a head named {name!r} is already registered")
        if not callable(factory):
            raise TypeError(f"head factory for {name!r} must be callable")
        _REGISTRY[name] = factory
        return factory

    return decorate


def head_names() -> list[str]:
    """Names of all registered heads, sorted."""
    return sorted(_REGISTRY)


def build_head(name: str, in_features: int, n_classes: int, counts=None, **options) -> Head:
    """Build the head registered as ``name``; unknown names raise a ValueError listing the known ones.

    ``counts`` are checked for every head (:func:`~sohsm.heads.base.check_counts`), also for
    heads that do not use them, so bad counts are refused alike whichever head is chosen.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown head {name!r}; known heads: {', '.join(head_names())}")
    if counts is not None:
        counts = check_counts(counts, check_size("n_classes", n_classes, 2))
    head = _REGISTRY[name](in_features, n_classes, counts=counts, **options)
    if not isinstance(head, Head):
        raise TypeError(f"factory for {name!r} returned {type(head).__name__}, not a Head")
    return head
