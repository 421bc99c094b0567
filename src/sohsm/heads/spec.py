"""A head's name and options resolved once (:class:`HeadSpec`): what the registry's questions are asked of before
the head exists, and what :func:`~sohsm.heads.registry.build_head` takes."""
from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sohsm.heads.base import Head, HeadMemory
from sohsm.heads.options import HeadDefaults, HeadSetting
from sohsm.heads.registry import (
    _entry,
    build_head,
    check_head_options,
    hierarchy_options,
    learns_clusters,
    memory_estimate,
    preset,
    resume_refusal,
    setting_defaults,
    takes_tree,
    tying_refusal,
    update_every_for,
    with_seed,
)


@dataclass(frozen=True, eq=False)
class HeadSpec:
    """A head's name and options resolved once: what :func:`build_head` takes, and what is asked of a head before
    it exists (tying, memory, a run's defaults, earlier releases, presets), so that no station re-reads its options.

    Attributes:
        name: the registered head.
        given: the options as given (what a run's ``config.json`` keeps), read-only.
        values: every option typed, given or defaulted: an instance of the head's own frozen dataclass
            (``spec.values.div_value``); ``None`` for a factory whose options are not known.
        checked: whether ``given`` was checked against the head's options (:func:`check_head_options`); a config
            asks its questions before its options are checked, which building the head does.

    Example::

        >>> spec = HeadSpec.of("two_level_random", {"div_value": 4})
        >>> spec.values.div_value, spec.values.n_clusters, type(spec.values).__name__
        (4, None, 'TwoLevelRandomOptions')
        >>> spec.tying_refusal(64) is None, spec.memory_estimate(64, 1000, rows=10).word_vectors
        (True, 8884)
    """

    name: str
    given: Mapping[str, Any]
    values: Any
    checked: bool = True

    @classmethod
    def of(cls, name: str, options: Mapping[str, Any] | None = None, *, check: bool = True) -> HeadSpec:
        """Resolve head ``name``'s ``options``.

        Raises:
            ValueError: an unknown head; with ``check``, an option it does not take or a value of the wrong type.
        """
        entry, given = _entry(name), dict(options or {})
        if check:
            check_head_options(name, given)
        values = None
        if entry.values is not None:
            assert entry.options is not None  # (the fields of values)
            try:
                values = entry.values(**{k: v for k, v in given.items() if k in entry.options})
            except (TypeError, ValueError):  # unchecked options: the values are unknown until they are
                values = None
        return cls(name, types.MappingProxyType(given), values, check)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadSpec) and (self.name, dict(self.given)) == (other.name, dict(other.given))

    def replace(self, **options: Any) -> HeadSpec:
        """The spec with ``options`` given as well (resolved again, checked as this one was)."""
        return HeadSpec.of(self.name, {**self.given, **options}, check=self.checked)

    # -- what is asked of the head before it exists --------------------------------------------
    def tying_refusal(self, in_features: int) -> str | None:
        """Why it cannot lend its word vectors to an ``in_features``-wide embedding (:func:`tying_refusal`)."""
        return tying_refusal(self.name, in_features, self.given)

    def memory_estimate(self, in_features: int, n_classes: int, rows: int) -> HeadMemory:
        """What it holds in a training step over ``rows`` hidden states (:func:`memory_estimate`)."""
        return memory_estimate(self.name, in_features, n_classes, self.given, rows)

    def settle(self, setting: HeadSetting) -> tuple[HeadSpec, HeadDefaults]:
        """``(the spec with the options it takes in setting, those options and why)`` (:func:`setting_defaults`)."""
        added = setting_defaults(self.name, self.given, setting)
        return (self.replace(**added.options) if added.options else self), added

    def resume_refusal(self, head_state: Mapping[str, Any]) -> str | None:
        """Why it cannot train on from an earlier release's ``head_state`` (:func:`resume_refusal`)."""
        return resume_refusal(self.name, self.given, head_state)

    def with_preset(self, preset_name: str) -> HeadSpec:
        """The spec with its preset ``preset_name`` under the options given (:func:`preset`)."""
        return HeadSpec.of(self.name, {**preset(self.name, preset_name), **self.given}, check=self.checked)

    def update_every_for(self, steps_per_epoch: int) -> int | None:
        """K in an epoch of ``steps_per_epoch`` steps, or ``None`` (:func:`update_every_for`)."""
        return update_every_for(self.name, self.given, steps_per_epoch)

    def for_run(self, seed: int, *, tree: list | None = None, n_clusters: int | None = None) -> HeadSpec:
        """The spec a run builds: its ``seed`` where the head takes one and none is given, a hierarchy's parts
        (:func:`with_seed`, :func:`hierarchy_options`)."""
        options = hierarchy_options(self.name, with_seed(self.name, self.given, seed), tree=tree,
                                    n_clusters=n_clusters)
        return HeadSpec.of(self.name, options, check=self.checked)

    @property
    def learns_clusters(self) -> bool:
        """Whether the head re-learns its clusters (:func:`learns_clusters`)."""
        return learns_clusters(self.name)

    @property
    def takes_tree(self) -> bool:
        """Whether the head takes a whole hierarchy (:func:`takes_tree`)."""
        return takes_tree(self.name)

    def build(self, in_features: int, n_classes: int, counts=None) -> Head:
        """The head (:func:`build_head`, which checks the options)."""
        return build_head(self, in_features, n_classes, counts=counts)
