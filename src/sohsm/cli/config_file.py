"""Settings files (``--config FILE``, YAML or JSON): the flags' names as keys, or a run's ``config.json`` as it is.

A key is what a user already knows from the command line, without the dashes::

    corpus: ptb              # --corpus ptb
    head: self_organized     # --head self_organized
    head_option: {gamma: 2}  # --head-option gamma=2 (also a list of KEY=VALUE texts)
    emb-size: 256            # --emb-size 256 (emb_size, or model.emb_size, alike)
    lr: 1e-3                 # a text is read as the flag reads it, so YAML's '1e-3' is a number here too

or a section of the config holding its fields (``model: {emb_size: 256}``), the shape
of a run's ``config.json``, which is accepted back as it is; the two forms mix. A
key the config does not know is refused in one line that says where the setting
belongs, or which known names are close.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sohsm.cli.config_flags import Flag, config_flags, parse_head_option, parse_option_list, read_int
from sohsm.fields import FieldError, did_you_mean

if TYPE_CHECKING:  # (the training package imports torch, which --help does without)
    from sohsm.train.config import RunConfig

#: the flag whose value is the head's options, and the key a config file may also give them under
OPTIONS = "head.options"


def read_config_file(path: str, config_class: type[RunConfig],
                     beside: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{field: value}`` (dotted fields) of the settings a file sets, checked against ``config_class``.

    The file is checked as a new run would take it (:meth:`~sohsm.train.config.RunConfig.from_overrides`: a
    transformer given only ``hidden_size`` takes it for its embedding too), with the settings typed ``beside``
    it (dotted fields) in place of its own: flags override the file, so a flag may mend what the file alone
    gets wrong. An error that names one of those typed settings is left for the config built from both to
    raise, which names the flag.

    Raises:
        ValueError: an unreadable file, not a mapping, an unknown key (saying where it belongs), a key given
            twice, a value of the wrong type or out of range, or a config of another task.
    """
    data = _load(path)
    task = config_class().task
    if data.get("task", task) != task:  # a file without it is one of this task's
        raise ValueError(f"--config {path}: a config of the {data['task']!r} task, not of {task!r}")
    beside = dict(beside or {})
    try:
        settings = settings_of(data, config_class)
        config_class.from_overrides({**settings, **beside})  # every value of its type and range
    except FieldError as error:
        if not any(field.path in beside for field in error.fields):
            raise ValueError(f"--config {path}: {error}") from None
    except ValueError as error:
        raise ValueError(f"--config {path}: {error}") from None
    return settings


def _load(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"--config {path}: cannot read it ({error.strerror or error})") from None
    try:
        if Path(path).suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml  # PyYAML reads JSON too

            data = yaml.safe_load(text)
    except ValueError as error:
        raise ValueError(f"--config {path}: not valid JSON ({error})") from None
    except Exception as error:  # yaml.YAMLError and its kin
        raise ValueError(f"--config {path}: not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of settings (corpus: ptb, ...), "
                         f"got {type(data).__name__}")
    return data


def _name(key: Any) -> str:
    """A key as a field or flag name: ``--emb-size``, ``emb-size`` and ``emb_size`` alike."""
    return str(key).lstrip("-").replace("-", "_")


def settings_of(data: Mapping[str, Any], config_class: type[RunConfig]) -> dict[str, Any]:
    """``{dotted field: value}`` of a settings mapping, flat keys (the flags' names) and sections alike.

    Raises:
        ValueError: an unknown key, saying where it belongs or which known names are close; a setting given
            twice; head options that are not a mapping or KEY=VALUE texts.
    """
    flags = config_flags(config_class)
    by_name = {**{f.dest: f for f in flags}, **{f.path: f for f in flags}}
    sections = _sections(config_class)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}

    def put(flag: Flag, value: Any, key: str, flat: bool) -> None:
        if flag.path in out:
            raise ValueError(f"{flag.path} is set twice, as {given[flag.path]} and as {key}")
        out[flag.path], given[flag.path] = _value(flag, value, flat), key

    for key, value in data.items():
        name = _name(key)
        if name == "task":
            continue
        if name in sections and isinstance(value, Mapping):
            for sub, inner in value.items():
                path = f"{name}.{_name(sub)}"
                if path not in by_name:
                    raise ValueError(_unknown_in_section(name, _name(sub), sections, by_name))
                put(by_name[path], inner, f"{key}.{sub}", flat=False)
        elif name in by_name:
            put(by_name[name], value, str(key), flat=True)
        elif name in sections:
            raise ValueError(f"{key} is a section: give it a mapping of its settings ({key}: {{...}}), or write "
                             f"them at the top level ({', '.join(sections[name][:2])}, ...)")
        else:
            raise ValueError(_unknown(str(key), name, by_name, sections))
    return out


