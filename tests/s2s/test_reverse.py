"""The reverse task: its pairs, and an attention seq2seq that learns it with the full, tree and self-organized heads."""
import re

import pytest

from sohsm.data.reverse import MAX_LENGTH, MIN_LENGTH, reverse_data, reverse_vocab

#: set before measuring: a small model must reverse at least this share of held-out strings exactly
ACCURACY_THRESHOLD = 0.90

#: V = 50 symbols, 3000 training pairs (the tutorial's), a 32/64 model, 3 epochs: a few seconds per run
BUDGET = ["--dataset", "reverse", "--symbols", 50, "--emb-size", 32, "--hidden-size", 64, "--batch-size", 32,
          "--epochs", 3, "--lr", 0.01, "--eval-every", 0, "--quiet"]


def test_pairs_follow_from_the_seed_and_are_reversed():
    data = reverse_data(symbols=30, train=500, valid=50, seed=3)
    again = reverse_data(symbols=30, train=500, valid=50, seed=3)
    assert data.train.sources == again.train.sources and data.valid.sources == again.valid.sources
    assert data.train.sources != reverse_data(symbols=30, train=500, valid=50, seed=4).train.sources
    assert all(t == s[::-1] for s, t in zip(data.train.sources, data.train.targets))
    lengths = {len(s) for s in data.train.sources}
    assert lengths == set(range(MIN_LENGTH, MAX_LENGTH + 1))
    seen = {tuple(s) for s in data.train.sources}
    assert len(data.valid) == 50 and not any(tuple(s) in seen for s in data.valid.sources)  # held out: unseen


def test_the_vocabulary_holds_every_symbol():
    data = reverse_data(symbols=2000, train=100, valid=10, seed=0)  # most symbols never seen in training
    vocab = reverse_vocab(2000, data.train.targets)
    assert len(vocab) == 2002 and "s1999" in vocab and vocab.itos[0] == "<eos>"
    assert all(w in vocab for s in data.valid.sources for w in s)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("head", ["full", "tree_random", "tree", "self_organized"])
def test_a_small_model_learns_to_reverse(head, seed, cli, tmp_path):
    code, out, err = cli("s2s", "train", *BUDGET, "--head", head, "--seed", seed, "--run-dir", tmp_path / "run")
    assert code == 0, err
    accuracy = float(re.search(r"accuracy\s+([\d.]+)% of 200 held-out", out).group(1)) / 100
    assert accuracy >= ACCURACY_THRESHOLD, out
    assert "decode " not in out  # no headline decoding hint for a synthetic task


def test_bad_reverse_options_are_refused(cli, tmp_path):
    code, _, err = cli("s2s", "train", "--dataset", "reverse", "--symbols", 1, "--head", "full",
                       "--run-dir", tmp_path / "run", "--quiet")
    assert code == 2 and "--symbols" in err and "2" in err and not (tmp_path / "run").exists()
