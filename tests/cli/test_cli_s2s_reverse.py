"""`sohsm s2s train --dataset reverse`: an attention seq2seq learns the reverse task with the full, tree and
self-organized heads."""
import re

import pytest

#: set before measuring: a small model must reverse at least this share of held-out strings exactly
ACCURACY_THRESHOLD = 0.90

#: V = 50 symbols, 3000 training pairs (the tutorial's), a 32/64 model, 3 epochs: a few seconds per run
BUDGET = ["--dataset", "reverse", "--symbols", 50, "--emb-size", 32, "--hidden-size", 64, "--batch-size", 32,
          "--epochs", 3, "--lr", 0.01, "--eval-every", 0, "--quiet"]


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
