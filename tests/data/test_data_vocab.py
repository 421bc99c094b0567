"""Vocabulary: frequency order, <unk>/<eos> handling, min_count and max_size, persistence."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sohsm.data import DataError, VocabConfig, Vocabulary
from sohsm.data.vocab import vocabulary_difference as _vocabulary_difference

TOKENS = "b a c a b a d <eos> e a b <eos>".split()  # a:4 b:3 <eos>:2 c:1 d:1 e:1


def test_frequency_order_and_ties_by_first_occurrence():
    vocab = Vocabulary.build(TOKENS)
    assert vocab.itos == ["a", "b", "<eos>", "c", "d", "e", "<unk>"]
    assert vocab.counts.dtype == np.int64
    assert vocab.counts.tolist() == [4, 3, 2, 1, 1, 1, 0]
    assert vocab.stoi["c"] == 3 and vocab.unk_id == 6 and vocab.eos_id == 2
    assert Vocabulary.build(TOKENS) == vocab  # deterministic


def test_min_count_maps_rare_words_to_unk():
    vocab = Vocabulary.build(TOKENS, min_count=2)
    # c, d, e (1 each) fold into <unk> (3), which is ranked by that total
    assert vocab.itos == ["a", "b", "<unk>", "<eos>"]
    assert vocab.counts.tolist() == [4, 3, 3, 2]
    assert vocab.counts.sum() == len(TOKENS)
    assert vocab.encode("a c zzz").tolist() == [0, 2, 2]


def test_eos_survives_min_count():
    vocab = Vocabulary.build(TOKENS, min_count=3)
    assert "<eos>" in vocab and "b" in vocab and "c" not in vocab


def test_max_size_counts_specials_and_keeps_eos():
    vocab = Vocabulary.build(TOKENS, max_size=3)
    assert len(vocab) == 3
    assert set(vocab.itos) == {"a", "<eos>", "<unk>"}
    assert vocab.counts.sum() == len(TOKENS)
    assert len(Vocabulary.build(TOKENS, max_size=5)) == 5


def test_existing_unk_tokens_are_counted():
    vocab = Vocabulary.build("x <unk> y <unk> x".split())
    assert vocab.itos[:2] == ["x", "<unk>"] and vocab.counts[:2].tolist() == [2, 2]


def test_running_text_has_no_eos():
    vocab = Vocabulary.build("a b a".split(), eos=None)
    assert vocab.eos_id is None and len(vocab) == 3


def test_encode_decode_roundtrip():
    vocab = Vocabulary.build(TOKENS)
    ids = vocab.encode(["a", "e", "<eos>"])
    assert ids.dtype == torch.int64
    assert vocab.decode(ids) == ["a", "e", "<eos>"]
    assert vocab.decode(np.array([[0], [1]])) == ["a", "b"]
    assert vocab["never-seen"] == vocab.unk_id
    with pytest.raises(ValueError, match="out of range"):
        vocab.decode([99])


def test_save_load(tmp_path):
    vocab = Vocabulary.build(TOKENS, min_count=2)
    vocab.save(tmp_path / "v.json")
    loaded = Vocabulary.load(tmp_path / "v.json")
    assert loaded == vocab and loaded.unk_id == vocab.unk_id and loaded.eos_id == vocab.eos_id
    (tmp_path / "bad.json").write_text('{"itos": []}')
    with pytest.raises(DataError, match="not a sohsm vocabulary"):
        Vocabulary.load(tmp_path / "bad.json")


@pytest.mark.parametrize("kwargs, message", [
    ({"min_count": 0}, "min_count must be an integer >= 1, got 0"),
    ({"min_count": 2.5}, "min_count"),
    ({"max_size": 1}, "max_size must be an integer >= 2 or None, got 1"),
])
def test_bad_options_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VocabConfig(**kwargs)
    with pytest.raises(ValueError, match=message):
        Vocabulary.build(TOKENS, **kwargs)


def test_vocabularies_of_one_size_are_told_apart_by_a_word_or_a_count():
    a = Vocabulary(["<unk>", "the", "cat"], [0, 5, 2])
    assert "word 2 is 'cat' in the checkpoint and 'dog' now" in _vocabulary_difference(
        a, Vocabulary(["<unk>", "the", "dog"], [0, 5, 2]))
    assert "'the' was seen 5 times then and 6 times now" in _vocabulary_difference(
        a, Vocabulary(["<unk>", "the", "cat"], [0, 6, 2]))
    assert "3 words in the checkpoint, 2 now" in _vocabulary_difference(a, Vocabulary(["<unk>", "the"], [0, 5]))
