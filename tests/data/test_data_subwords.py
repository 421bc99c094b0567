"""Subword vocabularies (sohsm.data.subwords): a byte-level BPE trained on the training split, or a tokenizer file;
the words and bytes every split records, for per-word perplexity and bits per byte."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from sohsm.data import DataError, load_corpus
from sohsm.data.errors import DataFieldError
from sohsm.data.subwords import MIN_BPE_SIZE, Subwords, bpe_size
from sohsm.fields import FieldError

pytest.importorskip("tokenizers")

LINES = ["the cat sat on the mat", "", "a dog saw the <unk> cat", "the  cat\tran  away"] * 30


@pytest.fixture
def lines_file(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (folder / "valid.txt").write_text("the cat saw a mat\nthe dog ran\n", encoding="utf-8")
    return folder


def test_words_and_bytes_of_a_split_follow_the_stated_convention(lines_file, tmp_path):
    corpus = load_corpus(lines_file, cache_dir=tmp_path / "cache")
    # words: whitespace-separated words plus one <eos> per line; bytes: words joined by one space, a newline a line
    assert corpus.words == {"train": 16 * 30 + 4 * 30, "valid": 8 + 2}
    normalised = "".join(" ".join(line.split()) + "\n" for line in LINES)
    assert corpus.text_bytes == {"train": len(normalised.encode("utf-8")),
                                 "valid": len(b"the cat saw a mat\nthe dog ran\n")}
    assert corpus.words["train"] == corpus.train.numel()  # words are a word vocabulary's tokens
    again = load_corpus(lines_file, cache_dir=tmp_path / "cache")
    assert again.from_cache and again.words == corpus.words and again.text_bytes == corpus.text_bytes


def test_running_text_bytes_count_a_space_after_every_word(tmp_path):
    path = tmp_path / "running.txt"
    words = ("über alles the cat sat " * 200).split()
    path.write_text(" ".join(words), encoding="utf-8")
    corpus = load_corpus(path, cache_dir=tmp_path / "cache", text_mode="running")
    assert corpus.words["train"] + corpus.words["valid"] == len(words)
    assert corpus.text_bytes["train"] + corpus.text_bytes["valid"] == sum(len(w.encode()) + 1 for w in words)


def test_bpe_trains_on_the_training_split_and_orders_tokens_by_count(lines_file, tmp_path):
    corpus = load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer="bpe:300")
    vocab, subwords = corpus.vocab, corpus.tokenizer
    assert isinstance(subwords, Subwords) and len(vocab) == len(subwords) <= 300
    assert np.all(np.diff(vocab.counts) <= 0)  # frequency order: low ids are frequent
    assert vocab.eos == "<eos>" and vocab.unk == "<unk>"
    assert vocab.counts.sum() == corpus.train.numel()
    # the words and bytes are those of the text, whatever cuts it
    words = load_corpus(lines_file, cache_dir=tmp_path / "cache")
    assert corpus.words == words.words and corpus.text_bytes == words.text_bytes
    # <eos> after every line, and the text comes back from the tokens
    assert int((corpus.valid == vocab.eos_id).sum()) == 2
    assert subwords.decode(vocab.decode(corpus.valid)) == "the cat saw a mat\nthe dog ran\n"
    assert "tokenizer=" + subwords.digest in corpus.signature and "min_count" not in corpus.signature


def test_unk_in_the_text_is_one_token_and_decodes_with_its_space(lines_file, tmp_path):
    corpus = load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer="bpe:300")
    tokens = corpus.tokenizer.tokens("a dog saw the <unk> cat")
    assert tokens.count("<unk>") == 1 and "Ġ" not in tokens
    assert corpus.tokenizer.decode(tokens) == "a dog saw the <unk> cat"
    assert corpus.tokenizer.readable("Ġthe") == " the"


def test_a_tokenizer_file_gives_the_same_ids_and_the_cache_never_mixes_vocabularies(lines_file, tmp_path):
    cache = tmp_path / "cache"
    trained = load_corpus(lines_file, cache_dir=cache, tokenizer="bpe:300")
    trained.tokenizer.save(tmp_path / "tokenizer.json")
    from_file = load_corpus(lines_file, cache_dir=cache, tokenizer=str(tmp_path / "tokenizer.json"))
    assert from_file.from_cache  # the same tokenizer: the same entry
    assert from_file.vocab == trained.vocab and from_file.train.equal(trained.train)
    words = load_corpus(lines_file, cache_dir=cache)
    other = load_corpus(lines_file, cache_dir=cache, tokenizer="bpe:270")
    entries = {c.cache_path for c in (trained, words, other)}
    assert len(entries) == 3 and not words.from_cache and not other.from_cache
    assert words.tokenizer is None and len(words.vocab) < len(trained.vocab)
    # a trained BPE is cached too: the second load reads it
    assert len(list((cache / "tokenizers").iterdir())) == 2


def test_a_tokenizer_file_without_specials_gets_them(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    bare = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    bare.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    bare.save(str(tmp_path / "bare.json"))
    subwords = Subwords.from_file(tmp_path / "bare.json")
    assert len(subwords) == 5 and subwords.token_ids(["<unk>", "<eos>"]) == [3, 4]


def test_running_text_reads_subwords_without_eos(tmp_path):
    path = tmp_path / "running.txt"
    path.write_text(("the cat sat on the mat " * 100).strip(), encoding="utf-8")
    corpus = load_corpus(path, cache_dir=tmp_path / "cache", text_mode="running", tokenizer="bpe:270")
    assert corpus.vocab.eos is None and corpus.vocab.eos_id is None
    eos = corpus.vocab.stoi["<eos>"]
    assert not (corpus.train == eos).any() and corpus.vocab.counts[eos] == 0
    assert corpus.tokenizer.decode(corpus.vocab.decode(corpus.train[:6])).split()[:2] == ["the", "cat"]


@pytest.mark.parametrize("value", ["bpe:", "bpe:x", "bpe:-3", f"bpe:{MIN_BPE_SIZE - 1}"])
def test_bad_bpe_sizes_are_refused_naming_the_setting(value):
    with pytest.raises(DataFieldError, match=r"tokenizer=.*SIZE must be an integer >= 258"):
        bpe_size(value)
    assert bpe_size(f"bpe:{MIN_BPE_SIZE}") == MIN_BPE_SIZE and bpe_size("my/tokenizer.json") is None


def test_a_missing_tokenizer_file_or_a_cut_beside_a_tokenizer_is_refused(lines_file, tmp_path):
    with pytest.raises(DataFieldError, match="neither bpe:SIZE .* nor an existing tokenizer file"):
        load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer=str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not a tokenizer file"):
        load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer=str(tmp_path / "bad.json"))
    with pytest.raises(FieldError, match="min_count cuts rare words"):
        load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer="bpe:300", min_count=2)


def test_without_tokenizers_the_error_says_what_to_install(lines_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'sohsm\[hf\]'"):
        load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer="bpe:300")
