"""Where corpus files live, how they are checked, and how they are downloaded.

* Data directory: the ``data_dir`` argument, else ``$SOHSM_DATA``, else
  ``~/.cache/sohsm``. Each corpus has its own folder in it (``ptb/``,
  ``wikitext-2/``, ``text8/``, ...).
* Cache directory (verification stamps, tokenised corpora): the ``cache_dir``
  argument, else ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``. The data
  directory itself is never written to, except by :func:`download`, so it may
  be read-only and shared.
* A file's sha256 is computed once and remembered in a small stamp file keyed
  on the file's path, size, mtime, ctime and inode; a later run trusts the
  stamp while none of these changed, so checking a corpus takes milliseconds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sohsm.data.errors import DataError

#: environment variable naming the data directory
DATA_ENV = "SOHSM_DATA"
#: environment variable naming the cache directory
CACHE_ENV = "SOHSM_CACHE"
_CHUNK = 1 << 20


def default_root() -> Path:
    """``~/.cache/sohsm``: the data directory when nothing else is given."""
    return Path.home() / ".cache" / "sohsm"


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``data_dir``, else ``$SOHSM_DATA``, else ``~/.cache/sohsm``."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return default_root()


def data_dir_origin(data_dir: str | os.PathLike[str] | None = None) -> str:
    """Where :func:`resolve_data_dir` took the directory from, for messages."""
    if data_dir is not None and str(data_dir) != "":
        return "given"
    if os.environ.get(DATA_ENV):
        return f"from ${DATA_ENV}"
    return "default"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``."""
    if cache_dir is not None and str(cache_dir) != "":
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return default_root() / "cache"


