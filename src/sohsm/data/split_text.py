"""A load's text: which characters of which file make each split, and the words of a split as rows.

A known corpus declares its splits as character offsets in its files (:mod:`sohsm.data.corpora`); your own
text is a file or a folder (:func:`user_plan`: a folder holds one file whose name contains ``train``, may hold
one with ``valid`` or ``dev`` and one with ``test``; without a valid file the last ``valid_fraction`` of the
train file's lines, or of its characters cut at the next whitespace, is ``valid``). Either way a load is a
:class:`SplitPlan`, and :func:`split_texts` reads its files and finds each split's range, snapped to a line
start (lines) or a whitespace (running text). :func:`row_chunks` then gives a range's words as rows, a few
million characters at a time: what :mod:`sohsm.data.loading` counts, encodes as ids and trains a BPE on.
Nothing here imports torch or knows a vocabulary beyond its ``<eos>``.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sohsm.data.corpora import CorpusSpec
from sohsm.data.corpus_files import verify_corpus
from sohsm.data.errors import DataError, DataFieldError
from sohsm.data.files import cached_sha256, resolve_data_dir
from sohsm.data.vocab import EOS
from sohsm.fields import escape, suggest

_CHUNK_CHARS = 1 << 22
_WS = re.compile(r"\s")


@dataclass(frozen=True)
class SplitPlan:
    """Resolved inputs of one load: which characters of which file make each split."""

    name: str
    lines: bool
    files: dict[str, str]  # key -> sha256
    paths: dict[str, Path]  # key -> path
    truncated: frozenset[str]
    # split -> (file key, start, stop, kind). kind "chars": character offsets as in
    # corpora.Split; "head"/"tail": the file without / only its last `fraction` of
    # lines or characters, the fraction stored in stop / start.
    splits: dict[str, tuple[str, int | float, int | float | None, str]]


def registry_plan(spec: CorpusSpec, data_dir, cache: Path) -> SplitPlan:
    hashes = verify_corpus(spec.name, data_dir, cache)
    root = resolve_data_dir(data_dir)
    splits = {}
    for role in ("train", "valid", "test"):
        split = getattr(spec, role)
        if split is not None:
            splits[role] = (split.file, split.start, split.stop, "chars")
    return SplitPlan(spec.name, spec.lines, hashes, {f.path: root / f.path for f in spec.files},
                 frozenset(f.path for f in spec.files if f.truncated), splits)


def _find_role_file(folder: Path, words: tuple[str, ...]) -> Path | None:
    found = [p for p in sorted(folder.iterdir())
             if p.is_file() and not p.name.startswith(".") and any(w in p.name.lower() for w in words)]
    if len(found) > 1:
        raise DataError(f"{folder}: more than one file for {words[0]}: {', '.join(p.name for p in found)}")
    return found[0] if found else None


def user_plan(path: Path, text_mode: str | None, valid_fraction: float, cache: Path) -> SplitPlan:
    mode = text_mode or "lines"
    if mode not in ("lines", "running"):
        raise ValueError(f"text_mode must be 'lines' or 'running', got {text_mode!r}")
    if not 0.0 < float(valid_fraction) < 1.0:
        raise ValueError(f"valid_fraction must be between 0 and 1 (exclusive), got {valid_fraction!r}")
    if path.is_dir():
        found = {role: _find_role_file(path, words)
                 for role, words in (("train", ("train",)), ("valid", ("valid", "dev")), ("test", ("test",)))}
        if found["train"] is None:
            raise DataError(f"{path}: no file whose name contains 'train'")
        files = {role: p for role, p in found.items() if p is not None}
        name = path.resolve().name
    elif not path.is_file():
        raise DataError(f"{path}: not a regular file or a folder (a device or a pipe has no end to read to)")
    else:
        files = {"train": path}
        name = path.stem
    paths = {p.name: p for p in files.values()}
    hashes = {p.name: cached_sha256(p, cache) for p in files.values()}
    splits: dict[str, tuple[str, int | float, int | float | None, str]] = {}
    for role, p in files.items():
        splits[role] = (p.name, 0, None, "chars")
    if "valid" not in files:
        train = files["train"].name
        splits["train"] = (train, 0, float(valid_fraction), "head")
        splits["valid"] = (train, float(valid_fraction), None, "tail")
    return SplitPlan(name, mode == "lines", hashes, paths, frozenset(), splits)


def _fraction_cut(text: str, fraction: float, lines: bool, path: Path) -> int:
    """Offset where the last ``fraction`` of lines (or characters) of ``text`` starts."""
    if lines:
        n_lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        n_valid = max(1, round(n_lines * fraction))
        if n_lines - n_valid < 1:
            if not text.split():
                raise DataError(f"{path}: the file has no words (it is empty or only whitespace)")
            if not _splits_as_running_text(text, fraction):
                raise DataError(f"{path}: {n_lines} line(s) is too few to split into train and valid; "
                                "give at least two lines of text")
            raise DataFieldError(escape(f"{path}: {n_lines} line(s) is too few to split into train and valid; ")
                                 + "give more text or use {}", suggest("text_mode", "running"))
        pos = len(text) - 1 if text.endswith("\n") else len(text)
        for _ in range(n_valid):
            pos = text.rfind("\n", 0, pos)
        return pos + 1
    return _snap(text, len(text) - round(len(text) * fraction), False)


def _splits_as_running_text(text: str, fraction: float) -> bool:
    """Whether ``text`` read as running text gives words on both sides of its train/valid cut (so that
    suggesting ``text_mode='running'`` helps)."""
    cut = _snap(text, len(text) - round(len(text) * fraction), False)
    return bool(text[:cut].split()) and bool(text[cut:].split())


def split_texts(plan: SplitPlan, roles: tuple[str, ...] = ("train", "valid", "test")
                 ) -> tuple[dict[str, str], dict[str, tuple[str, int, int]]]:
    """The texts of the plan's files, and ``{split: (file, start, stop)}`` of the splits named in ``roles``."""
    splits = {role: split for role, split in plan.splits.items() if role in roles}
    texts: dict[str, str] = {}
    for file_key, path in plan.paths.items():
        if any(s[0] == file_key for s in splits.values()):
            text = _read_text(path)
            texts[file_key] = _cut_partial_word(text) if file_key in plan.truncated else text
    ranges: dict[str, tuple[str, int, int]] = {}
    for role, (file_key, start, stop, kind) in splits.items():
        text = texts[file_key]
        if kind == "head":
            assert stop is not None  # the fraction
            a, b = 0, _fraction_cut(text, float(stop), plan.lines, plan.paths[file_key])
        elif kind == "tail":
            a, b = _fraction_cut(text, float(start), plan.lines, plan.paths[file_key]), len(text)
        else:
            a = _snap(text, int(start), plan.lines)
            b = len(text) if stop is None else _snap(text, int(stop), plan.lines)
        ranges[role] = (file_key, a, b)
    return texts, ranges


