"""Fixtures of the data-layer tests: the real corpora, a private cache, a local HTTP server.

The corpora are read from the data directory (``$SOHSM_DATA``, a relative value
taken relative to the repository root, else ``~/.cache/sohsm``); a test whose
corpus is not there is skipped with the reason (failed where
``$SOHSM_REQUIRE_DATA`` is set, as in CI). Nothing is ever
written to the data directory or to the user's cache: every test gets
``$SOHSM_CACHE`` pointed at a temporary folder shared by the session.
"""
from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from needs import data_dir as _data_dir, need_corpus
from sohsm.data import load_corpus


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return need_corpus("ptb")


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
    need_corpus("wikitext-2")
    return load_corpus("wikitext-2", data_dir, cache_dir=session_cache)


@pytest.fixture(scope="session")
def text8_small(data_dir, session_cache):
    need_corpus("text8-small")
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
