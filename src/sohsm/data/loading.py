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
``valid`` (or ``dev``) and one with ``test``. Where each split's text is, and its
words as rows: :mod:`sohsm.data.split_text`; here, what they become (ids, a
vocabulary, a cache entry).

Subword vocabularies (``tokenizer="bpe:SIZE"``, a byte-level BPE trained on the
training split and cached under ``<cache dir>/tokenizers/``, or the path of a
``tokenizer.json``): :mod:`sohsm.data.subwords`. Their cache entries are keyed
on the tokenizer's sha256 as well, so word and subword ids never mix.

Every split also records how many words and bytes its text has, so that a
model's loss can be given per word and per byte whatever cuts the text into
tokens: **words** are the tokens a word vocabulary reads (the whitespace-separated
words, plus one ``<eos>`` per line where the corpus has lines); **bytes** are
the UTF-8 bytes of the text a tokenizer reads, each line's words joined by single
spaces and ended by a newline (running text: one space after every word).

One load, in order: :func:`load_corpus` finds the corpus (a known name, or
:func:`~sohsm.data.corpora.check_corpus_exists` for a path); fetches a known one
missing from the data directory (:func:`fetch_on_first_use`); plans its splits and
checks every file, a known corpus against its recorded sha256 and your own text by
its sha256 (:func:`~sohsm.data.split_text.registry_plan` or
:func:`~sohsm.data.split_text.user_plan`, through :func:`~sohsm.data.files.cached_sha256`);
then :func:`_load` keys the cache on those checksums and options, and reads the entry
(:func:`_read_cache`) or tokenises the text and writes it (:func:`_tokenise`, :func:`_write_cache`).

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sohsm.data.corpora import CORPORA, check_corpus_exists
from sohsm.data.corpus_files import corpus_status, fetch
from sohsm.data.errors import DataError
from sohsm.data.files import data_dir_origin, remove_tree, resolve_cache_dir
from sohsm.data.split_text import (
    SplitPlan,
    registry_plan,
    row_bytes,
    row_chunks,
    split_texts,
    user_plan,
    word_tokens,
)
from sohsm.data.subwords import Subwords, bpe_size, packaged_name, tokenizer_file, tokenizers_version
from sohsm.data.vocab import EOS, UNK, VocabConfig, Vocabulary
from sohsm.fields import FieldError

#: bumped whenever tokenisation or the cache layout changes, so old entries are ignored
#: (2: a UTF-8 byte-order mark is no longer part of the first word; 3: each split's words and bytes are stored)
CACHE_VERSION = 3
#: environment variable: set to 1 to never download a missing corpus on first use
OFFLINE_ENV = "SOHSM_OFFLINE"


