"""Where corpus files live and whether they are intact: the data and cache directories, and checksums.

* Data directory: the ``data_dir`` argument, else ``$SOHSM_DATA``, else
  ``~/.cache/sohsm``. Each corpus has its own folder in it (``ptb/``,
  ``wikitext-2/``, ``text8/``, ...).
* Cache directory (verification stamps, tokenised corpora): the ``cache_dir``
  argument, else ``$SOHSM_CACHE``, else ``~/.cache/sohsm/cache``. The data
  directory itself is never written to, except by a download
  (:func:`~sohsm.data.corpus_files.fetch`), so it may be read-only and shared.
* A file's sha256 is computed once and remembered in a small stamp file keyed
  on the file's path, size, mtime, ctime and inode; a later run trusts the
  stamp while none of these changed, so checking a corpus takes milliseconds.

Downloads are :mod:`sohsm.data.downloads`; the atomic writes every file of the package goes through,
:mod:`sohsm.atomic_writes`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from sohsm.atomic_writes import write_atomic_text

#: environment variable naming the data directory
DATA_ENV = "SOHSM_DATA"
#: environment variable naming the cache directory
CACHE_ENV = "SOHSM_CACHE"


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


def remove_tree(path: Path) -> None:
    """Delete a temporary folder, ignoring errors."""
    shutil.rmtree(path, ignore_errors=True)
