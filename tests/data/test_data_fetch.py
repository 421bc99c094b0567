"""fetch downloads from a local HTTP server, verifies, writes atomically and rejects bad files."""
from __future__ import annotations

import hashlib
import io
import shutil
import zipfile

import pytest

from sohsm.data import CORPORA, CorpusSpec, DataError, FileSpec, Source, Split, fetch, load_corpus, verify_corpus
from sohsm.data.files import sha256_file


def _leftovers(root):
    """Files under ``root`` (temporary downloads included)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_fetch_ptb_from_a_mirror(data_dir, tmp_path, http_serve):
    base, requested = http_serve(data_dir)
    target = tmp_path / "data"
    paths = fetch("ptb", target, base_url=base, progress=False, cache_dir=tmp_path / "cache")
    assert [p.name for p in paths] == ["ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"]
    assert _leftovers(target) == ["ptb/ptb.test.txt", "ptb/ptb.train.txt", "ptb/ptb.valid.txt"]
    for path in paths:
        assert sha256_file(path) == sha256_file(data_dir / "ptb" / path.name)
    verify_corpus("ptb", target, tmp_path / "cache")
    # a second fetch finds the files intact and downloads nothing
    count = len(requested)
    fetch("ptb", target, base_url=base, progress=False, cache_dir=tmp_path / "cache")
    assert len(requested) == count == 3


def test_fetch_rejects_a_wrong_checksum(data_dir, tmp_path, http_serve):
    served = tmp_path / "served"
    shutil.copytree(data_dir / "ptb", served / "ptb")
    bad = bytearray((served / "ptb" / "ptb.valid.txt").read_bytes())
    bad[10] ^= 0x20
    (served / "ptb" / "ptb.valid.txt").write_bytes(bytes(bad))
    base, _ = http_serve(served)
    target = tmp_path / "data"
    with pytest.raises(DataError) as info:
        fetch("ptb", target, base_url=base, progress=False, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "ptb/ptb.valid.txt" in message and hashlib.sha256(bytes(bad)).hexdigest() in message
    assert CORPORA["ptb"].file("ptb/ptb.valid.txt").sha256 in message
    assert "\n" not in message
    # the bad download is gone, no temporary file is left; the good file before it stays
    assert _leftovers(target) == ["ptb/ptb.train.txt"]


def test_no_network_is_one_line(tmp_path):
    with pytest.raises(DataError) as info:
        fetch("ptb", tmp_path / "data", base_url="http://127.0.0.1:9", progress=False, timeout=5,
              cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "could not download ptb/ptb.train.txt" in message
    assert str(tmp_path / "data" / "ptb" / "ptb.train.txt") in message
    assert not _leftovers(tmp_path / "data")


def test_an_unreachable_archive_leaves_no_folder_and_no_progress_bar(tmp_path, monkeypatch, capfd):
    """Offline: the message gives each location's reason in a few words, names every missing file,
    and neither the data directory (nor the archive's scratch folder in it) nor a bar is left behind."""
    spec = CorpusSpec(
        "toy-offline", "toy",
        tuple(FileSpec(f"toy/{name}", None, (Source(f"http://127.0.0.1:9/{name}.txt"),
                                              Source("http://127.0.0.1:9/toy.zip", member=name)))
              for name in ("train", "valid")),
        train=Split("toy/train"), valid=Split("toy/valid"))
    monkeypatch.setitem(CORPORA, "toy-offline", spec)
    target = tmp_path / "new" / "data"
    with pytest.raises(DataError) as info:
        fetch("toy-offline", target, progress=True, timeout=5, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert message.count("connection refused") == 2 and "http://127.0.0.1:9/toy.zip" in message
    assert str(target / "toy" / "train") in message and str(target / "toy" / "valid") in message
    assert len(message) < 600 and "\n" not in message
    assert not (tmp_path / "new").exists()
    assert capfd.readouterr().err == ""


def test_download_failure_finds_the_reason_inside_wrappers():
    import socket

    from sohsm.data.downloads import download_failure

    wrapped = OSError("Max retries exceeded", socket.gaierror(-2, "Name or service not known"))
    assert download_failure(wrapped).startswith("the host name could not be resolved")
    assert download_failure(TimeoutError()) == "timed out"
    assert download_failure(ValueError("x" * 500)).endswith("...")


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def test_fetch_from_an_archive_with_prefix_and_crc(tmp_path, http_serve, monkeypatch):
    """The text8 / text8-small way: one zip, a whole member checked by CRC-32, and a prefix of it."""
    whole = b" one two three four five six seven eight nine ten"
    served = tmp_path / "served"
    served.mkdir()
    (served / "toy.zip").write_bytes(_zip_bytes({"toy/toy": whole}))
    base, requested = http_serve(served)
    crc = zipfile.ZipFile(served / "toy.zip").getinfo("toy/toy").CRC
    prefix = whole[:18]  # ends inside "four"
    spec = CorpusSpec(
        "toy-zip", "toy",
        (FileSpec("toy/toy", None, (Source(f"{base}/toy.zip", member="toy", crc32=crc),), size=len(whole)),
         FileSpec("toy/toy.head", hashlib.sha256(prefix).hexdigest(),
                  (Source(f"{base}/toy.zip", member="toy", prefix_bytes=18),), truncated=True)),
        train=Split("toy/toy.head", 0, 8), valid=Split("toy/toy.head", 8), lines=False,
    )
    monkeypatch.setitem(CORPORA, "toy-zip", spec)
    target = tmp_path / "data"
    fetch("toy-zip", target, progress=False, cache_dir=tmp_path / "cache")
    assert requested == ["/toy.zip"]  # the archive is downloaded once for both files
    assert (target / "toy" / "toy").read_bytes() == whole
    assert (target / "toy" / "toy.head").read_bytes() == prefix
    assert _leftovers(target) == ["toy/toy", "toy/toy.head"]
    corpus = load_corpus("toy-zip", target, cache_dir=tmp_path / "cache")
    assert corpus.vocab.decode(corpus.train) == ["one", "two"]  # cut at the space after offset 8
    assert corpus.vocab.decode(corpus.valid) == ["<unk>"]  # "three"; the partial "fou" is dropped

    # a different archive (wrong CRC-32) is refused and nothing is written
    wrong = CorpusSpec("toy-wrong", "toy", (FileSpec("toy/other", None, (Source(
        f"{base}/toy.zip", member="toy", crc32=crc ^ 1),)),), train=Split("toy/other"), valid=Split("toy/other"))
    monkeypatch.setitem(CORPORA, "toy-wrong", wrong)
    with pytest.raises(DataError, match="CRC-32"):
        fetch("toy-wrong", target, progress=False, cache_dir=tmp_path / "cache")
    assert not (target / "toy" / "other").exists()


# -- on first use -----------------------------------------------------------------------------------
def _toy_lines(base):
    """A two-file line corpus served from ``base`` (train and valid), with its checksums."""
    train, valid = b"a b c\nb c d\nc d e\n" * 5, b"a b\nc d\n"
    spec = CorpusSpec("toy-lines", "toy", (
        FileSpec("toy/train.txt", hashlib.sha256(train).hexdigest(), (Source(f"{base}/train.txt"),)),
        FileSpec("toy/valid.txt", hashlib.sha256(valid).hexdigest(), (Source(f"{base}/valid.txt"),))),
        train=Split("toy/train.txt"), valid=Split("toy/valid.txt"))
    return spec, train, valid


def test_a_missing_corpus_is_fetched_on_first_use_with_one_line(tmp_path, http_serve, monkeypatch, capsys):
    served = tmp_path / "served"
    served.mkdir()
    base, requested = http_serve(served)
    spec, train, valid = _toy_lines(base)
    (served / "train.txt").write_bytes(train)
    (served / "valid.txt").write_bytes(valid)
    monkeypatch.setitem(CORPORA, spec.name, spec)
    target = tmp_path / "data"
    # the tests run with $SOHSM_OFFLINE=1: nothing is downloaded, the message says what to put where
    with pytest.raises(DataError, match="is missing toy/train.txt, toy/valid.txt in your data directory"):
        load_corpus(spec.name, target, cache_dir=tmp_path / "cache")
    assert requested == [] and not target.exists()

    corpus = load_corpus(spec.name, target, cache_dir=tmp_path / "cache", fetch_missing=True)
    assert corpus.vocab.decode(corpus.valid)[:2] == ["a", "b"]
    assert sorted(requested) == ["/train.txt", "/valid.txt"]
    err = capsys.readouterr().err
    assert err == f"fetched toy-lines (2 files, verified) into {target / 'toy'}\n"
    load_corpus(spec.name, target, cache_dir=tmp_path / "cache", fetch_missing=True)
    assert len(requested) == 2 and capsys.readouterr().err == ""  # present: nothing fetched, nothing said


def test_offline_first_use_is_one_line_naming_every_missing_file(tmp_path, monkeypatch):
    spec, _, _ = _toy_lines("http://127.0.0.1:9")
    monkeypatch.setitem(CORPORA, spec.name, spec)
    monkeypatch.setenv("SOHSM_OFFLINE", "0")
    target = tmp_path / "data"
    with pytest.raises(DataError) as info:
        load_corpus(spec.name, target, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message and "downloading it failed: could not download toy/train.txt" in message
    assert f"put the files {target / 'toy' / 'train.txt'}, {target / 'toy' / 'valid.txt'} there" in message
    assert not target.exists()  # no empty folder left behind
