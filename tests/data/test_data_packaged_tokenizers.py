"""Packaged tokenizers (sohsm.data.packaged_tokenizers): Llama 3's and o200k's whole vocabularies as rows, read
offline from the quicktok-v1 wheel; the text comes back from the ids, and a run's tokenizer.json gives them back."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from sohsm.data import DataError, load_corpus
from sohsm.data.subwords import Subwords

quicktok = pytest.importorskip("quicktok")

from sohsm.data.packaged_tokenizers import PackagedSubwords  # noqa: E402

LINES = ["the cat sat on the mat", "", "a dog saw the <unk> cat , über alles", "the  cat\tran  away"] * 20
SIZES = {"llama3": 128_256, "o200k": 200_019}


@pytest.fixture
def lines_file(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (folder / "valid.txt").write_text("the cat saw a mat\nthe dog ran 日本\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("name", sorted(SIZES))
def test_every_id_of_the_tokenizer_is_a_row_ordered_by_training_count(name, lines_file, tmp_path):
    corpus = load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer=name)
    vocab = corpus.vocab
    assert len(vocab) == len(corpus.tokenizer) == SIZES[name]
    assert len(set(vocab.itos)) == len(vocab.itos)
    assert np.all(np.diff(vocab.counts) <= 0) and vocab.counts.sum() == corpus.train.numel()
    # <eos> is the tokenizer's end-of-text row, after every line; <unk> a row no text produces
    assert vocab.eos == "<eos>" and int((corpus.valid == vocab.eos_id).sum()) == 2
    assert vocab.counts[vocab.unk_id] == 0
    # the words and bytes are those of the text, whatever cuts it
    words = load_corpus(lines_file, cache_dir=tmp_path / "cache")
    assert corpus.words == words.words and corpus.text_bytes == words.text_bytes
    # the ids are the package's own, read with a space before each line
    enc = quicktok.get_encoding("llama3" if name == "llama3" else "o200k_base")
    ids = corpus.tokenizer.token_ids(vocab.itos[i] for i in corpus.valid[:-1].tolist() if i != vocab.eos_id)
    assert ids == enc.encode_ordinary(" the cat saw a mat") + enc.encode_ordinary(" the dog ran 日本")
    # the text comes back from the tokens, <unk> as the characters WikiText writes
    text = corpus.tokenizer.decode([vocab.itos[i] for i in corpus.valid.tolist()])
    assert text == "the cat saw a mat\nthe dog ran 日本\n"
    assert corpus.tokenizer.tokens("<unk>") != ["<unk>"]
    again = load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer=name)
    assert again.from_cache and torch_equal(again.train, corpus.train)


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_token_names_are_the_byte_level_ones_and_read_as_text():
    subwords = PackagedSubwords("llama3")
    assert subwords.tokens("the cat") == ["Ġthe", "Ġcat"]
    assert subwords.readable("Ġthe") == " the" and subwords.readable("<eos>") == "<eos>"
    o200k = PackagedSubwords("o200k")
    assert o200k.token_ids(["<|unused_200000|>"]) == [200000]  # an id o200k leaves unassigned is still a row


def test_a_run_file_gives_the_same_tokenizer_back_and_a_changed_vocabulary_is_refused(tmp_path):
    subwords = PackagedSubwords("o200k")
    path = tmp_path / "tokenizer.json"
    subwords.save(path)
    back = Subwords.from_file(path)
    assert isinstance(back, PackagedSubwords) and back.digest == subwords.digest and back.name == "o200k"
    record = json.loads(path.read_text())
    record["vocab_sha256"] = "0" * 64
    path.write_text(json.dumps(record, indent=1))
    with pytest.raises(DataError, match="vocabulary file differs"):
        Subwords.from_file(path)


def test_without_the_package_the_message_says_what_to_install(lines_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "quicktok", None)  # import quicktok raises ImportError
    with pytest.raises(ValueError, match=r"need the quicktok-v1 package: pip install 'sohsm\[tokenizers\]'"):
        load_corpus(lines_file, cache_dir=tmp_path / "cache", tokenizer="llama3")
