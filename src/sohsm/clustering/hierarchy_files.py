"""Word hierarchies in and out of files: nested JSON lists, Brown-cluster paths, ``word<TAB>class`` files.

Every reader returns nested lists of *words* (strings), the form of
:mod:`sohsm.clustering.hierarchy` with words for ids; :func:`map_to_vocab` turns
them into word ids of a vocabulary. Formats:

``json``   nested lists of words, the tree itself::

               [["the", "a"], [["dog", "cat"], "bird"], "."]

``brown``  the paths file of Brown clustering (``bits<TAB>word<TAB>count``):
           words with the same bit string form a cluster; the tree over the
           clusters is the binary trie of their bit strings (chains of single
           children removed). ``cut=L`` gives a two-level clustering instead:
           one cluster per distinct ``L``-bit prefix.

``tsv``    ``word<TAB>class`` lines, as class-based RNN LM toolkits write them:
           a two-level clustering, classes in order of first appearance.

A bad file stops with a :class:`HierarchyFileError` naming the file, the line
and the problem (a word twice, an empty cluster, a malformed line).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sohsm.clustering.hierarchy import depth, group_balanced

if TYPE_CHECKING:
    import numpy as np

#: formats a hierarchy file can have
FORMATS = ("json", "brown", "tsv")


class HierarchyFileError(ValueError):
    """A hierarchy file that cannot be read: ``str(error)`` is ``FILE:LINE: problem`` on one line."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}:{line}: {problem}" if line is not None else f"{path}: {problem}")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise HierarchyFileError(path, None, "no such file") from None
    except IsADirectoryError:
        raise HierarchyFileError(path, None, "a folder, not a hierarchy file") from None
    except UnicodeDecodeError as error:
        raise HierarchyFileError(path, None, f"not utf-8 text ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise HierarchyFileError(path, None, f"cannot be read ({error.strerror or error})") from None


def detect_format(path: str | os.PathLike[str]) -> str:
    """``json``, ``brown`` or ``tsv``: by the extension ``.json``, else by the first line's fields.

    Raises:
        HierarchyFileError: unreadable, empty, or no format fits the first line.
    """
    path = Path(path)
    text = _read_text(path)
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" or stripped.startswith("["):
        return "json"
    if not stripped:
        raise HierarchyFileError(path, None, "the file is empty")
    number, first = next((i, line) for i, line in enumerate(text.split("\n"), 1) if line.strip())
    fields = first.rstrip("\r").split("\t")
    if len(fields) == 3 and re.fullmatch(r"[01]+", fields[0]):
        return "brown"
    if len(fields) == 2:
        return "tsv"
    raise HierarchyFileError(path, number, "not a hierarchy file: expected a JSON list, 'bits<TAB>word<TAB>count' "
                                           "(brown) or 'word<TAB>class' (tsv)")


def read_hierarchy(path: str | os.PathLike[str], format: str | None = None, cut: int | None = None) -> list:
    """Nested lists of words from a hierarchy file (``format=None``: :func:`detect_format`).

    Args:
        cut: brown only: a two-level clustering by the first ``cut`` bits of each path.

    Raises:
        HierarchyFileError: naming the file, the line and the problem.
        ValueError: an unknown format, or ``cut`` with a format other than brown.
    """
    format = detect_format(path) if format is None else format
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if cut is not None and format != "brown":
        raise ValueError(f"a prefix cut applies to brown paths files only, not to {format}")
    if cut is not None and cut < 1:
        raise ValueError(f"the prefix cut must be >= 1 bit, got {cut}")
    path = Path(path)
    text = _read_text(path)
    if format == "json":
        return _read_json(path, text)
    if format == "brown":
        return _read_brown(path, text, cut)
    return _read_tsv(path, text)


# -- json ------------------------------------------------------------------------------------------
_TOKEN = re.compile(r'\s+|\[|\]|,|"(?:[^"\\]|\\.)*"|[^\s\[\],"]+|"')


def _read_json(path: Path, text: str) -> list:
    """A small reader of nested arrays of strings that knows the line of every token."""
    tokens, line = [], 1
    for match in _TOKEN.finditer(text):
        token = match.group()
        if not token.isspace():
            tokens.append((token, line))
        line += token.count("\n")
    if not tokens:
        raise HierarchyFileError(path, None, "the file is empty")
    seen: dict[str, int] = {}
    position = 0

    def parse() -> list:
        nonlocal position
        token, at = tokens[position]
        if token != "[":
            raise HierarchyFileError(path, at, f"expected '[' , got {token[:30]!r}")
        position += 1
        out: list = []
        while True:
            if position >= len(tokens):
                raise HierarchyFileError(path, line, "the file ends inside a list (a ']' is missing)")
            token, here = tokens[position]
            if token == "]":
                if not out:
                    raise HierarchyFileError(path, here, "an empty cluster ([])")
                position += 1
                return out
            if out:
                if token != ",":
                    raise HierarchyFileError(path, here, f"expected ',' or ']', got {token[:30]!r}")
                position += 1
                if position >= len(tokens):
                    continue
                token, here = tokens[position]
            if token == "[":
                out.append(parse())
            elif token.startswith('"') and len(token) > 1 and token.endswith('"'):
                try:
                    word = json.loads(token)
                except ValueError:
                    raise HierarchyFileError(path, here, f"a malformed string {token[:30]}") from None
                if word in seen:
                    raise HierarchyFileError(path, here,
                                             f"the word {word!r} appears twice (first on line {seen[word]})")
                if not word or word != word.strip() or any(c.isspace() for c in word):
                    raise HierarchyFileError(path, here, f"{word!r} is not a word (empty or with white space)")
                seen[word] = here
                out.append(word)
                position += 1
            else:
                raise HierarchyFileError(path, here, f"expected a word in double quotes or a list, got {token[:30]!r}")

    tree = parse()
    if position < len(tokens):
        raise HierarchyFileError(path, tokens[position][1], f"text after the hierarchy's closing ']': "
                                                            f"{tokens[position][0][:30]!r}")
    return tree


# -- brown -----------------------------------------------------------------------------------------
def _lines(path: Path, text: str, fields: int, what: str):
    """``(line number, fields)`` of every non-blank line, refusing lines with another number of fields."""
    for number, row in enumerate(text.split("\n"), 1):
        row = row.rstrip("\r")
        if not row.strip():
            continue
        parts = row.split("\t")
        if len(parts) != fields or not all(p.strip() for p in parts):
            raise HierarchyFileError(path, number, f"a malformed line: expected {what}, got {row[:60]!r}")
        yield number, [p.strip() for p in parts]


def _read_brown(path: Path, text: str, cut: int | None) -> list:
    words: dict[str, int] = {}
    by_bits: dict[str, list[str]] = {}
    for number, (bits, word, count) in _lines(path, text, 3, "bits<TAB>word<TAB>count"):
        if not re.fullmatch(r"[01]+", bits):
            raise HierarchyFileError(path, number, f"a malformed path {bits[:40]!r}: bits must be 0s and 1s")
        if not re.fullmatch(r"\d+", count):
            raise HierarchyFileError(path, number, f"a malformed count {count[:20]!r}: expected a whole number")
        if word in words:
            raise HierarchyFileError(path, number, f"the word {word!r} appears twice (first on line {words[word]})")
        words[word] = number
        by_bits.setdefault(bits if cut is None else bits[:cut], []).append(word)
    if not words:
        raise HierarchyFileError(path, None, "the file holds no words")
    if cut is not None:
        return [by_bits[key] for key in sorted(by_bits)]
    return _trie(by_bits)


def _trie(by_bits: Mapping[str, list[str]]) -> list:
    """The binary trie of the bit strings: a string's words, then its '0' and '1' subtrees; single children merged."""
    def node(prefix: str) -> list:
        items: list = list(by_bits.get(prefix, []))
        for bit in "01":
            below = prefix + bit
            if any(key.startswith(below) for key in keys):
                sub = node(below)
                items.append(sub[0] if len(sub) == 1 else sub)
        while len(items) == 1 and isinstance(items[0], list):
            items = items[0]
        return items

    keys = sorted(by_bits)
    return node("")


# -- tsv -------------------------------------------------------------------------------------------
def _read_tsv(path: Path, text: str) -> list:
    words: dict[str, int] = {}
    classes: dict[str, list[str]] = {}
    for number, (word, label) in _lines(path, text, 2, "word<TAB>class"):
        if word in words:
            raise HierarchyFileError(path, number, f"the word {word!r} appears twice (first on line {words[word]})")
        words[word] = number
        classes.setdefault(label, []).append(word)
    if not words:
        raise HierarchyFileError(path, None, "the file holds no words")
    return list(classes.values())


# -- writing ---------------------------------------------------------------------------------------
def format_hierarchy(tree: list, format: str, counts: Mapping[str, int] | None = None) -> str:
    """The text of a hierarchy file (nested lists of words) in ``format``.

    ``brown`` writes each node's child index in binary (``ceil(log2(arity))`` bits),
    a node whose children are all words as one cluster sharing its bit string,
    so a two-level clustering reads back the same with ``cut`` = its bit width.

    Raises:
        ValueError: ``tsv`` asked of a hierarchy deeper than two levels, or an unknown format.
    """
    if format == "json":
        return "[\n" + ",\n".join("  " + json.dumps(item, ensure_ascii=False) for item in tree) + "\n]\n"
    if format == "tsv":
        if depth(tree) > 2:
            raise ValueError(f"word<TAB>class files hold two-level clusterings; this hierarchy is {depth(tree)} "
                             "levels deep (write json or brown)")
        return "".join(f"{w}\t{c}\n" for c, item in enumerate(tree)
                       for w in (item if isinstance(item, list) else [item]))
    if format == "brown":
        counts = counts or {}
        rows: list[str] = []

        def walk(node: list, bits: str) -> None:
            if not any(isinstance(item, list) for item in node):  # a cluster: its words share the bit string
                rows.extend(f"{bits or '0'}\t{w}\t{counts.get(w, 0)}\n" for w in node)
                return
            width = max(1, math.ceil(math.log2(len(node))))
            for i, item in enumerate(node):
                code = bits + format_bits(i, width)
                if isinstance(item, list):
                    walk(item, code)
                else:
                    rows.append(f"{code}\t{item}\t{counts.get(item, 0)}\n")

        walk(tree, "")
        return "".join(rows)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")


def format_bits(value: int, width: int) -> str:
    """``value`` in binary, ``width`` digits."""
    return format(value, f"0{width}b")


def brown_cut_width(tree: list) -> int:
    """The bit width of the root's child index in :func:`format_hierarchy`'s brown output (the two-level cut)."""
    return max(1, math.ceil(math.log2(len(tree))))


# -- words to ids ----------------------------------------------------------------------------------
class MappedHierarchy(NamedTuple):
    """A word hierarchy mapped onto a vocabulary.

    Attributes:
        tree: nested lists of word ids covering the vocabulary once.
        missing: vocabulary words the file does not hold (placed under a fallback node).
        missing_mass: their share of the training tokens, in [0, 1].
        unknown: words of the file not in the vocabulary (left out).
    """

    tree: list
    missing: int
    missing_mass: float
    unknown: int


def map_to_vocab(tree: list, itos: Sequence[str], counts: Sequence[float] | np.ndarray | None = None,
                 fallback_branching: int | None = None) -> MappedHierarchy:
    """Word ids for the words of ``tree``; vocabulary words it lacks go under one fallback node.

    Words of the file outside the vocabulary are left out, and nodes left empty
    by that are dropped. The fallback node is the root's last child: one flat
    cluster, or with ``fallback_branching`` a balanced subtree of that branching.

    Raises:
        ValueError: no word of the file is in the vocabulary.
    """
    index = {w: i for i, w in enumerate(itos)}
    used = [False] * len(itos)
    unknown = 0

    def convert(node: list) -> list:
        nonlocal unknown
        out: list = []  # word ids and subtrees
        for item in node:
            if isinstance(item, list):
                sub = convert(item)
                if sub:
                    out.append(sub)
            elif item in index:
                used[index[item]] = True
                out.append(index[item])
            else:
                unknown += 1
        return out

    mapped = convert(tree)
    if not mapped:
        raise ValueError(f"none of the hierarchy's words is in the vocabulary ({len(itos):,} words)")
    missing = [i for i, u in enumerate(used) if not u]
    total = float(sum(counts)) if counts is not None else 0.0
    mass = float(sum(counts[i] for i in missing)) / total if counts is not None and total > 0 else 0.0
    if len(missing) == 1:
        mapped.append(missing[0])
    elif missing:
        mapped.append(missing if fallback_branching is None else group_balanced(missing, fallback_branching))
    return MappedHierarchy(mapped, len(missing), mass, unknown)


def ids_to_words(tree: list, itos: Sequence[str]) -> list:
    """The same nested lists with words for ids."""
    return [ids_to_words(item, itos) if isinstance(item, list) else itos[item] for item in tree]
