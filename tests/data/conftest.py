"""Fixtures of the data-layer tests: the real corpora, a private cache, a local HTTP server.

The corpora are read from ``$SOHSM_DATA`` (a relative value is taken relative to
the repository root), else from ``<repo root>/../shared/data``. Nothing is ever
written to the data directory or to the user's cache: every test gets
``$SOHSM_CACHE`` pointed at a temporary folder shared by the session.
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sohsm.data import load_corpus

REPO_ROOT = Path(__file__).resolve().parents[2]


def _data_dir() -> Path:
    env = os.environ.get("SOHSM_DATA")
    path = Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data"
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = _data_dir()
    if not (path / "ptb" / "ptb.train.txt").is_file():
        pytest.fail(f"corpora not found in {path}: set SOHSM_DATA to your data directory")
    return path


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sohsm-cache")


@pytest.fixture(autouse=True)
def _private_env(monkeypatch, session_cache) -> None:
    """Keep the user's cache and environment out of every test."""
    monkeypatch.setenv("SOHSM_CACHE", str(session_cache))
    monkeypatch.setenv("SOHSM_DATA", str(_data_dir()))


@pytest.fixture(scope="session")
def ptb(data_dir, session_cache):
    return load_corpus("ptb", data_dir, cache_dir=session_cache)


@pytest.fixture(scope="session")
def wikitext2(data_dir, session_cache):
    return load_corpus("wikitext-2", data_dir, cache_dir=session_cache)


@pytest.fixture(scope="session")
def text8_small(data_dir, session_cache):
    return load_corpus("text8-small", data_dir, cache_dir=session_cache)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):  # noqa: N802 - the base class's name
        self.server.requested.append(self.path)
        super().do_GET()


@pytest.fixture
def http_serve() -> Iterator:
    """``http_serve(folder)`` -> (base URL on 127.0.0.1, list of requested paths)."""
    servers = []

    def start(folder: Path) -> tuple[str, list[str]]:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.requested = []
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", server.requested

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
