"""Inputs that would train on nothing or read forever are refused in one line."""
from __future__ import annotations

import os

import pytest

from sohsm.data import DataError, load_corpus
from sohsm.data.vocab import Vocabulary


def test_a_min_count_above_every_count_is_refused_naming_the_largest_that_keeps_a_word():
    with pytest.raises(ValueError, match=r"^min_count=100000000 keeps no word .* 'b', occurs 3 times\): "
                                         r"use a min_count of at most 3$"):
        Vocabulary.from_counts({"a": 2, "b": 3, "<eos>": 9}, min_count=100_000_000)
    assert len(Vocabulary.from_counts({"a": 2, "b": 3, "<eos>": 9}, min_count=3)) == 3  # b, <eos>, <unk>


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
def test_a_device_is_not_read_as_a_corpus(tmp_path):
    with pytest.raises(DataError, match="^/dev/zero: not a regular file or a folder"):
        load_corpus("/dev/zero", cache_dir=tmp_path)
