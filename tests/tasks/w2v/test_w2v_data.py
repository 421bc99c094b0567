"""word2vec's data recipe against naive references: sub-sampling, vocabulary, dynamic windows, batches."""
import numpy as np
import pytest
import torch

from sohsm.data.vocab import Vocabulary
from sohsm.tasks.w2v.data import EpochStream, eval_examples, keep_probabilities, window_examples, word2vec_vocabulary


def test_keep_probabilities_follow_word2vec_formula():
    counts = np.array([5000, 800, 40, 7, 0])
    sample = 1e-3
    t = sample * counts.sum()
    expected = [min(1.0, (np.sqrt(f / t) + 1) * t / f) if f else 1.0 for f in counts.astype(float)]
    np.testing.assert_allclose(keep_probabilities(counts, sample), expected, rtol=1e-12)
    assert keep_probabilities(counts, sample)[0] < 0.5  # a frequent word is mostly dropped
    np.testing.assert_array_equal(keep_probabilities(counts, 0.0), np.ones(5))
    with pytest.raises(ValueError, match="sample must be >= 0, got -0.1"):
        keep_probabilities(counts, -0.1)


def test_vocabulary_drops_the_unknown_word_from_the_text():
    vocab = Vocabulary(["the", "<unk>", "cat", "sat"], [5, 4, 3, 2], eos=None)
    vocab2, stream = word2vec_vocabulary(vocab, np.array([0, 1, 2, 1, 3, 0]))
    assert vocab2.itos == ["the", "cat", "sat", "<unk>"] and vocab2.counts.tolist() == [5, 3, 2, 0]
    assert vocab2.decode(stream) == ["the", "cat", "sat", "the"]


def naive_examples(kept, window, spans, architecture):
    """One row (or pair) at a time, as word2vec's loop reads them."""
    rows = []
    for i, centre in enumerate(kept):
        b = window if spans is None else spans[i]
        context = [kept[j] for j in range(i - b, i + b + 1) if j != i and 0 <= j < len(kept)]
        if architecture == "cbow":
            if context:
                rows.append((tuple(context), centre))
        else:
            rows.extend(((c,), centre) for c in context)
    return rows


@pytest.mark.parametrize("architecture", ["cbow", "skipgram"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_window_examples_match_naive_loop(architecture, dynamic):
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 40):
        kept = rng.integers(0, 50, size=n)
        spans = rng.integers(1, 4, size=n) if dynamic else None
        inputs, offsets, counts, targets = window_examples(kept, 3, spans, architecture)
        if architecture == "cbow":
            got = [(tuple(inputs[o: o + c].tolist()), t) for o, c, t in zip(offsets, counts, targets)]
        else:
            assert offsets is None and counts is None
            got = [((i,), t) for i, t in zip(inputs.tolist(), targets.tolist())]
        assert got == naive_examples(kept.tolist(), 3, None if spans is None else spans.tolist(), architecture)


@pytest.mark.skipif(not __import__("sohsm.tasks.w2v.kernel", fromlist=["x"]).numba_available(),
                    reason="numba (the w2v and dev extras) is not installed")
@pytest.mark.parametrize("architecture", ["cbow", "skipgram"])
def test_the_compiled_windows_equal_window_examples(architecture):
    """The compiled loop that builds a piece's rows gives window_examples' arrays, value for value."""
    from sohsm.tasks.w2v.kernel import window_rows

    rng = np.random.default_rng(2)
    for n in (0, 1, 2, 7, 40, 700):
        kept = rng.integers(0, 50, size=n)
        spans = rng.integers(1, 6, size=n)
        for got, expected in zip(window_rows(kept, spans, 5, architecture == "cbow"),
                                 window_examples(kept, 5, spans, architecture)):
            if expected is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.int64))
    stream = rng.integers(0, 30, size=3000)
    fast = EpochStream(stream, np.bincount(stream, minlength=30), architecture, 5, 1e-2, 500, seed=1)
    slow = EpochStream(stream, np.bincount(stream, minlength=30), architecture, 5, 1e-2, 500, seed=1)
    slow.compiled = False
    for a, b in zip(fast.batches(1, 0), slow.batches(1, 0)):
        assert all(x is y is None or torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a.words == b.words


def test_batches_are_fixed_by_seed_epoch_and_piece():
    stream = np.random.default_rng(1).integers(0, 30, size=5000)
    counts = np.bincount(stream, minlength=30)
    s = EpochStream(stream, counts, "cbow", window=5, sample=1e-2, batch_words=500, seed=3)
    assert s.pieces == 10
    a, b = s.piece(0, 4), s.piece(0, 4)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4]))
    other = s.piece(1, 4)
    assert not torch.equal(a.targets, other.targets)  # another epoch draws other words and windows
    resumed = list(s.batches(0, 4))
    assert torch.equal(resumed[0].inputs, a.inputs) and len(resumed) == 6
    assert sum(b.words for b in s.batches(0, 0)) == 5000


def test_sub_sampling_keeps_words_at_their_rate_and_windows_are_uniform():
    stream = np.random.default_rng(2).choice(4, size=200_000, p=[0.7, 0.2, 0.05, 0.05])
    counts = np.bincount(stream, minlength=4)
    s = EpochStream(stream, counts, "cbow", window=4, sample=1e-2, batch_words=200_000, seed=0)
    batch = s.piece(0, 0)
    kept = np.bincount(batch.targets.numpy(), minlength=4) / counts
    np.testing.assert_allclose(kept, keep_probabilities(counts, 1e-2), atol=0.01)
    # a centre far from the borders has 2 b context words, b uniform in 1..4: mean 5
    assert abs(batch.counts[10:-10].float().mean().item() - 5.0) < 0.05
    assert set(batch.counts[10:-10].unique().tolist()) == {2, 4, 6, 8}


def test_eval_examples_take_full_windows_and_the_first_rows():
    stream = np.arange(2500) % 97
    batches = list(eval_examples(stream, "cbow", 2, rows=1500, batch_rows=700))
    assert [b.targets.numel() for b in batches] == [700, 300, 500]
    assert batches[0].targets[:3].tolist() == [0, 1, 2] and batches[0].counts[:3].tolist() == [2, 3, 4]
    pairs = list(eval_examples(stream, "skipgram", 2, rows=10))
    assert sum(b.targets.numel() for b in pairs) == 10