def _sections(config_class: type[RunConfig]) -> dict[str, list[str]]:
    """``{section: its field names, in order}`` of the config's dataclass-valued fields (data, model, head, optim)."""
    hints = typing.get_type_hints(config_class)
    return {f.name: [g.name for g in dataclasses.fields(hints[f.name])]
            for f in dataclasses.fields(config_class) if dataclasses.is_dataclass(hints[f.name])}


def _value(flag: Flag, value: Any, flat: bool) -> Any:
    """``value`` as the field takes it: head options from a mapping or KEY=VALUE texts; a text for a field of
    another type read as its flag reads it (where that reading fails, the value stays, for the config's own
    check to refuse); for a flat key, the flag's ``none_if`` too (``clip: 0``: no clipping)."""
    if flag.path == OPTIONS:
        if isinstance(value, str):
            return parse_option_list(value)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return dict(parse_head_option(item) for item in value)
        return value
    if isinstance(value, str) and flag.type not in (str, bool):
        try:
            value = None if flag.optional and value.lower() == "none" else (
                read_int(value) if flag.type is int else flag.type(value))
        except ValueError:
            return value
    if flag.type is int and isinstance(value, float) and value.is_integer():  # YAML's 1.0e5
        value = int(value)
    if flat and "none_if" in flag.metadata and value == flag.metadata["none_if"]:
        return None
    return value


def _a(word: str) -> str:
    """``word`` with its article: ``a data``, ``an optim``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _unknown_in_section(section: str, name: str, sections: dict[str, list[str]], by_name: dict[str, Flag]) -> str:
    """Why ``section.name`` is refused: it belongs to another section, or is close to a known name."""
    homes = [other for other, fields in sections.items() if name in fields]
    if homes:
        flag = by_name[f"{homes[0]}.{name}"]
        return (f"{section}.{name}: {name} is not {_a(section)} setting but {_a(homes[0])} one: write it under "
                f"{homes[0]}: or at the top level ({flag.dest}: ...)")
    if name in by_name:  # a setting of the loop, not of a section
        return f"{section}.{name}: {name} is not {_a(section)} setting: write it at the top level ({name}: ...)"
    hint = did_you_mean(name, sections[section])
    hint = f"; {hint}" if hint else ""
    return f"unknown setting {section}.{name}{hint} ({section} holds {', '.join(sections[section])})"


def _unknown(key: str, name: str, by_name: dict[str, Flag], sections: dict[str, list[str]]) -> str:
    """Why a top-level key is refused, with the known names close to it; a field written flat whose flag has
    another name (``architecture:``, which is ``model:``, the ``--model`` flag) is pointed to that name."""
    renamed = {flag.path.rpartition(".")[2]: flag for flag in by_name.values()
               if flag.dest != flag.path.rpartition(".")[2]}
    if name in renamed:
        flag = renamed[name]
        section = flag.path.rpartition(".")[0]
        return (f"unknown setting {key!r}: did you mean {flag.dest}? ({flag.path} is the {flag.option} flag: "
                f"{flag.dest}: ... at the top level, or {section}: {{{name}: ...}})")
    hint = did_you_mean(name, sorted({flag.dest for flag in by_name.values()}))
    hint = hint + " " if hint else ""
    return (f"unknown setting {key!r}: {hint}a key is a flag's name without its dashes (emb_size or emb-size for "
            f"--emb-size) or a section holding its settings ({', '.join(sections)})")
