"""Command-line flags generated from a task's config dataclasses: every option is declared once, in its field.

For every leaf field of a run config (:class:`~sohsm.train.config.RunConfig`)
one flag: its name is the field's (``model.hidden_size`` -> ``--hidden-size``;
``head.name`` -> ``--head``, ``head.options`` -> ``--head-option KEY=VALUE``,
repeatable), its type the field's type, its help the field's ``#:`` comment
(or the config's ``field_help`` for it, where a task means something else by a shared field),
and the default it shows the dataclass's own. Choices and metavars come from
the field's metadata (``field(..., metadata={"choices": OPTIMIZERS})``), and so
does another name than the field's (``metadata={"flag": "model"}``: ``--model``). A
flag's parsed default is ``None`` (not given): only the flags a user types
become overrides, which keeps ``--resume``'s rule (what is not typed is the
run's). ``--config FILE`` reads a settings file whose fields the typed flags
override (:mod:`sohsm.cli.config_file`).

The values are checked by the config's own strict parsing
(:meth:`~sohsm.train.config.RunConfig.from_dict`); its errors name fields
through :class:`sohsm.fields.FieldError`, which :func:`render_error` writes with
the flags that set them.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

from sohsm.fields import Field, FieldError

if TYPE_CHECKING:  # (the training package imports torch, which --help does without)
    from sohsm.train.config import RunConfig

#: flags whose name is not the field's last part
FLAG_NAMES = {"head.name": "head", "head.options": "head_option"}
#: fields that have no flag (fixed per task)
NO_FLAG = frozenset({"task"})
#: the groups of the help, in order, the common first: each takes the fields of the sections and the loop's
#: settings it names; a setting of the loop named nowhere (a task's own) goes to "optimisation". "run" also
#: holds the command's own flags (``--run-dir``, ``--resume``, ``--quiet``) and ``--config``.
GROUPS = (
    ("run", ("epochs", "max_tokens", "time_budget", "device", "threads", "seed")),
    ("data", ("data",)),
    ("head", ("head",)),
    ("model", ("model",)),
    ("optimisation", ("optim", "bptt", "batch_size")),
    ("evaluation, checkpoints, logging and speed",
     ("eval_every", "eval_batch_size", "checkpoint_every", "log_every", "amp", "compile")),
)
#: a flag with more choices than this many characters shows NAME and lists them in its help
LONG_CHOICES = 40


@dataclasses.dataclass(frozen=True)
class Flag:
    """One generated flag: the config field it sets and how it reads its value."""

    path: str
    dest: str
    type: Any
    optional: bool
    default: Any
    help: str
    metadata: Any

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines above each field of dataclass ``cls``, joined: its documentation (``None``
    written ``none``, the word its flag takes). A field declared in a base class (the loop's settings,
    :class:`~sohsm.train.config.LoopSettings`) has the base's comment unless ``cls`` declares it again with one."""
    out: dict[str, str] = {}
    for owner in reversed(cls.__mro__[:-1]):  # the bases first; ``object`` has no source
        if "__annotations__" in vars(owner):
            out.update(_own_field_comments(owner))
    return out


