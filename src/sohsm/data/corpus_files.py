"""The files of a known corpus in a data directory: checking them and fetching them.

:func:`corpus_status` says what is there, file by file (``sohsm data list``);
:func:`verify_corpus` refuses a missing, corrupt or incomplete file in one line
that says where to put it; :func:`fetch` downloads what is missing, checks it
and only then moves it into place (``sohsm data fetch``). The corpora
themselves, their files and sources, are declared in :mod:`sohsm.data.corpora`.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from sohsm.atomic_writes import atomic_output
from sohsm.data.corpora import FileSpec, get_spec
from sohsm.data.downloads import Source, download_errors, download_failure, download_to, extract_member
from sohsm.data.errors import DataError
from sohsm.data.files import (
    cached_sha256,
    data_dir_origin,
    record_sha256,
    remove_tree,
    resolve_cache_dir,
    resolve_data_dir,
)


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
