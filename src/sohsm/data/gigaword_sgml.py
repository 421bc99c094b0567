"""Reading LDC English Gigaword's SGML, one document at a time.

English Gigaword (LDC2003T05, LDC2011T07, ...) ships one gzip file per agency and
month (``cna_eng_199710.gz``), each a sequence of documents::

    <DOC id="CNA_ENG_19971001.0001" type="story" >
    <HEADLINE>
    QIAN QICHEN DUBIOUS OF NEW US-JAPAN DEFENSE GUIDELINES
    </HEADLINE>
    <DATELINE>
    Tokyo, Oct. 1 (CNA)
    </DATELINE>
    <TEXT>
    <P>
    Mainland Chinese Foreign Minister Qian Qichen ...
    </P>
    ...
    </TEXT>
    </DOC>

:func:`read_documents` streams them (a file is never held in memory whole);
:func:`gigaword_files` finds the files under the folders given.
"""
from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sohsm.data.errors import DataError

_TAG = re.compile(r"(<[^>]*>)")
_ATTRIBUTE = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


@dataclass
class Document:
    """One ``<DOC>`` of a Gigaword file, its text as written (entities such as ``&amp;`` kept).

    Attributes:
        id: the ``id`` attribute (``CNA_ENG_19971001.0001``).
        type: the ``type`` attribute (``story``, ``multi``, ``advis``, ``other``).
        headline: the ``<HEADLINE>`` text, lines joined by spaces; ``""`` where there is none.
        dateline: the ``<DATELINE>`` text; ``""`` where there is none.
        paragraphs: the ``<P>`` texts of ``<TEXT>`` in order (a ``<TEXT>`` without ``<P>``: its
            blank-line separated blocks).
    """

    id: str
    type: str
    headline: str = ""
    dateline: str = ""
    paragraphs: list[str] = field(default_factory=list)


def gigaword_files(paths: list[str | os.PathLike[str]]) -> list[Path]:
    """The ``.gz`` files among ``paths`` and under the folders among them (recursively), sorted.

    Raises:
        DataError: a path that does not exist, a file that is not ``.gz``, or no ``.gz`` file at all.
    """
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.gz") if p.is_file())
            if not inside:
                raise DataError(f"{path}: no .gz files in this folder (English Gigaword's files are "
                                "gzipped SGML, e.g. cna_eng_199710.gz)")
            found += inside
        elif path.is_file():
            if not path.name.endswith(".gz"):
                raise DataError(f"{path}: not a .gz file (English Gigaword's files are gzipped SGML, "
                                "e.g. cna_eng_199710.gz)")
            found.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    if not found:
        raise DataError("no Gigaword files given")
    return sorted(dict.fromkeys(found))


def _text(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def read_documents(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None) -> Iterator[Document]:
    """The documents of one gzipped Gigaword file, in order, read as a stream.

    Args:
        path: a ``.gz`` file of English Gigaword.
        on_bytes: called with the number of compressed bytes read since its last call (a progress bar).

    Raises:
        DataError: the file is not gzip, is truncated or corrupt, or does not start with a ``<DOC>``
            (not Gigaword SGML); naming the file.
    """
    path = Path(path)
    try:
        raw = open(path, "rb")
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None
    with raw:
        stream = gzip.open(raw, "rt", encoding="utf-8", errors="replace")
        position = 0

        def lines() -> Iterator[str]:
            nonlocal position
            try:
                for line in stream:
                    yield line
                    if on_bytes is not None and raw.tell() != position:
                        on_bytes(raw.tell() - position)
                        position = raw.tell()
            except (OSError, EOFError, zlib.error) as error:
                reason = "not a gzip file" if isinstance(error, gzip.BadGzipFile) else f"corrupt or cut short ({error})"
                raise DataError(f"{path}: {reason}") from None

        yield from _parse(path, lines())


def _parse(path: Path, lines: Iterator[str]) -> Iterator[Document]:
    """Documents from the lines of one file (tags may share a line with text).

    Raises:
        DataError: text outside a ``<DOC>``, no ``<DOC>`` at all, or a last ``<DOC>`` without its end.
    """
    document: Document | None = None
    where: str | None = None  # the element whose text is being read
    buffer: list[str] = []
    count = 0
    number = 0
    for number, line in enumerate(lines, 1):
        for piece in _TAG.split(line):
            if not piece:
                continue
            if not piece.startswith("<"):
                if where is not None:
                    buffer.append(piece)
                elif document is None and piece.strip():
                    raise DataError(f"{path}: not English Gigaword SGML (line {number:,} is text outside a <DOC>: "
                                    f"{piece.strip()[:40]!r})")
                continue
            tag = piece.strip("<>").strip()
            name = tag.split()[0].upper() if tag else ""
            if name == "DOC":
                attributes = dict(_ATTRIBUTE.findall(tag))
                document, where, buffer = Document(attributes.get("id", ""), attributes.get("type", "")), None, []
            elif document is None:
                continue
            elif name in ("HEADLINE", "DATELINE", "P", "TEXT"):
                where, buffer = name, []
            elif name in ("/HEADLINE", "/DATELINE"):
                setattr(document, name[1:].lower(), _text(buffer))
                where, buffer = None, []
            elif name == "/P":
                text = _text(buffer)
                if text:
                    document.paragraphs.append(text)
                where, buffer = "TEXT", []
            elif name == "/TEXT":
                if where == "TEXT" and not document.paragraphs:  # a <TEXT> without <P>: blocks between blank lines
                    blocks = re.split(r"\n\s*\n", "".join(buffer))
                    document.paragraphs += [b for b in (_text([x]) for x in blocks) if b]
                where, buffer = None, []
            elif name == "/DOC":
                count += 1
                yield document
                document, where, buffer = None, None, []
    if document is not None:
        raise DataError(f"{path}: cut short inside document {document.id or '(no id)'} (no </DOC>)")
    if count == 0:
        raise DataError(f"{path}: not English Gigaword SGML (no <DOC> in {number:,} lines)")
