"""Errors in the user's words: config fields named by the command-line flags that set them.

The library names config fields (``model.hidden_size must be >= 1``), since it
knows nothing of a command line; a user who typed ``--hidden-size 0`` should read
``--hidden-size must be >= 1``. :func:`name_flags` rewrites a message for the
flags the user typed, and turns suggestions (``use text_mode='running'``) into
flags for every field, since a suggestion is always about something to type.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def flag(dest: str) -> str:
    """``--hidden-size`` for the option dest ``hidden_size``."""
    return "--" + dest.replace("_", "-")


def name_flags(message: str, fields: Mapping[str, str], typed: Iterable[str]) -> str:
    """``message`` with config fields replaced by the flags that set them.

    Args:
        message: a library error message.
        fields: option dest -> dotted config field it sets (``{"hidden_size": "model.hidden_size"}``).
        typed: the dests the user gave on the command line.

    Returns:
        The message where each typed field (dotted, or its last part when that has an
        underscore; not where it is quoted, as a Python name) reads as its flag, ``field=value`` as ``--flag value``, and every
        suggestion ``field='value'`` as ``--flag value``.

    Example::

        >>> name_flags("model.hidden_size is 32 in the run, 64 requested",
        ...            {"hidden_size": "model.hidden_size"}, ["hidden_size"])
        '--hidden-size is 32 in the run, 64 requested'
    """
    typed = set(typed)
    for dest, field in sorted(fields.items(), key=lambda item: -len(item[1])):
        names = [re.escape(field)]
        leaf = field.rpartition(".")[2]
        if leaf != field and "_" in leaf:
            names.append(re.escape(leaf))
        pattern = rf"(?<![\w.'\-])(?:{'|'.join(names)})"
        message = re.sub(pattern + r"='([^']*)'", lambda m, d=dest: f"{flag(d)} {m.group(1)}", message)
        if dest not in typed:
            continue
        message = re.sub(pattern + r"=(?=\S)", f"{flag(dest)} ", message)
        message = re.sub(pattern + r"(?![\w'])", flag(dest), message)  # not inside a quoted name
    return message
