"""Loading corpora as token ids, and the on-disk cache of tokenised corpora.

:func:`load_corpus` reads a known corpus (see :mod:`sohsm.data.corpora`) or
your own text, builds the vocabulary on the training split and encodes every
split. The result is cached as ``.npy`` arrays plus ``vocab.json`` under
``<cache dir>/corpora/<name>-<key>/`` (cache dir: ``$SOHSM_CACHE``, default
``~/.cache/sohsm/cache``), the key covering the files' sha256, the split rule
and the vocabulary options: a second load reads the arrays in well under a
second, and a changed file or option never reuses a stale entry.

Your own text: a file is read as utf-8 lines with ``<eos>`` after each
(``text_mode="lines"``, default) or as running text (``"running"``). Without a
separate valid file, the last ``valid_fraction`` (10%) of its lines, or of its
characters cut at the next whitespace, is ``valid``; there is no ``test``. A
folder must hold one file whose name contains ``train`` and may hold one with
``valid`` (or ``dev``) and one with ``test``.

A known corpus missing from the data directory is downloaded on first use
(:func:`~sohsm.data.corpora.fetch`: every file checked against its sha256), with
one line on stderr saying where it went; where the network is not there, the
error says which files to put where. ``$SOHSM_OFFLINE=1`` (or
``fetch_missing=False``) turns this off.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sohsm.data.corpora import CORPORA, CorpusSpec
from sohsm.data.corpus_files import corpus_status, fetch, verify_corpus
from sohsm.data.errors import DataError, DataFieldError
from sohsm.fields import did_you_mean, escape, suggest
from sohsm.data.files import cached_sha256, data_dir_origin, remove_tree, resolve_cache_dir, resolve_data_dir
from sohsm.data.vocab import EOS, UNK, VocabConfig, Vocabulary

#: bumped whenever tokenisation or the cache layout changes, so old entries are ignored
#: (2: a UTF-8 byte-order mark is no longer part of the first word)
CACHE_VERSION = 2
#: environment variable: set to 1 to never download a missing corpus on first use
OFFLINE_ENV = "SOHSM_OFFLINE"
_CHUNK_CHARS = 1 << 22
_WS = re.compile(r"\s")


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


def _token_chunks(text: str, start: int, stop: int, lines: bool) -> Iterator[list[str]]:
    """Tokens of ``text[start:stop]`` in chunks of ~4M characters (``<eos>`` after each line)."""
    pos = start
    while pos < stop:
        end = min(stop, pos + _CHUNK_CHARS)
        if end < stop:
            end = _snap(text, end, lines, stop)
        piece = text[pos:end]
        pos = end
        if not lines:
            yield piece.split()
            continue
        rows = piece.split("\n")
        if piece.endswith("\n"):
            rows.pop()
        tokens: list[str] = []
        for row in rows:
            tokens.extend(row.split())
            tokens.append(EOS)
        yield tokens


@dataclass
class Corpus:
    """A tokenised corpus.

    Attributes:
        name: corpus name (a registry name, or the file/folder name for your text).
        vocab: the vocabulary, built on ``train``.
        train, valid: 1-D LongTensors of token ids.
        test: 1-D LongTensor, or ``None`` when the corpus has no test split.
        files: ``{file: sha256}`` of the files it was read from.
        config: the vocabulary options used.
        lines: whether ``<eos>`` was appended per line.
        cache_path: the cache folder it was read from or saved to, if any.
        from_cache: whether it was read from the cache.
    """

    name: str
    vocab: Vocabulary
    train: Tensor
    valid: Tensor
    test: Tensor | None
    files: dict[str, str]
    config: VocabConfig
    lines: bool
    cache_path: Path | None = None
    from_cache: bool = False

    @property
    def signature(self) -> str:
        """Name, file checksums and vocabulary options in one line, for reports.

        Example: ``ptb ptb.train.txt:fcea919f6cf83f35 ... min_count=1 max_size=None``
        (the first 16 hex digits of each file's sha256).
        """
        files = " ".join(f"{Path(path).name}:{digest[:16]}" for path, digest in self.files.items())
        return f"{self.name} {files} min_count={self.config.min_count} max_size={self.config.max_size}"

    def splits(self) -> dict[str, Tensor]:
        """``{"train": ..., "valid": ..., "test": ...}`` without the splits that are ``None``."""
        return {s: getattr(self, s) for s in ("train", "valid", "test") if getattr(self, s) is not None}


@dataclass(frozen=True)
class _Plan:
    """Resolved inputs of one load: which characters of which file make each split."""

    name: str
    lines: bool
    files: dict[str, str]  # key -> sha256
    paths: dict[str, Path]  # key -> path
    truncated: frozenset[str]
    # split -> (file key, start, stop, kind). kind "chars": character offsets as in
    # corpora.Split; "head"/"tail": the file without / only its last `fraction` of
    # lines or characters, the fraction stored in stop / start.
    splits: dict[str, tuple[str, int | float, int | None, str]]


def load_corpus(name_or_path: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None,
                min_count: int | None = None, max_size: int | None = None,
                cache_dir: str | os.PathLike[str] | None = None, *, text_mode: str | None = None,
                valid_fraction: float = 0.1, use_cache: bool = True, fetch_missing: bool | None = None) -> Corpus:
    """Load a known corpus or your own text as token ids, from the cache when possible.

    Args:
        name_or_path: a registered name (``"ptb"``, ``"wikitext-2"``, ``"text8"``,
            ``"text8-small"``, ...) or the path of a text file or folder (see the
            module docstring). A registered name wins over a folder of the same
            name; write ``./ptb`` for the folder.
        data_dir: where known corpora are; see :func:`~sohsm.data.files.resolve_data_dir`.
        min_count, max_size: vocabulary options (:class:`~sohsm.data.vocab.VocabConfig`).
            Both ``None``: the corpus default. If either is given, the other falls
            back to the generic default (1, resp. no limit), not the corpus's.
        cache_dir: where tokenised corpora are cached; see
            :func:`~sohsm.data.files.resolve_cache_dir`.
        text_mode: your own text only: ``"lines"`` (``<eos>`` per line, default)
            or ``"running"``.
        valid_fraction: your own text only: the share of lines (or characters)
            that goes to ``valid`` when there is no separate valid file.
        use_cache: read and write the tokenised cache.
        fetch_missing: download a known corpus missing from the data directory. Default: yes,
            unless ``$SOHSM_OFFLINE`` is set to 1.

    Returns:
        A :class:`Corpus`.

    Raises:
        DataError: unknown name, missing or corrupt files, text too short to split.
        ValueError: bad options.
    """
    if min_count is None and max_size is None:
        config = None
    else:
        config = VocabConfig(1 if min_count is None else min_count, max_size)
    cache = resolve_cache_dir(cache_dir)
    key = str(name_or_path)
    if key in CORPORA:
        if text_mode is not None:
            raise ValueError(f"text_mode applies to your own text files, not to the known corpus {key!r}")
        spec = CORPORA[key]
        if fetch_missing if fetch_missing is not None else os.environ.get(OFFLINE_ENV, "") in ("", "0"):
            fetch_on_first_use(spec.name, data_dir, cache)
        plan = _registry_plan(spec, data_dir, cache)
        config = config or VocabConfig(spec.min_count, spec.max_size)
    else:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            if _looks_like_path(key):
                raise DataError(f"{key}: no such file or folder (a corpus is a known name, "
                                f"{', '.join(CORPORA)}, or your own text file or folder)")
            hint = did_you_mean(key, CORPORA)
            raise DataError(f"unknown corpus {key!r}{f' ({hint})' if hint else ''}: neither a known corpus "
                            f"({', '.join(CORPORA)}) nor an existing file or folder")
        plan = _user_plan(path, text_mode, valid_fraction, cache)
        config = config or VocabConfig()
    return _load(plan, config, cache, use_cache)


def _looks_like_path(key: str) -> bool:
    """Whether a corpus argument was meant as a file or folder (``runs/my.txt``, ``~/text``, ``notes.txt``)
    rather than a known corpus's name, so that a missing one is called missing, not unknown."""
    return "/" in key or os.sep in key or key.startswith(("~", ".")) or bool(Path(key).suffix)


def fetch_on_first_use(name: str, data_dir: str | os.PathLike[str] | None = None,
                       cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Download known corpus ``name`` if every file it lacks can be downloaded; one line on stderr.

    Returns:
        whether anything was downloaded (nothing is when no file is missing, or when a missing
        file has no known download location: :func:`~sohsm.data.corpora.verify_corpus` then says
        what to put where).

    Raises:
        DataError: the download failed (no network, a wrong checksum): one line naming the files
            to put in the data directory by hand.
    """
    status = corpus_status(name, data_dir, cache_dir)
    absent = [f for f in status.files if f.state == "missing"]
    if not absent or not all(f.spec.sources for f in absent):
        return False
    root = status.data_dir
    try:
        fetch(name, data_dir, progress=sys.stderr.isatty(), cache_dir=cache_dir)
    except DataError as error:
        raise DataError(f"corpus {name!r} is not in your data directory {root} ({data_dir_origin(data_dir)}; "
                        f"set it with --data-dir or $SOHSM_DATA) and downloading it failed: {error}") from None
    folders = sorted({str((root / f.spec.path).parent) for f in absent})
    print(f"fetched {name} ({len(absent)} file{'s' if len(absent) > 1 else ''}, verified) into "
          f"{', '.join(folders)}", file=sys.stderr)
    return True


def _registry_plan(spec: CorpusSpec, data_dir, cache: Path) -> _Plan:
    hashes = verify_corpus(spec.name, data_dir, cache)
    root = resolve_data_dir(data_dir)
    splits = {}
    for role in ("train", "valid", "test"):
        split = getattr(spec, role)
        if split is not None:
            splits[role] = (split.file, split.start, split.stop, "chars")
    return _Plan(spec.name, spec.lines, hashes, {f.path: root / f.path for f in spec.files},
                 frozenset(f.path for f in spec.files if f.truncated), splits)


def _find_role_file(folder: Path, words: tuple[str, ...]) -> Path | None:
    found = [p for p in sorted(folder.iterdir())
             if p.is_file() and not p.name.startswith(".") and any(w in p.name.lower() for w in words)]
    if len(found) > 1:
        raise DataError(f"{folder}: more than one file for {words[0]}: {', '.join(p.name for p in found)}")
    return found[0] if found else None


def _user_plan(path: Path, text_mode: str | None, valid_fraction: float, cache: Path) -> _Plan:
    mode = text_mode or "lines"
    if mode not in ("lines", "running"):
        raise ValueError(f"text_mode must be 'lines' or 'running', got {text_mode!r}")
    if not 0.0 < float(valid_fraction) < 1.0:
        raise ValueError(f"valid_fraction must be between 0 and 1 (exclusive), got {valid_fraction!r}")
    if path.is_dir():
        files = {role: _find_role_file(path, words)
                 for role, words in (("train", ("train",)), ("valid", ("valid", "dev")), ("test", ("test",)))}
        if files["train"] is None:
            raise DataError(f"{path}: no file whose name contains 'train'")
        files = {role: p for role, p in files.items() if p is not None}
        name = path.resolve().name
    elif not path.is_file():
        raise DataError(f"{path}: not a regular file or a folder (a device or a pipe has no end to read to)")
    else:
        files = {"train": path}
        name = path.stem
    paths = {p.name: p for p in files.values()}
    hashes = {p.name: cached_sha256(p, cache) for p in files.values()}
    splits: dict[str, tuple[str, int | float, int | None, str]] = {}
    for role, p in files.items():
        splits[role] = (p.name, 0, None, "chars")
    if "valid" not in files:
        train = files["train"].name
        splits["train"] = (train, 0, float(valid_fraction), "head")
        splits["valid"] = (train, float(valid_fraction), None, "tail")
    return _Plan(name, mode == "lines", hashes, paths, frozenset(), splits)


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


def _cache_key(plan: _Plan, config: VocabConfig) -> str:
    payload = {"version": CACHE_VERSION, "name": plan.name, "lines": plan.lines, "files": plan.files,
               "truncated": sorted(plan.truncated), "splits": plan.splits,
               "min_count": config.min_count, "max_size": config.max_size}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def _load(plan: _Plan, config: VocabConfig, cache: Path, use_cache: bool) -> Corpus:
    key = _cache_key(plan, config)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", plan.name) or "corpus"
    folder = cache / "corpora" / f"{safe}-{key[:16]}"
    if use_cache:
        cached = _read_cache(folder, key, plan, config)
        if cached is not None:
            return cached
    corpus = _tokenise(plan, config)
    if use_cache:
        corpus.cache_path = _write_cache(folder, key, corpus)
    return corpus


def _tokenise(plan: _Plan, config: VocabConfig) -> Corpus:
    texts: dict[str, str] = {}
    for file_key, path in plan.paths.items():
        if any(s[0] == file_key for s in plan.splits.values()):
            text = _read_text(path)
            texts[file_key] = _cut_partial_word(text) if file_key in plan.truncated else text
    ranges: dict[str, tuple[str, int, int]] = {}
    for role, (file_key, start, stop, kind) in plan.splits.items():
        text = texts[file_key]
        if kind == "head":
            a, b = 0, _fraction_cut(text, float(stop), plan.lines, plan.paths[file_key])
        elif kind == "tail":
            a, b = _fraction_cut(text, float(start), plan.lines, plan.paths[file_key]), len(text)
        else:
            a = _snap(text, int(start), plan.lines)
            b = len(text) if stop is None else _snap(text, int(stop), plan.lines)
        ranges[role] = (file_key, a, b)

    counter: Counter[str] = Counter()
    file_key, a, b = ranges["train"]
    for tokens in _token_chunks(texts[file_key], a, b, plan.lines):
        counter.update(tokens)
    if not any(word != EOS for word in counter):
        raise DataError(f"{plan.paths[file_key]}: the train split of {plan.name!r} has no words "
                        "(it is empty or only whitespace)")
    vocab = Vocabulary.from_counts(counter, config.min_count, config.max_size, unk=UNK,
                                   eos=EOS if plan.lines else None)
    encoded: dict[str, Tensor] = {}
    for role, (file_key, a, b) in ranges.items():
        parts = [vocab.encode_numpy(tokens) for tokens in _token_chunks(texts[file_key], a, b, plan.lines)]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if ids.size == 0:
            raise DataError(f"{plan.paths[file_key]}: the {role} split of {plan.name!r} has no tokens")
        encoded[role] = torch.from_numpy(ids)
    return Corpus(plan.name, vocab, encoded["train"], encoded["valid"], encoded.get("test"),
                  dict(plan.files), config, plan.lines)


def _read_cache(folder: Path, key: str, plan: _Plan, config: VocabConfig) -> Corpus | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("key") != key:
            return None
        vocab = Vocabulary.load(folder / "vocab.json")
        arrays = {role: torch.from_numpy(np.load(folder / f"{role}.npy", allow_pickle=False))
                  for role in meta["splits"]}
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None
    if any(a.dtype != torch.int64 or a.dim() != 1 for a in arrays.values()):
        return None
    return Corpus(plan.name, vocab, arrays["train"], arrays["valid"], arrays.get("test"), dict(plan.files),
                  config, plan.lines, cache_path=folder, from_cache=True)


def _write_cache(folder: Path, key: str, corpus: Corpus) -> Path | None:
    """Save atomically (a temporary folder renamed into place); errors only cost speed."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError:
        return None
    try:
        splits = corpus.splits()
        for role, ids in splits.items():
            np.save(tmp / f"{role}.npy", ids.numpy(), allow_pickle=False)
        corpus.vocab.save(tmp / "vocab.json")
        meta = {"key": key, "name": corpus.name, "files": corpus.files, "splits": list(splits),
                "tokens": {role: int(ids.numel()) for role, ids in splits.items()}, "vocab_size": len(corpus.vocab)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        if (folder / "meta.json").exists():  # another process wrote it meanwhile
            remove_tree(tmp)
            return folder
        if folder.exists():  # a broken entry (no meta.json)
            remove_tree(folder)
        os.replace(tmp, folder)
        return folder
    except OSError:
        remove_tree(tmp)
        return folder if (folder / "meta.json").exists() else None
