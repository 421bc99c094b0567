"""Known corpora load with the counts of the data sources, checksums are enforced, tokens are cached."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch

from sohsm.data import (
    CORPORA,
    CorpusSpec,
    DataError,
    FileSpec,
    Split,
    corpus_status,
    load_corpus,
    verify_corpus,
)
from sohsm.data.files import cached_sha256, sha256_file


def test_ptb_counts(ptb):
    assert ptb.train.numel() == 929_589
    assert ptb.valid.numel() == 73_760
    assert ptb.test.numel() == 82_430
    assert len(ptb.vocab) == 10_000
    assert ptb.train.dtype == torch.int64
    assert ptb.vocab.decode(ptb.train[:3]) == ["aer", "banknote", "berlitz"]
    # one <eos> per line: 42,068 training lines
    assert int((ptb.train == ptb.vocab.eos_id).sum()) == 42_068
    assert int(ptb.vocab.counts[ptb.vocab.eos_id]) == 42_068


def test_wikitext2_counts(wikitext2):
    assert wikitext2.train.numel() == 2_088_628
    assert wikitext2.valid.numel() == 217_646
    assert wikitext2.test.numel() == 245_569
    assert len(wikitext2.vocab) == 33_278


def test_text8_small_split(text8_small):
    assert text8_small.train.numel() + text8_small.valid.numel() == 2_139_748
    assert text8_small.test is None
    assert text8_small.vocab.eos_id is None  # running text: no <eos>
    words = text8_small.vocab.decode(text8_small.train[:5])
    assert words == ["anarchism", "originated", "as", "a", "term"]
    # valid is about the last million characters
    valid_chars = sum(len(w) + 1 for w in text8_small.vocab.decode(text8_small.valid) if w != "<unk>")
    assert 0.9e6 < valid_chars < 1.0e6
    # default vocabulary: min_count 5 on the training split
    counts = text8_small.vocab.counts
    unk = text8_small.vocab.unk_id
    assert counts[np.arange(len(counts)) != unk].min() >= 5
    assert len(text8_small.vocab) == 21_453


def test_vocab_counts_match_training_ids(ptb):
    counts = torch.bincount(ptb.train, minlength=len(ptb.vocab)).numpy()
    assert np.array_equal(counts, ptb.vocab.counts)
    assert (np.diff(ptb.vocab.counts) <= 0).all()  # most frequent first


def test_signature_names_files_and_options(ptb):
    sig = ptb.signature
    assert sig.startswith("ptb ")
    assert "ptb.train.txt:fcea919f6cf83f35" in sig and "min_count=1" in sig


def test_second_load_reads_the_cache(ptb, data_dir, session_cache):
    assert ptb.cache_path is not None and (ptb.cache_path / "train.npy").is_file()
    again = load_corpus("ptb", data_dir, cache_dir=session_cache)
    assert again.from_cache and again.cache_path == ptb.cache_path
    assert torch.equal(again.train, ptb.train) and torch.equal(again.test, ptb.test)
    assert again.vocab == ptb.vocab


def test_options_change_the_cache_entry(ptb, data_dir, session_cache):
    small = load_corpus("ptb", data_dir, max_size=1000, cache_dir=session_cache)
    assert not small.from_cache and small.cache_path != ptb.cache_path
    assert len(small.vocab) == 1000
    assert small.train.numel() == ptb.train.numel()
    assert int(small.train.max()) < 1000


def test_verification_is_cached(data_dir, tmp_path):
    cache = tmp_path / "cache"
    path = data_dir / "ptb" / "ptb.valid.txt"
    digest = cached_sha256(path, cache)
    assert digest == sha256_file(path)
    assert len(list((cache / "verified").iterdir())) == 1
    assert cached_sha256(path, cache) == digest


@pytest.fixture
def ptb_copy(data_dir, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_dir / "ptb", root / "ptb")
    return root


def _flip_byte(path, offset=100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_checksum_mismatch_is_refused(ptb_copy, tmp_path):
    cache = tmp_path / "cache"
    verify_corpus("ptb", ptb_copy, cache)  # intact copy: fine, and stamped
    bad = ptb_copy / "ptb" / "ptb.valid.txt"
    _flip_byte(bad)  # same size: only the stamp key's times tell
    actual = sha256_file(bad)
    with pytest.raises(DataError) as info:
        load_corpus("ptb", ptb_copy, cache_dir=cache)
    message = str(info.value)
    assert str(bad) in message
    assert CORPORA["ptb"].file("ptb/ptb.valid.txt").sha256 in message and actual in message
    assert "\n" not in message
    assert corpus_status("ptb", ptb_copy, cache).state == "corrupt"


def test_missing_corpus_is_one_clear_line(tmp_path):
    with pytest.raises(DataError) as info:
        load_corpus("wikitext-2", tmp_path / "empty", cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "wikitext-2/wiki.train.tokens" in message and str(tmp_path / "empty") in message
    assert "sohsm data fetch wikitext-2" in message


def test_unknown_name(tmp_path):
    with pytest.raises(DataError, match="unknown corpus 'nope'"):
        load_corpus("nope", cache_dir=tmp_path)


@pytest.mark.parametrize("name", ["nothere.txt", "texts/nothere", "./nothere"])
def test_a_missing_file_is_called_missing_not_unknown(tmp_path, name):
    with pytest.raises(DataError, match=f"^{re.escape(name)}: no such file or folder"):
        load_corpus(name, cache_dir=tmp_path)


@pytest.mark.parametrize("text, refusal", [
    ("", "has no words"), ("\n \n", "has no words"),
    ("just a few words\n", "give at least two lines of text"),
])
def test_a_text_too_short_to_split_is_not_told_to_try_running_text_in_vain(tmp_path, text, refusal):
    """``text_mode='running'`` is suggested only where it would split the text."""
    (tmp_path / "short.txt").write_text(text)
    with pytest.raises(DataError) as info:
        load_corpus(tmp_path / "short.txt", cache_dir=tmp_path / "cache")
    assert refusal in str(info.value) and "running" not in str(info.value)
    with pytest.raises(DataError):  # where it is not suggested, running text fails too
        load_corpus(tmp_path / "short.txt", cache_dir=tmp_path / "cache", text_mode="running")


def test_user_text_file_lines(tmp_path):
    text = "".join(f"w{i % 7} w{i % 3} common\n" for i in range(20))
    path = tmp_path / "my.txt"
    path.write_text(text)
    corpus = load_corpus(path, cache_dir=tmp_path / "cache")
    assert corpus.name == "my" and corpus.test is None
    # 20 lines: the last 2 (10%) are valid; 4 tokens per line with <eos>
    assert corpus.train.numel() == 18 * 4 and corpus.valid.numel() == 2 * 4
    assert corpus.vocab.decode(corpus.valid[:4]) == ["w4", "w0", "common", "<eos>"]
    assert load_corpus(path, cache_dir=tmp_path / "cache").from_cache


def test_user_text_file_running(tmp_path):
    path = tmp_path / "run.txt"
    path.write_text(" ".join(f"x{i}" for i in range(100)) + "\nmore words\n")
    corpus = load_corpus(path, cache_dir=tmp_path / "cache", text_mode="running", valid_fraction=0.2)
    assert corpus.vocab.eos_id is None
    assert corpus.train.numel() + corpus.valid.numel() == 102  # newlines are plain whitespace
    assert 15 < corpus.valid.numel() < 30
    train = corpus.vocab.decode(corpus.train)
    assert train[:2] == ["x0", "x1"] and "<unk>" not in train
    # every word is new in valid: the vocabulary comes from train only
    assert set(corpus.vocab.decode(corpus.valid)) == {"<unk>"}


def test_user_text_folder(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.train.txt").write_text("a b c\na b\n")
    (tmp_path / "c" / "a.dev.txt").write_text("a z\n")
    corpus = load_corpus(tmp_path / "c", cache_dir=tmp_path / "cache")
    assert corpus.name == "c" and corpus.test is None
    assert corpus.vocab.decode(corpus.valid) == ["a", "<unk>", "<eos>"]


def test_user_text_too_short(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("just one line\n")
    with pytest.raises(DataError, match="too few"):
        load_corpus(path, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="valid_fraction"):
        load_corpus(path, cache_dir=tmp_path / "cache", valid_fraction=1.5)
    with pytest.raises(ValueError, match="text_mode"):
        load_corpus(path, cache_dir=tmp_path / "cache", text_mode="words")


def test_character_splits_cut_at_spaces(tmp_path, monkeypatch):
    """A text8-style corpus: character offsets move to the next space, a truncated tail is dropped."""
    text = b"alpha beta gamma delta epsilon zeta et"  # "et" stands for a cut-off word
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "toy.txt").write_bytes(text)
    import hashlib

    spec = CorpusSpec("toy8", "toy", (FileSpec("toy/toy.txt", hashlib.sha256(text).hexdigest(), truncated=True),),
                      train=Split("toy/toy.txt", 0, 13), valid=Split("toy/toy.txt", 13), lines=False)
    monkeypatch.setitem(CORPORA, "toy8", spec)
    corpus = load_corpus("toy8", tmp_path, cache_dir=tmp_path / "cache")
    assert corpus.vocab.decode(corpus.train) == ["alpha", "beta", "gamma"]
    assert corpus.vocab.decode(corpus.valid) == ["<unk>"] * 3  # delta epsilon zeta; "et" dropped


def test_every_known_corpus_has_a_download_location():
    for spec in CORPORA.values():
        for file in spec.files:
            assert file.sources, file.path
            assert file.sha256 is None or len(file.sha256) == 64