@dataclass
class Corpus:
    """A tokenised corpus.

    Attributes:
        name: corpus name (a registry name, or the file/folder name for your text).
        vocab: the vocabulary, built on ``train``.
        train, valid: 1-D LongTensors of token ids.
        test: 1-D LongTensor, or ``None`` when the corpus has no test split.
        files: ``{file: sha256}`` of the files it was read from.
        config: the vocabulary options used (a subword vocabulary has none: the defaults).
        lines: whether ``<eos>`` was appended per line.
        cache_path: the cache folder it was read from or saved to, if any.
        from_cache: whether it was read from the cache.
        tokenizer: the subword tokenizer the text was cut with, ``None`` for words.
        words: ``{split: words}`` of each split's text (see the module docstring).
        text_bytes: ``{split: UTF-8 bytes}`` of each split's text (see the module docstring).
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
    tokenizer: Subwords | None = None
    words: dict[str, int] = field(default_factory=dict)
    text_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        """Name, file checksums and vocabulary options (or the tokenizer) in one line, for reports.

        Example: ``ptb ptb.train.txt:fcea919f6cf83f35 ... min_count=1 max_size=None``
        (the first 16 hex digits of each file's sha256); a subword vocabulary ends with
        ``tokenizer=<the first 16 hex digits of its tokenizer's sha256>``.
        """
        files = " ".join(f"{Path(path).name}:{digest[:16]}" for path, digest in self.files.items())
        if self.tokenizer is not None:
            return f"{self.name} {files} tokenizer={self.tokenizer.digest}"
        return f"{self.name} {files} min_count={self.config.min_count} max_size={self.config.max_size}"

    def splits(self) -> dict[str, Tensor]:
        """``{"train": ..., "valid": ..., "test": ...}`` without the splits that are ``None``."""
        return {s: getattr(self, s) for s in ("train", "valid", "test") if getattr(self, s) is not None}


def load_corpus(name_or_path: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None,
                min_count: int | None = None, max_size: int | None = None,
                cache_dir: str | os.PathLike[str] | None = None, *, text_mode: str | None = None,
                valid_fraction: float = 0.1, use_cache: bool = True, fetch_missing: bool | None = None,
                tokenizer: str | Subwords | None = None) -> Corpus:
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
        tokenizer: ``None``: words. A subword vocabulary (:mod:`sohsm.data.subwords`): ``"bpe:SIZE"``
            (a byte-level BPE of SIZE tokens trained on the training split, or read from the cache
            where one was trained before), ``"llama3"`` or ``"o200k"`` (a packaged tokenizer, its whole
            vocabulary: :mod:`sohsm.data.packaged_tokenizers`), the path of a ``tokenizer.json``, or a
            :class:`~sohsm.data.subwords.Subwords`. ``min_count`` and ``max_size`` must then be ``None``.

    Returns:
        A :class:`Corpus`.

    Raises:
        DataError: unknown name, missing or corrupt files, text too short to split, a tokenizer that is
            neither ``bpe:SIZE`` nor a tokenizer file.
        ValueError: bad options; ``tokenizers`` is not installed.
    """
    if tokenizer is not None and (min_count is not None or max_size is not None):
        raise FieldError("{} cuts rare words of a word vocabulary; a subword vocabulary ({}) keeps every token of "
                         "its tokenizer", "min_count" if min_count is not None else "max_size", "tokenizer")
    if isinstance(tokenizer, str) and packaged_name(tokenizer) is not None:
        from sohsm.data.packaged_tokenizers import PackagedSubwords

        tokenizer = PackagedSubwords(tokenizer)  # type: ignore[assignment]  # the face of Subwords
    elif isinstance(tokenizer, str) and bpe_size(tokenizer) is None:
        tokenizer = Subwords.from_file(tokenizer_file(tokenizer))
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
        plan = registry_plan(spec, data_dir, cache)
        config = config or VocabConfig(spec.min_count, spec.max_size)
    else:
        check_corpus_exists(name_or_path)
        path = Path(name_or_path).expanduser()
        plan = user_plan(path, text_mode, valid_fraction, cache)
        config = config or VocabConfig()
    if tokenizer is not None:
        config = VocabConfig()
        if isinstance(tokenizer, str):  # "bpe:SIZE": every other name was read into a Subwords above
            size = bpe_size(tokenizer)
            assert size is not None
            tokenizer = _trained_bpe(plan, size, cache, use_cache)
    return _load(plan, config, cache, use_cache, tokenizer)


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


def _cache_key(plan: SplitPlan, config: VocabConfig, tokenizer: Subwords | None) -> str:
    payload = {"version": CACHE_VERSION, "name": plan.name, "lines": plan.lines, "files": plan.files,
               "truncated": sorted(plan.truncated), "splits": plan.splits,
               "min_count": config.min_count, "max_size": config.max_size,
               "tokenizer": None if tokenizer is None else tokenizer.digest}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def _cache_folder(cache: Path, kind: str, name: str, key: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "corpus"
    return cache / kind / f"{safe}-{key[:16]}"


def _load(plan: SplitPlan, config: VocabConfig, cache: Path, use_cache: bool, tokenizer: Subwords | None) -> Corpus:
    key = _cache_key(plan, config, tokenizer)
    folder = _cache_folder(cache, "corpora", plan.name, key)
    if use_cache:
        cached = _read_cache(folder, key, plan, config, tokenizer)
        if cached is not None:
            return cached
    corpus = _tokenise(plan, config) if tokenizer is None else _tokenise_subwords(plan, tokenizer)
    if use_cache:
        corpus.cache_path = _write_cache(folder, key, corpus)
    return corpus


def _no_words(plan: SplitPlan, file_key: str) -> DataError:
    return DataError(f"{plan.paths[file_key]}: the train split of {plan.name!r} has no words "
                     "(it is empty or only whitespace)")


def _tokenise(plan: SplitPlan, config: VocabConfig) -> Corpus:
    texts, ranges = split_texts(plan)
    counter: Counter[str] = Counter()
    file_key, a, b = ranges["train"]
    for rows in row_chunks(texts[file_key], a, b, plan.lines):
        counter.update(word_tokens(rows, plan.lines))
    if not any(word != EOS for word in counter):
        raise _no_words(plan, file_key)
    vocab = Vocabulary.from_counts(counter, config.min_count, config.max_size, unk=UNK,
                                   eos=EOS if plan.lines else None)
    encoded: dict[str, Tensor] = {}
    words: dict[str, int] = {}
    text_bytes: dict[str, int] = {}
    for role, (file_key, a, b) in ranges.items():
        parts, text_bytes[role] = [], 0
        for rows in row_chunks(texts[file_key], a, b, plan.lines):
            parts.append(vocab.encode_numpy(word_tokens(rows, plan.lines)))
            text_bytes[role] += row_bytes(rows, plan.lines)
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if ids.size == 0:
            raise DataError(f"{plan.paths[file_key]}: the {role} split of {plan.name!r} has no tokens")
        encoded[role], words[role] = torch.from_numpy(ids), int(ids.size)
    return Corpus(plan.name, vocab, encoded["train"], encoded["valid"], encoded.get("test"),
                  dict(plan.files), config, plan.lines, words=words, text_bytes=text_bytes)


#: words of running text per piece the tokenizer reads at once (pieces are read in parallel)
_PIECE_WORDS = 2000


def _pieces(rows: list[list[str]], lines: bool) -> list[str]:
    """The texts a tokenizer reads of rows: each line's words joined by single spaces (an empty line: ``""``);
    running text in pieces of :data:`_PIECE_WORDS` words."""
    if lines:
        return [" ".join(row) for row in rows]
    return [" ".join(row[i:i + _PIECE_WORDS]) for row in rows for i in range(0, len(row), _PIECE_WORDS)]


def _subword_ids(tokenizer: Subwords, rows: list[list[str]], lines: bool, eos: int) -> np.ndarray:
    """The tokenizer's ids of rows, ``eos`` after each line."""
    pieces = _pieces(rows, lines)
    said = iter(tokenizer.encode([p for p in pieces if p]))
    ids: list[int] = []
    for piece in pieces:
        if piece:
            ids.extend(next(said))
        if lines:
            ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def _tokenise_subwords(plan: SplitPlan, tokenizer: Subwords) -> Corpus:
    """Every split as subword ids: the tokenizer's ids, then the vocabulary's (by count in the training split)."""
    texts, ranges = split_texts(plan)
    eos = tokenizer.token_ids([EOS])[0]
    raw: dict[str, np.ndarray] = {}
    words: dict[str, int] = {}
    text_bytes: dict[str, int] = {}
    for role, (file_key, a, b) in ranges.items():
        parts, plain_words, lines, text_bytes[role] = [], 0, 0, 0
        for rows in row_chunks(texts[file_key], a, b, plan.lines):
            parts.append(_subword_ids(tokenizer, rows, plan.lines, eos))
            plain_words += sum(map(len, rows))
            lines += len(rows) if plan.lines else 0
            text_bytes[role] += row_bytes(rows, plan.lines)
        if role == "train" and not plain_words:
            raise _no_words(plan, file_key)
        raw[role], words[role] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64), plain_words + lines
        if raw[role].size == 0:
            raise DataError(f"{plan.paths[file_key]}: the {role} split of {plan.name!r} has no tokens")
    vocab, to_vocab = tokenizer.vocabulary(raw["train"], plan.lines)
    encoded = {role: torch.from_numpy(to_vocab[ids]) for role, ids in raw.items()}
    return Corpus(plan.name, vocab, encoded["train"], encoded["valid"], encoded.get("test"), dict(plan.files),
                  VocabConfig(), plan.lines, tokenizer=tokenizer, words=words, text_bytes=text_bytes)


#: bumped whenever the recipe of a trained BPE changes, so that the cache never gives an old one
BPE_VERSION = 1


def _trained_bpe(plan: SplitPlan, size: int, cache: Path, use_cache: bool) -> Subwords:
    """The byte-level BPE of ``size`` tokens of the plan's training split: trained, or read from the cache where
    the same split, size and ``tokenizers`` release trained it before."""
    payload = {"version": BPE_VERSION, "name": plan.name, "lines": plan.lines, "train": plan.splits["train"],
               "file": plan.files[plan.splits["train"][0]], "truncated": sorted(plan.truncated), "size": size,
               "tokenizers": tokenizers_version()}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()
    path = _cache_folder(cache, "tokenizers", f"{plan.name}-bpe{size}", key) / "tokenizer.json"
    if use_cache and path.is_file():
        try:
            return Subwords.from_file(path)
        except DataError:
            pass  # a damaged entry: trained again and written over
    texts, ranges = split_texts(plan, ("train",))
    file_key, a, b = ranges["train"]

    def pieces() -> Iterator[str]:
        for rows in row_chunks(texts[file_key], a, b, plan.lines):
            yield from (p for p in _pieces(rows, plan.lines) if p)

    subwords = Subwords.train_bpe(pieces(), size)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            subwords.save(path)
        except OSError:
            pass  # the cache only saves time
    return subwords


def _read_cache(folder: Path, key: str, plan: SplitPlan, config: VocabConfig,
                tokenizer: Subwords | None) -> Corpus | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("key") != key:
            return None
        vocab = Vocabulary.load(folder / "vocab.json")
        arrays = {role: torch.from_numpy(np.load(folder / f"{role}.npy", allow_pickle=False))
                  for role in meta["splits"]}
        words = {role: int(meta["words"][role]) for role in arrays}
        text_bytes = {role: int(meta["bytes"][role]) for role in arrays}
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None
    if any(a.dtype != torch.int64 or a.dim() != 1 for a in arrays.values()):
        return None
    return Corpus(plan.name, vocab, arrays["train"], arrays["valid"], arrays.get("test"), dict(plan.files),
                  config, plan.lines, cache_path=folder, from_cache=True, tokenizer=tokenizer, words=words,
                  text_bytes=text_bytes)


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
                "tokens": {role: int(ids.numel()) for role, ids in splits.items()}, "vocab_size": len(corpus.vocab),
                "words": corpus.words, "bytes": corpus.text_bytes}
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
