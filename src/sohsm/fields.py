"""Errors about settings whose message names its settings by construction, so each reader can name them its way.

The library knows config fields (``model.hidden_size``), a command line knows
flags (``--hidden-size``): a :class:`FieldError` keeps the fields of its message
apart from the text, and :meth:`FieldError.render` writes them either way::

    >>> error = FieldError("{} must be >= 1, got 0", Field("model.hidden_size"))
    >>> str(error)
    'model.hidden_size must be >= 1, got 0'
    >>> error.render(lambda field: "--" + field.path.rpartition(".")[2].replace("_", "-"))
    '--hidden-size must be >= 1, got 0'
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple


class Field(NamedTuple):
    """A setting named in a message.

    Attributes:
        path: the dotted config field (``"model.hidden_size"``), or a library argument's name (``"text_mode"``).
        value: the value it has (``has_value``), written after it: ``batch_size=900``.
        has_value: whether ``value`` is part of the reference.
        suggested: the value is one to set (``use text_mode='running'``), not the one it has.
    """

    path: str
    value: Any = None
    has_value: bool = False
    suggested: bool = False

    def text(self) -> str:
        """How the library writes it: ``model.hidden_size``, ``batch_size=900``, ``text_mode='running'``."""
        if not self.has_value:
            return self.path
        return f"{self.path}={self.value!r}" if self.suggested else f"{self.path}={self.value}"


def has(path: str, value: Any) -> Field:
    """A field with the value it has: ``batch_size=900``."""
    return Field(path, value, True)


def suggest(path: str, value: Any) -> Field:
    """A field with a value to set: ``text_mode='running'``."""
    return Field(path, value, True, True)


class FieldText(str):
    """A message (a ``str``, as the library writes it) that keeps its template and fields, to be joined into
    a :class:`FieldError` (:meth:`FieldError.joined`)."""

    template: str
    fields: tuple[Field, ...]

    def __new__(cls, template: str, *fields: Field | str) -> FieldText:
        parsed = tuple(f if isinstance(f, Field) else Field(f) for f in fields)
        text = super().__new__(cls, template.format(*(f.text() for f in parsed)))
        text.template, text.fields = template, parsed
        return text

    @classmethod
    def on(cls, field: Field | str, text: str) -> FieldText:
        """``field`` followed by ``text``."""
        return cls("{} " + escape(text), field)


class FieldError(ValueError):
    """A refused setting: a message template whose ``{}`` are :class:`Field`\\ s.

    ``str(error)`` writes each field as the library names it (:meth:`Field.text`).
    """

    def __init__(self, template: str, *fields: Field | str) -> None:
        self.template = template
        self.fields = tuple(f if isinstance(f, Field) else Field(f) for f in fields)
        super().__init__(self.render(Field.text))

    @classmethod
    def on(cls, field: Field | str, text: str) -> FieldError:
        """``field`` followed by ``text``: ``FieldError.on("optim.lr", "must be positive, got 0")``."""
        return cls("{} " + escape(text), field)

    @classmethod
    def joined(cls, prefix: str, errors: Sequence[FieldError | FieldText], separator: str = "; ") -> FieldError:
        """One error: ``prefix`` (literal text) and the messages of ``errors``, joined by ``separator``."""
        template = escape(prefix) + escape(separator).join(e.template for e in errors)
        return cls(template, *(f for e in errors for f in e.fields))

    def render(self, name: Callable[[Field], str]) -> str:
        """The message with every field written by ``name``."""
        return self.template.format(*(name(f) for f in self.fields))


def escape(text: str) -> str:
    """``text`` as a literal part of a :class:`FieldError` template (braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


def did_you_mean(word: str, names: Iterable[str], n: int = 3) -> str:
    """``"did you mean ptb?"``: the (at most ``n``) known ``names`` close to a mistyped ``word`` (``difflib``'s
    measure, as settings files' keys are matched), or ``""`` where none is close.

    >>> did_you_mean("self_organised", ["full", "self_organized", "tree"])
    'did you mean self_organized?'
    """
    close = difflib.get_close_matches(str(word), [str(name) for name in names], n=n, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else ""
