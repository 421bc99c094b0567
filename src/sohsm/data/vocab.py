"""Word vocabularies: ids sorted by training frequency, with ``<unk>`` for rare words.

Ids are assigned by descending training count, ties broken by first occurrence
in the training text, so the same text and options always give the same ids.
Frequency order is what the softmax heads expect: low ids are frequent words,
and :attr:`Vocabulary.counts` (aligned with ids) gives their unigram statistics.

Two special tokens:

* ``<unk>`` is always in the vocabulary. Words cut by ``min_count``/``max_size``
  map to it and its count is the sum of theirs (plus the count of literal
  ``<unk>`` tokens, as PTB and WikiText already contain them). It is ranked by
  that total like any other word; with nothing to absorb its count is 0.
* ``<eos>`` (appended per line by corpora that have lines) is never cut.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from numbers import Integral
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and numpy are imported where an array is made: listing or checking corpora needs neither
    import numpy as np
    from torch import Tensor

from sohsm.atomic_writes import write_atomic_text
from sohsm.data.errors import DataError

UNK = "<unk>"
EOS = "<eos>"
_FORMAT = "sohsm.vocab/1"


@dataclass(frozen=True)
class VocabConfig:
    """How rare words are cut.

    Attributes:
        min_count: words seen fewer times in the training text become ``<unk>``.
        max_size: at most this many entries, ``<unk>`` and ``<eos>`` included;
            ``None`` for no limit.
    """

    min_count: int = 1
    max_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_count, bool) or not isinstance(self.min_count, Integral) or self.min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {self.min_count!r}")
        if self.max_size is not None and (
            isinstance(self.max_size, bool) or not isinstance(self.max_size, Integral) or self.max_size < 2
        ):
            raise ValueError(f"max_size must be an integer >= 2 or None, got {self.max_size!r}")


class Vocabulary:
    """A word <-> id mapping with training counts.

    Build one with :meth:`from_counts` or :meth:`build`; the constructor takes
    the final, already ordered entries.

    Args:
        itos: the words, id order.
        counts: training count of each entry, aligned with ``itos``.
        unk: the unknown-word token; must be in ``itos``.
        eos: the end-of-line token, or ``None`` for running text.

    Attributes:
        itos: list of words, indexed by id.
        stoi: dict word -> id.
        counts: ``np.int64`` array ``[len(vocab)]`` of training counts.
        unk_id: id of ``<unk>``.
        eos_id: id of ``<eos>``, or ``None`` when the vocabulary has none.
    """

    def __init__(self, itos: Sequence[str], counts: Sequence[int] | np.ndarray, unk: str = UNK,
                 eos: str | None = EOS) -> None:
        import numpy as np

        self.itos: list[str] = [str(w) for w in itos]
        self.counts: np.ndarray = np.asarray(counts, dtype=np.int64).reshape(-1)
        if len(self.itos) != len(self.counts):
            raise ValueError(f"itos has {len(self.itos)} entries but counts has {len(self.counts)}")
        if (self.counts < 0).any():
            raise ValueError("counts must be non-negative")
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            dup = next(w for w, n in Counter(self.itos).items() if n > 1)
            raise ValueError(f"duplicate word {dup!r} in itos")
        if unk not in self.stoi:
            raise ValueError(f"the unknown-word token {unk!r} is not in itos")
        self.unk, self.eos = unk, eos
        self.unk_id: int = self.stoi[unk]
        self.eos_id: int | None = self.stoi.get(eos) if eos is not None else None

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 1, max_size: int | None = None,
                    unk: str = UNK, eos: str | None = EOS) -> Vocabulary:
        """Build from word counts whose iteration order is first occurrence (a ``Counter`` is).

        Args:
            counts: training count of every word.
            min_count: words with a smaller count become ``unk``; ``eos`` is kept.
            max_size: keep at most this many entries (``unk`` and ``eos`` included),
                the most frequent ones.
            unk: the unknown-word token.
            eos: the end-of-line token (protected from cutting), or ``None``.
        """
        config = VocabConfig(min_count, max_size)
        order = {w: i for i, w in enumerate(counts)}
        words = [w for w in counts if w != unk]
        words.sort(key=lambda w: (-int(counts[w]), order[w]))
        kept = [w for w in words if int(counts[w]) >= config.min_count or w == eos]
        if words and not [w for w in kept if w != eos] and [w for w in words if w != eos]:
            top = next(w for w in words if w != eos)
            raise ValueError(f"min_count={config.min_count} keeps no word of the training text in the vocabulary "
                             f"(the most frequent, {top!r}, occurs {int(counts[top]):,} times): use a min_count "
                             f"of at most {int(counts[top]):,}")
        if config.max_size is not None and len(kept) > config.max_size - 1:  # room for unk
            capacity = config.max_size - 1
            if eos is not None and eos in kept[capacity:]:  # cut: kept in the last place
                kept = kept[: capacity - 1] + [eos]
            else:
                kept = kept[:capacity]
        kept_set = set(kept)
        unk_count = int(counts.get(unk, 0)) + sum(int(c) for w, c in counts.items() if w != unk and w not in kept_set)
        unk_rank = order.get(unk, len(order))
        entries = [(w, int(counts[w]), order[w]) for w in kept] + [(unk, unk_count, unk_rank)]
        entries.sort(key=lambda e: (-e[1], e[2]))
        return cls([e[0] for e in entries], [e[1] for e in entries], unk=unk, eos=eos)

    @classmethod
    def build(cls, tokens: Iterable[str], min_count: int = 1, max_size: int | None = None,
              unk: str = UNK, eos: str | None = EOS) -> Vocabulary:
        """Count ``tokens`` and build with :meth:`from_counts`.

        Example::

            >>> vocab = Vocabulary.build("the cat saw the dog <eos>".split(), min_count=2)
            >>> vocab.itos, vocab.counts.tolist()
            (['<unk>', 'the', '<eos>'], [3, 2, 1])
            >>> vocab.encode("the bird").tolist()
            [1, 0]
        """
        return cls.from_counts(Counter(tokens), min_count=min_count, max_size=max_size, unk=unk, eos=eos)

    # -- lookups --------------------------------------------------------------------
    @property
    def unseen(self) -> int:
        """How many entries the training split never shows (count 0: a tokenizer's rows the corpus does not use)."""
        return int((self.counts == 0).sum())

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def __getitem__(self, word: str) -> int:
        """The id of ``word``; ``unk_id`` for a word not in the vocabulary."""
        return self.stoi.get(word, self.unk_id)

    def __eq__(self, other: object) -> bool:
        import numpy as np

        return (isinstance(other, Vocabulary) and self.itos == other.itos and self.unk == other.unk
                and self.eos == other.eos and np.array_equal(self.counts, other.counts))

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, tokens={int(self.counts.sum())}, unk={self.unk!r}, eos={self.eos!r})"

    def encode_numpy(self, words: Sequence[str]) -> np.ndarray:
        """Ids of ``words`` as an ``np.int64`` array; unknown words get ``unk_id``."""
        import numpy as np

        return np.fromiter(map(self.stoi.get, words, repeat(self.unk_id)), dtype=np.int64, count=len(words))

    def encode(self, words: Iterable[str] | str) -> Tensor:
        """Ids of ``words`` as a LongTensor; a string is split on whitespace first."""
        if isinstance(words, str):
            words = words.split()
        elif not isinstance(words, Sequence):
            words = list(words)
        import torch

        return torch.from_numpy(self.encode_numpy(words))

    def decode(self, ids: Tensor | np.ndarray | Iterable[int]) -> list[str]:
        """Words of ``ids`` (any iterable of ints, tensor or array of any shape, flattened)."""
        torch = sys.modules.get("torch")  # a tensor exists only where torch was imported
        if torch is not None and isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        elif "numpy" in sys.modules and isinstance(ids, sys.modules["numpy"].ndarray):  # likewise an array
            ids = ids.reshape(-1).tolist()
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self.itos):
                raise ValueError(f"id {i} is out of range for a vocabulary of size {len(self.itos)}")
            out.append(self.itos[int(i)])
        return out

    # -- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict; :meth:`from_dict` reverses it."""
        return {"format": _FORMAT, "unk": self.unk, "eos": self.eos, "itos": self.itos,
                "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: Mapping) -> Vocabulary:
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise DataError("not a sohsm vocabulary (format "
                            f"{data.get('format') if isinstance(data, Mapping) else None!r},"
                            f" expected {_FORMAT!r})")
        return cls(data["itos"], data["counts"], unk=data["unk"], eos=data["eos"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the vocabulary (words, counts, specials) to a JSON file, atomically."""

        write_atomic_text(path, json.dumps(self.to_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocabulary:
        """Read a file written by :meth:`save`.

        Raises:
            DataError: the file is not valid JSON or not a vocabulary file.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except ValueError as error:
            raise DataError(f"{path}: not a vocabulary JSON file ({error})") from None
        return cls.from_dict(data)


def vocabulary_difference(saved: Vocabulary, now: Vocabulary) -> str:
    """What tells two vocabularies apart, for a message: their sizes, the first word, or a count."""
    if len(saved) != len(now):
        return f"{len(saved):,} words in the checkpoint, {len(now):,} now"
    for i, (a, b) in enumerate(zip(saved.itos, now.itos)):
        if a != b:
            return f"both have {len(saved):,} words, but word {i:,} is {a!r} in the checkpoint and {b!r} now"
    for word, a, b in zip(saved.itos, saved.counts.tolist(), now.counts.tolist()):
        if a != b:
            return f"the same {len(saved):,} words, but {word!r} was seen {a:,} times then and {b:,} times now"
    return f"the same {len(saved):,} words and counts, but other special tokens"


def ordered_vocabulary(ids: dict[str, int], train_ids: np.ndarray, lines: bool) -> tuple[Vocabulary, np.ndarray]:
    """The vocabulary of a tokenizer's tokens (``ids``: token -> the tokenizer's id) by their count in
    ``train_ids``, ties by the tokenizer's id, and the map of the tokenizer's ids to the vocabulary's."""
    import numpy as np

    span = max(ids.values()) + 1
    counts = np.bincount(train_ids, minlength=span)[:span] if train_ids.size else np.zeros(span, np.int64)
    order = sorted(ids.items(), key=lambda item: (-int(counts[item[1]]), item[1]))
    vocab = Vocabulary([token for token, _ in order], [int(counts[i]) for _, i in order], unk=UNK,
                       eos=EOS if lines else None)
    to_vocab = np.full(span, vocab.unk_id, dtype=np.int64)
    to_vocab[[i for _, i in order]] = np.arange(len(order))
    return vocab, to_vocab
