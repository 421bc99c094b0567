"""The reverse task's data: pairs that follow from the seed, a vocabulary that holds every symbol."""
from sohsm.data.reverse import MAX_LENGTH, MIN_LENGTH, reverse_data, reverse_vocab


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