def _own_field_comments(cls: type) -> dict[str, str]:
    """:func:`field_comments` of the fields ``cls``'s own body declares with a comment."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    out: dict[str, str] = {}
    body = ast.parse("\n".join(lines)).body[0]
    assert isinstance(body, ast.ClassDef)  # the source of a class
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if comment:
                out[node.target.id] = " ".join(comment).replace("``None``", "none").replace("``", "")
    return out


def _leaves(config_class: type[RunConfig], prefix: str = ""):
    """``(path, field, owner class, default value)`` of every leaf field of ``config_class``."""
    hints = typing.get_type_hints(config_class)
    default = config_class()
    for f in dataclasses.fields(config_class):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            section = getattr(default, f.name)
            for g in dataclasses.fields(section):
                yield f"{f.name}.{g.name}", g, type(section), getattr(section, g.name)
        else:
            yield prefix + f.name, f, config_class, getattr(default, f.name)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``(inner type, whether None is allowed)`` of ``int | None`` and the like."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def config_flags(config_class: type[RunConfig]) -> list[Flag]:
    """The flags of every leaf field of ``config_class`` (but :data:`NO_FLAG`).

    Raises:
        ValueError: two fields would get the same flag.
    """
    comments: dict[type, dict[str, str]] = {}
    flags: dict[str, Flag] = {}
    for path, f, owner, default in _leaves(config_class):
        if path in NO_FLAG:
            continue
        if owner not in comments:
            comments[owner] = field_comments(owner)
        dest = f.metadata.get("flag") or FLAG_NAMES.get(path, path.rpartition(".")[2])
        if dest in flags:
            raise ValueError(f"{path} and {flags[dest].path} would both be --{dest.replace('_', '-')}")
        hint, optional = _unwrap(typing.get_type_hints(owner)[f.name])
        text = getattr(config_class, "field_help", {}).get(path) or comments[owner].get(f.name, "")
        flags[dest] = Flag(path, dest, hint, optional, default, text, f.metadata)
    return list(flags.values())


def _show(value: Any) -> str:
    return ("none" if value is None else "{}" if value == {} else str(value).lower() if isinstance(value, bool)
            else str(value))


def read_int(text: str) -> int:
    """An integer as a user writes a budget: ``100000``, ``1e5``, ``2.5e6``, ``100_000`` (a float's notation is
    taken where its value is a whole number).

    Raises:
        ValueError: not a whole number (``2.5``, ``big``).
    """
    try:
        return int(text)
    except ValueError:
        value = float(text)  # raises for a text that is no number
        if not value.is_integer():
            raise ValueError(f"not a whole number: {text!r}") from None
        return int(value)


class _NoneGiven:
    """``none`` typed for a flag whose field may be ``None``, told apart from the flag not given (argparse's
    ``None``): a field whose default is not ``None`` (``--max-size none``) must still become ``None``."""

    def __repr__(self) -> str:
        return "none"


#: what a ``none`` typed on the command line reads as, until :func:`typed_fields` makes it ``None``
NONE_GIVEN = _NoneGiven()


def given_value(value: Any) -> Any:
    """A flag's value as the config takes it: :data:`NONE_GIVEN` is ``None``."""
    return None if value is NONE_GIVEN else value


def _reader(flag: Flag):
    """The argparse ``type`` of a flag: the field's type (an int also in a float's notation, ``1e5``: :func:`read_int`),
    and ``none`` for a field that may be ``None``."""
    convert = read_int if flag.type is int else flag.type

    def read(text: str) -> Any:
        if flag.optional and text.lower() == "none":
            return NONE_GIVEN
        return convert(text)

    read.__name__ = flag.type.__name__  # argparse names the type in its error: "invalid int value"
    return read


def group_of(path: str) -> str:
    """The title of the help group that lists the field at ``path`` (:data:`GROUPS`)."""
    for title, names in GROUPS:
        if path in names or path.partition(".")[0] in names:
            return title
    return "optimisation"


