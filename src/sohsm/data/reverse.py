"""The reverse task: a synthetic sequence-to-sequence problem with a vocabulary of any size.

A source is 1 to 5 symbols drawn uniformly from an alphabet of ``V`` symbols
(``s0 .. s{V-1}``); its target is the same symbols in reverse order::

    source  s17 s3 s912        ->   target  s912 s3 s17 <eos>

The pairs follow from a seed alone, so a run is reproduced exactly, and ``V``
sets the size of the output layer (the experiment of the hierarchical-softmax
seq2seq tutorial, with V = 1k, 10k, 100k). The output vocabulary holds every
symbol, seen in training or not, so held-out strings never meet ``<unk>``.
"""
from __future__ import annotations

from collections import Counter

import torch

from sohsm.data.headlines import TrainingPairs
from sohsm.data.pairs import Pairs
from sohsm.data.vocab import EOS, UNK, Vocabulary

#: the shortest and longest source
MIN_LENGTH, MAX_LENGTH = 1, 5


def symbol(i: int) -> str:
    """The name of symbol ``i``."""
    return f"s{i}"


def reverse_pairs(n: int, symbols: int, generator: torch.Generator) -> Pairs:
    """``n`` pairs of 1-5 random symbols and their reversal, drawn from ``generator``."""
    if n < 1 or symbols < 2:
        raise ValueError(f"the reverse task needs n >= 1 pairs and symbols >= 2, got n={n}, symbols={symbols}")
    lengths = torch.randint(MIN_LENGTH, MAX_LENGTH + 1, (n,), generator=generator).tolist()
    ids = torch.randint(0, symbols, (sum(lengths),), generator=generator).tolist()
    sources, at = [], 0
    for length in lengths:
        sources.append([symbol(i) for i in ids[at: at + length]])
        at += length
    return Pairs(sources, [list(reversed(s)) for s in sources], (f"reverse:{symbols}",))


def reverse_data(symbols: int, train: int, valid: int, seed: int) -> TrainingPairs:
    """Training and held-out pairs of the reverse task; held-out sources never occur in training.

    Raises:
        ValueError: sizes below 1, or fewer than 2 symbols.
    """
    generator = torch.Generator().manual_seed(seed)
    train_pairs = reverse_pairs(train, symbols, generator)
    seen = {tuple(s) for s in train_pairs.sources}
    held_out = Pairs([], [], train_pairs.files)
    for _ in range(100):  # held-out strings are new strings
        if len(held_out) >= valid:
            break
        more = reverse_pairs(max(valid, 16), symbols, generator)
        keep = [tuple(s) not in seen for s in more.sources]
        held_out = held_out + more.select(keep)
    else:
        raise ValueError(f"{symbols} symbols give too few strings to hold out {valid} unseen after {train} training "
                         "pairs")
    assert held_out.targets is not None  # reversed strings are their titles
    return TrainingPairs(train_pairs, Pairs(held_out.sources[:valid], held_out.targets[:valid], held_out.files))


def reverse_vocab(symbols: int, targets: list[list[str]]) -> Vocabulary:
    """Every symbol, ``<eos>`` and ``<unk>``, most frequent in ``targets`` first (ties: by symbol id)."""
    counts = Counter(w for t in targets for w in t)
    counts[EOS] = len(targets)
    words = [EOS] + [symbol(i) for i in range(symbols)]
    rank = {w: i for i, w in enumerate(words)}
    words.sort(key=lambda w: (-counts[w], rank[w]))
    return Vocabulary(words + [UNK], [counts[w] for w in words] + [0], unk=UNK, eos=EOS)
