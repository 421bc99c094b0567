"""Downloading corpus files: where from (:class:`Source`), the HTTP stream, and the archive members.

:func:`~sohsm.data.corpus_files.fetch` puts these together; a known corpus missing from the data
directory comes through here on first use.
"""
from __future__ import annotations

import sys
import tarfile
import urllib.error
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from sohsm.data.errors import DataError

_CHUNK = 1 << 20


class BinarySink(Protocol):
    """Where downloaded or extracted bytes go: a binary file, or a wrapper that hashes them on the way."""

    def write(self, data: bytes, /) -> int: ...


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


def download_to(url: str, handle: BinarySink, *, desc: str, progress: bool, timeout: float) -> None:
    """Stream ``url`` into an open binary file with pooch's HTTP downloader, a tqdm bar on stderr.

    Raises:
        OSError (``requests``' errors derive from it) when the download fails or is cut short.
    """
    import pooch
    from tqdm import tqdm

    # the bar shows once bytes flow (``delay``): a location that cannot be reached leaves no bar behind
    bar = (tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=False, delay=0.2, file=sys.stderr)
           if progress else None)
    downloader = pooch.HTTPDownloader(progressbar=False if bar is None else bar, timeout=timeout,
                                      headers={"User-Agent": "sohsm-data-fetch"})
    try:
        downloader(url, handle, None)
    finally:
        if bar is not None:
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
        status = getattr(response, "status_code", None)
        if status is not None:
            return f"HTTP {status} {getattr(response, 'reason', '') or ''}".strip()
        if isinstance(err, urllib.error.HTTPError):
            return f"HTTP {err.code} {err.reason}"
        if "Name or service not known" in str(err) or "Failed to resolve" in str(err):
            return "the host name could not be resolved (no network, or no DNS)"
        pending += [e for e in (err.__cause__, err.__context__, *err.args) if isinstance(e, BaseException)]
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _copy_limited(src: IO[bytes], dst: BinarySink, limit: int | None) -> None:
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


def extract_member(archive: Path, source: Source, dst: BinarySink) -> None:
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
        member = tf.extractfile(members[0])
        assert member is not None  # a regular file, by the filter above
        with member:
            _copy_limited(member, dst, source.prefix_bytes)


def download_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed download or unpack may raise (besides :class:`DataError`)."""
    return (OSError, urllib.error.URLError, zipfile.BadZipFile, tarfile.TarError, EOFError, ValueError)