def add_config_flags(parser: argparse.ArgumentParser, config_class: type[RunConfig], *, leave_out: tuple[str, ...] = (),
                     command_flags: Callable[[argparse._ArgumentGroup], None] = lambda group: None) -> list[Flag]:
    """Add a flag for every field of ``config_class`` (but those in ``leave_out``) and ``--config FILE``, in the
    groups of :data:`GROUPS`; ``command_flags(group)`` first adds the command's own flags to the "run" group.
    Returns the flags added.

    A field that a new run must be given shows no default (the library's stands where the flag is not asked).
    """
    flags = [f for f in config_flags(config_class) if f.path not in leave_out]
    groups = {title: parser.add_argument_group(title) for title, _ in GROUPS
              if title == "run" or any(group_of(f.path) == title for f in flags)}
    command_flags(groups["run"])
    groups["run"].add_argument("--config", metavar="FILE", help="a settings file (YAML or JSON): the flags' names as "
                               "keys (head: full, hidden_size: 64), or the sections of a run's config.json (which is "
                               "accepted as it is); the flags given override it")
    required = {f.path for f in flags if f.metadata.get("required")} - set(config_class.defaulted_fields)
    for f in sorted(flags, key=lambda f: [t for t, _ in GROUPS].index(group_of(f.path))):
        choices = f.metadata.get("choices")
        choices = choices() if callable(choices) else choices
        if f.path in required:
            default = " (a new run must name it)"
        elif f.default is None and "none" in f.help.lower():
            default = ""
        elif "default_help" in f.metadata:  # a default that depends on other choices
            default = f" (default: {f.metadata['default_help']})"
        else:
            default = f" (default: {chosen_default(f, flags, config_class)})"
        kwargs: dict[str, Any] = {"dest": f.dest, "default": None, "help": (f.help + default).strip()}
        if f.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.type is dict or typing.get_origin(f.type) is dict:
            kwargs.update(action="append", metavar="KEY=VALUE", default=[])
        else:
            kwargs.update(type=_reader(f), metavar=f.metadata.get("metavar", "N" if f.type is int else "X"
                                                                    if f.type is float else f.dest.upper()))
            if choices:
                listed = len(",".join(choices)) > LONG_CHOICES
                kwargs.update(choices=tuple(choices), metavar="NAME" if listed else None)
                if listed:
                    kwargs["help"] += f"; one of: {', '.join(choices)}"
        groups[group_of(f.path)].add_argument(f.option, **kwargs)
    return flags


def chosen_default(flag: Flag, flags: list[Flag], config_class: type[RunConfig]) -> str:
    """The default a new run takes for ``flag``'s field, as ``--help`` shows it: the field's own, or the one the
    default of a choice brings (:attr:`~sohsm.train.config.RunConfig.choice_defaults`: an LSTM's 30 warm-up steps),
    followed by what each other value of that choice brings (``30; --model transformer: 100``)."""
    shown, others = _show(flag.default), []
    option = {f.path: f.option for f in flags}
    defaults = config_class()
    for path, by_value in getattr(config_class, "choice_defaults", {}).items():
        own = by_value.get(defaults.get(path), {})
        if flag.path in own:
            shown = _show(own[flag.path])
        for value, brought in by_value.items():
            if value != defaults.get(path) and _show(brought.get(flag.path, flag.default)) != shown:
                others.append(f"{option.get(path, path)} {value}: {_show(brought.get(flag.path, flag.default))}")
    return "; ".join([shown, *others])


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


def typed_fields(args: argparse.Namespace, flags: list[Flag]) -> dict[str, Any]:
    """``{field: value}`` of the flags given on the command line (``head.options`` and ``head.update_every``
    excepted: :func:`sohsm.cli.train_options.requested_head_options` reads them together).

    A field whose metadata says ``none_if=V`` reads the value ``V`` as ``None`` (``--clip 0``: no clipping).
    """
    out = {}
    for f in flags:
        value = getattr(args, f.dest, None)
        if value is None or f.path in ("head.options", "head.update_every"):
            continue
        value = given_value(value)
        if "none_if" in f.metadata and value == f.metadata["none_if"]:
            value = None
        out[f.path] = value
    return out


def render_error(error: Exception, flags: list[Flag], typed: set[str]) -> str:
    """The message of ``error`` with its fields named by the flags that set them.

    A field the user typed, or one suggested with a value (``use text_mode='running'``),
    reads as its flag (``--text-mode running``); others keep their field names, unless the message names one
    by its flag: then every field it names that has a flag reads as it (``--tie-weights needs --emb-size ==
    --hidden-size``, not ``... == model.hidden_size``), so that one line speaks one language.
    """
    if not isinstance(error, FieldError):
        return str(error)
    by_path = {f.path: f for f in flags}
    by_leaf = {f.path.rpartition(".")[2]: f for f in flags}

    def flag_of(field: Field) -> Flag | None:
        return by_path.get(field.path) or by_leaf.get(field.path)

    as_flags = any(field.suggested or (flag := flag_of(field)) is not None and flag.path in typed
                   for field in error.fields)

    def name(field: Field) -> str:
        flag = flag_of(field)
        if flag is None or not as_flags:
            return field.text()
        return f"{flag.option} {field.value}" if field.has_value else flag.option

    return error.render(name)