def _read_text(path: Path) -> str:
    """The file's text; a UTF-8 byte-order mark (as some editors write) is dropped, not read as a word."""
    try:
        with open(path, encoding="utf-8-sig", newline=None) as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not utf-8 text ({error.reason} at byte {error.start})") from None


def _cut_partial_word(text: str) -> str:
    """Drop everything after the last whitespace (a file that ends mid-word)."""
    last = max(text.rfind(c) for c in " \t\n\r")
    return text[:last] if last >= 0 else ""


def _snap(text: str, pos: int, lines: bool, stop: int | None = None) -> int:
    """Move offset ``pos`` forward to a line start (``lines``) or a whitespace, at most to ``stop``."""
    n = len(text) if stop is None else stop
    if pos < 0:
        pos = max(0, n + pos)
    if pos <= 0 or pos >= n:
        return min(max(pos, 0), n)
    if lines:
        if text[pos - 1] == "\n":
            return pos
        nl = text.find("\n", pos, n)
        return n if nl < 0 else nl + 1
    if text[pos].isspace() or text[pos - 1].isspace():
        return pos
    match = _WS.search(text, pos, n)
    return n if match is None else match.start()


def row_chunks(text: str, start: int, stop: int, lines: bool) -> Iterator[list[list[str]]]:
    """The words of ``text[start:stop]`` in chunks of ~4M characters, as rows: the words of each line (running
    text: one row a chunk, which ends between two words)."""
    pos = start
    while pos < stop:
        end = min(stop, pos + _CHUNK_CHARS)
        if end < stop:
            end = _snap(text, end, lines, stop)
        piece = text[pos:end]
        pos = end
        if not lines:
            yield [piece.split()]
            continue
        rows = piece.split("\n")
        if piece.endswith("\n"):
            rows.pop()
        yield [row.split() for row in rows]


def word_tokens(rows: list[list[str]], lines: bool) -> list[str]:
    """The word tokens of rows (``<eos>`` after each line)."""
    tokens: list[str] = []
    for row in rows:
        tokens.extend(row)
        if lines:
            tokens.append(EOS)
    return tokens


def row_bytes(rows: list[list[str]], lines: bool) -> int:
    """UTF-8 bytes of rows' words joined by single spaces, each line ended by a newline (running text: a space
    after every word), see :mod:`sohsm.data.loading`."""
    return sum(len(" ".join(row).encode("utf-8")) + 1 for row in rows if lines or row)
