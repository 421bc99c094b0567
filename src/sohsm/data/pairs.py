"""Aligned text pairs for headline generation (Rush et al. 2015 format), their vocabulary and batches.

An article file and a title file hold one sentence per line, line ``i`` of one
aligned with line ``i`` of the other; evaluation sets hold an input file and one
or more reference files. Every line must hold a word: an empty line is
refused, since it would silently shift or blank a pair.

The vocabulary is built on the training titles exactly as ``sohsm lm train``
builds one on a text file of them (an ``<eos>`` after each line, words by
frequency), so a language model trained on the titles shares its word ids and
can lend its clusters to the summariser. The summariser's input side adds two
symbols after the output words, which the head never scores::

    ids 0 .. N-1   the output words (<unk> and <eos> among them)     -> the head's N classes
    id  N          <pad>   fills a batch's shorter sequences          (never a target)
    id  N + 1      <s>     the decoder's first input                  (never a target)

A batch (:class:`PairBatch`) is time-first: ``source [S, B]``, ``target_in [T, B]``
(``<s>`` then the title) and ``target_out [T, B]`` (the title then ``<eos>``), padded with ``<pad>``.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # torch is imported where a batch is made, so that checking the data files needs no torch
    import torch
    from torch import Tensor

from sohsm.atomic_writes import write_atomic_text
from sohsm.data.errors import DataError
from sohsm.data.vocab import EOS, UNK, Vocabulary

PAD = "<pad>"
BOS = "<s>"


@dataclass
class Pairs:
    """Tokenised aligned sentences.

    Attributes:
        sources: the articles, each a list of words.
        targets: the titles (for training data), or ``None`` (inputs to decode).
        files: the files read, for messages and signatures.
    """

    sources: list[list[str]]
    targets: list[list[str]] | None
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.sources)

    def __add__(self, other: Pairs) -> Pairs:
        if (self.targets is None) != (other.targets is None):
            raise ValueError("cannot join pairs with titles to inputs without")
        targets = None if self.targets is None or other.targets is None else self.targets + other.targets
        return Pairs(self.sources + other.sources, targets, self.files + other.files)

    def select(self, keep: Sequence[bool]) -> Pairs:
        """The pairs where ``keep`` is true."""
        sources = [s for s, k in zip(self.sources, keep) if k]
        targets = None if self.targets is None else [t for t, k in zip(self.targets, keep) if k]
        return Pairs(sources, targets, self.files)


def read_lines(path: str | os.PathLike[str], unk_alias: str | None = None,
               allow_empty: bool = False) -> list[list[str]]:
    """The words of each line of a utf-8 file; ``unk_alias`` (the test set's ``UNK``) is read as ``<unk>``.

    ``allow_empty``: an empty line is an empty sentence (a decoder's empty headline), not an error.

    Raises:
        DataError: the file is missing or not utf-8, is empty, or has an empty line (naming it).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: a folder, not a text file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not utf-8 text ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    if not rows:
        raise DataError(f"{path}: the file is empty")
    out = []
    for number, row in enumerate(rows, 1):
        words = row.split()
        if not words and not allow_empty:
            raise DataError(f"{path}: line {number:,} is empty (every line must hold a sentence)")
        out.append([UNK if w == unk_alias else w for w in words] if unk_alias else words)
    return out


def read_pairs(source: str | os.PathLike[str], target: str | os.PathLike[str] | None,
               unk_alias: str | None = None) -> Pairs:
    """Aligned articles and titles (``target=None``: articles alone, to decode).

    Raises:
        DataError: a file is unreadable or has an empty line, or the two differ in line count.
    """
    sources = read_lines(source, unk_alias)
    if target is None:
        return Pairs(sources, None, (str(source),))
    targets = read_lines(target, unk_alias)
    check_aligned(source, len(sources), target, len(targets))
    return Pairs(sources, targets, (str(source), str(target)))


def check_aligned(first: str | os.PathLike[str], n_first: int, second: str | os.PathLike[str], n_second: int) -> None:
    """Refuse two files that should be aligned line by line but differ in length.

    Raises:
        DataError: naming both files and their line counts.
    """
    if n_first != n_second:
        raise DataError(f"{second} has {n_second:,} lines but {first} has {n_first:,}; "
                        "aligned files need one line per pair")


def drop_overlap(pairs: Pairs, *held_out: Pairs) -> tuple[Pairs, int]:
    """``pairs`` without those whose article occurs in any of ``held_out``; and how many were dropped.

    Articles are compared word for word (``UNK`` already read as ``<unk>``).
    """
    seen = {tuple(s) for other in held_out for s in other.sources}
    keep = [tuple(s) not in seen for s in pairs.sources]
    return pairs.select(keep), keep.count(False)


# -- vocabulary ----------------------------------------------------------------------------------
def build_title_vocab(titles: Sequence[Sequence[str]], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
    """The output vocabulary: the training titles' words with an ``<eos>`` per title.

    The same words, ids and counts as ``sohsm lm train`` gives a file of these titles.
    """
    counter: Counter[str] = Counter()
    for title in titles:
        counter.update(title)
        counter[EOS] += 1
    return Vocabulary.from_counts(counter, min_count, max_size, unk=UNK, eos=EOS)


def pad_id(vocab: Vocabulary) -> int:
    """Id of ``<pad>`` on the input side: the first after the output words."""
    return len(vocab)


def bos_id(vocab: Vocabulary) -> int:
    """Id of ``<s>``, the decoder's first input."""
    return len(vocab) + 1


def input_size(vocab: Vocabulary) -> int:
    """Rows of the input embedding: the output words, ``<pad>`` and ``<s>``."""
    return len(vocab) + 2


def encode(sentences: Sequence[Sequence[str]], vocab: Vocabulary) -> list[np.ndarray]:
    """Word ids of each sentence (unknown words as ``<unk>``)."""
    return [vocab.encode_numpy(list(s)) for s in sentences]


# -- batches ---------------------------------------------------------------------------------------
class PairBatch(NamedTuple):
    """A padded, time-first batch.

    Attributes:
        source: ``[S, B]`` article ids, ``<pad>`` after each article's end.
        source_lengths: ``[B]`` words per article.
        target_in: ``[T, B]`` decoder inputs, ``<s>`` then the title (``None`` for inputs alone).
        target_out: ``[T, B]`` decoder targets, the title then ``<eos>`` (``None`` for inputs alone).
    """

    source: Tensor
    source_lengths: Tensor
    target_in: Tensor | None
    target_out: Tensor | None


def pad(sequences: Sequence[np.ndarray], value: int) -> Tensor:
    """``[max length, B]`` long tensor of the sequences, each column padded with ``value``."""
    out = np.full((max(len(s) for s in sequences), len(sequences)), value, dtype=np.int64)
    for j, s in enumerate(sequences):
        out[: len(s), j] = s
    import torch

    return torch.from_numpy(out)


def make_batch(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray] | None, vocab: Vocabulary,
               device: torch.device | str | None = None) -> PairBatch:
    """Pad encoded articles (and titles) into a :class:`PairBatch` on ``device``."""
    import torch

    p = pad_id(vocab)
    source = pad(sources, p)
    lengths = torch.tensor([len(s) for s in sources], dtype=torch.long)
    target_in = target_out = None
    if targets is not None:
        target_in = pad([np.concatenate([[bos_id(vocab)], t]) for t in targets], p)
        target_out = pad([np.concatenate([t, [vocab.eos_id]]) for t in targets], p)
    if device is not None:
        source, lengths = source.to(device), lengths.to(device)
        target_in = None if target_in is None else target_in.to(device)
        target_out = None if target_out is None else target_out.to(device)
    return PairBatch(source, lengths, target_in, target_out)


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The pair indices of each batch of an epoch: a shuffle drawn from ``(seed, epoch)``, then cut.

    The same seed and epoch always give the same batches, so a run resumed
    mid-epoch reads the batches an uninterrupted one would. The last batch may be smaller.
    """
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=generator).numpy()
    return [order[i: i + batch_size] for i in range(0, n, batch_size)]


def write_lines(path: str | os.PathLike[str], sentences: Sequence[Sequence[str]]) -> None:
    """One sentence per line, words joined by spaces, written atomically."""

    write_atomic_text(path, "".join(" ".join(s) + "\n" for s in sentences))