# -- hashing ------------------------------------------------------------------------
def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, as 64 hex digits (no caching; pooch reads the file)."""
    import pooch

    return pooch.file_hash(str(path), alg="sha256")


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _stamp_path(path: Path, cache_dir: Path) -> Path:
    key = hashlib.sha1(str(path.resolve()).encode("utf-8")).hexdigest()[:24]
    return cache_dir / "verified" / f"{key}.json"


def cached_sha256(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The sha256 of ``path``, remembered in a stamp file while the file is unchanged.

    The stamp is keyed on the resolved path, size, mtime, ctime and inode: any
    rewrite, copy or ``touch`` of the file makes it hash again. An unwritable cache
    directory only costs speed.

    Args:
        path: the file to hash.
        cache_dir: where stamps go; see :func:`resolve_cache_dir`.
    """
    path = Path(path)
    stamp = _stamp_path(path, resolve_cache_dir(cache_dir))
    key = _stat_key(path)
    try:
        recorded = json.loads(stamp.read_text(encoding="utf-8"))
        if recorded.get("path") == str(path.resolve()) and recorded.get("stat") == key:
            return str(recorded["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = sha256_file(path)
    if _stat_key(path) == key:  # not rewritten while we read it
        record_sha256(path, digest, cache_dir, _key=key)
    return digest


def record_sha256(
    path: str | os.PathLike[str],
    digest: str,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    _key: dict[str, int] | None = None,
) -> None:
    """Remember that ``path`` (as it is now) has sha256 ``digest``; errors are ignored."""
    path = Path(path)
    stamp = _stamp_path(path, resolve_cache_dir(cache_dir))
    record = {"path": str(path.resolve()), "stat": _key or _stat_key(path), "sha256": digest}
    try:
        write_atomic_text(stamp, json.dumps(record), durable=False)  # a lost stamp only costs a re-hash
    except OSError:
        pass


# -- atomic writes ------------------------------------------------------------------
#: the suffix of the temporary file an atomic write goes through (``.<name>.<random>.tmp`` next to the target)
ATOMIC_SUFFIX = ".tmp"


class WriteError(OSError):
    """A file could not be written: the file meant (never a temporary one) and the system's reason.

    ``str(error)`` is one line, ``runs/x/last.pt: No space left on device``; ``errno``,
    ``strerror`` and ``filename`` are those of the :class:`OSError` it stands for.
    """

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def os_error_in(error: BaseException) -> OSError | None:
    """The :class:`OSError` with an ``errno`` behind ``error``: itself, or one it was raised from or during.

    torch's writer turns a failed ``write`` (a full disk) into a ``RuntimeError`` whose context is
    the ``OSError``; this finds it.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux)."""
    with suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(target: str | os.PathLike[str], mode: str = "wb", make_parents: bool = True, *,
                  durable: bool = True) -> Iterator[IO]:
    """Open a temporary file next to ``target`` that replaces it (``os.replace``) only on success.

    Every atomic write of the package goes through here. ``target`` is either left as it was or
    replaced whole, never half-written: on an exception the temporary file is deleted; a process
    killed mid-write leaves it behind (:func:`sohsm.train.checkpoint.remove_orphans` deletes those
    of a run directory). The file gets the mode a plain ``open`` would give it (``0o666`` less the
    umask), not the ``0o600`` of a temporary file, so a group that may read the folder may read
    what is written there.

    Args:
        target: the file to write.
        mode: ``"wb"`` or ``"w"`` (utf-8 text).
        make_parents: create ``target``'s folder if it is missing (else a missing folder is an error).
        durable: flush the data to the disk (``fsync``) before the replace; ``False`` for files
            whose loss in a power cut costs only time (cache stamps).

    Raises:
        WriteError: the folder or the file could not be written (a full disk, a read-only
            folder), naming ``target`` and the system's reason, also where the writer (torch's,
            for instance) wrapped the system's error in another.
    """
    target = Path(target)
    try:
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=ATOMIC_SUFFIX, dir=target.parent)
    except OSError as error:
        raise WriteError(error.errno, error.strerror, str(target)) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as error:
        with suppress(OSError):
            os.unlink(tmp)
        cause = os_error_in(error) if isinstance(error, (OSError, RuntimeError)) else None
        if cause is not None and not isinstance(error, WriteError):
            raise WriteError(cause.errno, cause.strerror, str(target)) from None
        raise


def write_atomic(target: str | os.PathLike[str], write) -> None:
    """Call ``write(binary_file)`` on a temporary file next to ``target``, then replace ``target`` with it
    (:func:`atomic_output`, durably); the folder must exist (a run directory's files are written here).

    Raises:
        WriteError: the write failed (a full disk, a read-only folder); it names ``target``, not the
            temporary file, and the system's reason, also where torch's writer turned that reason
            into a ``RuntimeError``.
    """
    with atomic_output(target, "wb", make_parents=False) as handle:
        write(handle)


def write_atomic_text(target: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write ``text`` (utf-8) to ``target`` atomically (:func:`atomic_output`)."""
    with atomic_output(target, "w", durable=durable) as handle:
        handle.write(text)


# -- downloads ----------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """One place a corpus file can be downloaded from.

    Attributes:
        url: the address of the file, or of an archive (``.zip``, ``.tgz``,
            ``.tar.gz``) that holds it.
        member: the file's path inside the archive; ``None`` for a plain file.
            Matched on its end, so a leading ``./`` or folder name may differ.
        prefix_bytes: keep only the first this many bytes of the file (a file
            defined as a prefix of a published one, like ``text8.head``).
        crc32: the CRC-32 the archive records for ``member``, checked before
            extracting (a zip then also checks the data against it); ``None`` to skip.
    """

    url: str
    member: str | None = None
    prefix_bytes: int | None = None
    crc32: int | None = None


def download_to(url: str, handle: IO[bytes], *, desc: str, progress: bool, timeout: float) -> None:
    """Stream ``url`` into an open binary file with pooch's HTTP downloader, a tqdm bar on stderr.

    Raises:
        OSError (``requests``' errors derive from it) when the download fails or is cut short.
    """
    import pooch
    from tqdm import tqdm

    # the bar shows once bytes flow (``delay``): a location that cannot be reached leaves no bar behind
    bar = (tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=False, delay=0.2, file=sys.stderr)
           if progress else False)
    downloader = pooch.HTTPDownloader(progressbar=bar, timeout=timeout, headers={"User-Agent": "sohsm-data-fetch"})
    try:
        downloader(url, handle, None)
    finally:
        if bar is not False:
            bar.close()


def download_failure(error: BaseException) -> str:
    """A short reason for a failed download: the network's words, not a library's chain of wrappers.

    >>> download_failure(ConnectionRefusedError(111, "Connection refused"))
    'connection refused'
    """
    import socket

    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:  # the cause may sit in ``__cause__``, ``__context__`` or a wrapper's ``args``
        err = pending.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, socket.gaierror):
            return "the host name could not be resolved (no network, or no DNS)"
        if isinstance(err, ConnectionRefusedError):
            return "connection refused"
        if isinstance(err, (TimeoutError, socket.timeout)) or type(err).__name__ in ("ConnectTimeout", "ReadTimeout"):
            return "timed out"
        response = getattr(err, "response", None)
        if getattr(response, "status_code", None) is not None:
            return f"HTTP {response.status_code} {getattr(response, 'reason', '') or ''}".strip()
        if isinstance(err, urllib.error.HTTPError):
            return f"HTTP {err.code} {err.reason}"
        if "Name or service not known" in str(err) or "Failed to resolve" in str(err):
            return "the host name could not be resolved (no network, or no DNS)"
        pending += [e for e in (err.__cause__, err.__context__, *err.args) if isinstance(e, BaseException)]
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _copy_limited(src: IO[bytes], dst: IO[bytes], limit: int | None) -> None:
    remaining = limit
    while True:
        size = _CHUNK if remaining is None else min(_CHUNK, remaining)
        if size == 0:
            return
        block = src.read(size)
        if not block:
            if remaining:
                raise DataError(f"archive member is shorter than the {limit} bytes expected")
            return
        dst.write(block)
        if remaining is not None:
            remaining -= len(block)


def _member_matches(name: str, member: str) -> bool:
    name = name[2:] if name.startswith("./") else name
    return name == member or name.endswith("/" + member)


def extract_member(archive: Path, source: Source, dst: IO[bytes]) -> None:
    """Copy ``source.member`` (first ``source.prefix_bytes`` bytes if set) from a zip or tar archive.

    Raises:
        DataError: the archive has no such member, or its CRC-32 differs from ``source.crc32``.
        OSError, zipfile.BadZipFile, tarfile.TarError: an unreadable archive.
    """
    assert source.member is not None
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir() and _member_matches(i.filename, source.member)]
            if not infos:
                raise DataError(f"{source.url} has no member {source.member}")
            info = infos[0]
            if source.crc32 is not None and info.CRC != source.crc32:
                raise DataError(
                    f"{source.url}: member {info.filename} has CRC-32 {info.CRC:08x}, "
                    f"expected {source.crc32:08x} (a different version of the archive)"
                )
            with zf.open(info) as src:
                _copy_limited(src, dst, source.prefix_bytes)
        return
    with tarfile.open(archive, "r:*") as tf:
        members = [m for m in tf.getmembers() if m.isfile() and _member_matches(m.name, source.member)]
        if not members:
            raise DataError(f"{source.url} has no member {source.member}")
        src = tf.extractfile(members[0])
        assert src is not None
        with src:
            _copy_limited(src, dst, source.prefix_bytes)


def download_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed download or unpack may raise (besides :class:`DataError`)."""
    return (OSError, urllib.error.URLError, zipfile.BadZipFile, tarfile.TarError, EOFError, ValueError)


def remove_tree(path: Path) -> None:
    """Delete a temporary folder, ignoring errors."""
    shutil.rmtree(path, ignore_errors=True)
