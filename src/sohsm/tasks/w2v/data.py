"""word2vec's data recipe: vocabulary, sub-sampling, dynamic windows, CBOW examples and skip-gram pairs.

The corpus is one stream of word ids (words under ``min_count`` dropped, as word2vec
drops them, so windows reach over them). An epoch cuts it into pieces of
``batch_words`` corpus words; one piece is one training step::

    stream   |w0 w1 ... w999|w1000 ... w1999|...        pieces of batch_words words (word2vec: "sentences")
    piece    keep w with P(keep w) = (sqrt(f_w / t) + 1) t / f_w      t = sample * (words in the vocabulary)
    kept     |a b c d e f g ...|                         windows never cross a piece's border
    centre d draws b ~ U{1..window}; its context: the kept words within b of it
    CBOW     (context ids c b e f, their count) -> d     one row per centre word
    skip-gram (c -> d), (b -> d), (e -> d), (f -> d)     one row per (context, centre) pair

Every random number of a piece comes from a generator seeded by ``(seed, epoch,
piece)``, so the batches of an epoch are fixed and a run resumed at piece ``i``
reads the same batches an uninterrupted one would; only one piece is expanded
into examples at a time, so memory holds the id stream and one batch.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from sohsm.data.vocab import UNK, Vocabulary
from sohsm.tasks.w2v.config import ARCHITECTURES  # noqa: F401  (exported here too)
from sohsm.tasks.w2v.kernel import numba_available


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """word2vec's sub-sampling: ``P(keep w) = min(1, (sqrt(f_w / t) + 1) * t / f_w)``, ``t = sample * sum(f)``.

    ``sample = 0`` keeps every word. A word with count 0 is kept (it never occurs).

    >>> keep_probabilities(np.array([1000, 10]), 1e-2).round(3).tolist()
    [0.111, 1.0]
    """
    counts = np.asarray(counts, dtype=np.float64)
    if sample < 0:
        raise ValueError(f"sample must be >= 0, got {sample}")
    if sample == 0:
        return np.ones_like(counts)
    threshold = sample * counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = (np.sqrt(counts / threshold) + 1.0) * threshold / counts
    return np.where(counts > 0, np.minimum(keep, 1.0), 1.0)


def word2vec_vocabulary(vocab: Vocabulary, ids: np.ndarray) -> tuple[Vocabulary, np.ndarray]:
    """The vocabulary word2vec trains on and the stream in its ids: the unknown word is left out of the text.

    ``vocab`` is a corpus vocabulary whose ``<unk>`` stands for the words under ``min_count``;
    word2vec drops those words from the text instead. The result keeps every other word in
    its order and puts ``<unk>`` last with count 0 (it never occurs, so it is never a target).

    Returns:
        ``(vocabulary, stream)``: the stream ``np.int64`` without the unknown word.
    """
    ids = np.asarray(ids, dtype=np.int64)
    keep = np.arange(len(vocab)) != vocab.unk_id
    mapping = np.full(len(vocab), -1, dtype=np.int64)
    mapping[keep] = np.arange(int(keep.sum()))
    itos = [w for w, k in zip(vocab.itos, keep) if k] + [UNK]
    counts = np.concatenate([vocab.counts[keep], [0]])
    stream = mapping[ids]
    return Vocabulary(itos, counts, unk=UNK, eos=vocab.eos), stream[stream >= 0]


class W2VBatch(NamedTuple):
    """The rows of one training step.

    Attributes:
        inputs: ``[C]`` context word ids, the rows' contexts one after another (CBOW), or
            ``[B]`` one context word per row (skip-gram).
        offsets: ``[B]`` where each row's context starts in ``inputs`` (CBOW); ``None`` for skip-gram.
        counts: ``[B]`` context words per row (CBOW; ``None`` for skip-gram).
        targets: ``[B]`` the centre words.
        words: corpus words of the piece the rows come from (before sub-sampling).
    """

    inputs: Tensor
    offsets: Tensor | None
    counts: Tensor | None
    targets: Tensor
    words: int


def window_examples(kept: np.ndarray, window: int, spans: np.ndarray | None, architecture: str
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """CBOW rows or skip-gram pairs of one piece of kept words.

    Args:
        kept: ``[n]`` word ids, sub-sampling done.
        window: the largest distance.
        spans: ``[n]`` each centre's window in ``1..window`` (word2vec's dynamic window);
            ``None``: ``window`` for every centre.
        architecture: ``"cbow"`` or ``"skipgram"``.

    Returns:
        ``(inputs, offsets, counts, targets)`` as in :class:`W2VBatch` (numpy); centres
        without any context word (a piece of one word) give no row.
    """
    n = kept.shape[0]
    distance = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])  # [2W]
    position = np.arange(n)[:, None] + distance[None, :]  # [n, 2W]
    span = np.full(n, window) if spans is None else spans
    valid = (np.abs(distance)[None, :] <= span[:, None]) & (position >= 0) & (position < n)  # [n, 2W]
    if architecture == "cbow":
        counts = valid.sum(axis=1)  # [n]
        rows = counts > 0
        inputs = kept[position[valid]]  # row-major: each centre's context together, in text order
        counts = counts[rows]
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts.size else counts
        return inputs, offsets, counts, kept[rows]
    centre = np.broadcast_to(np.arange(n)[:, None], position.shape)
    return kept[position[valid]], None, None, kept[centre[valid]]


class EpochStream:
    """The batches of word2vec's training, piece by piece, from a fixed id stream.

    Args:
        stream: ``[T]`` word ids (no unknown word).
        counts: ``[N]`` training counts (for the sub-sampling).
        architecture: ``"cbow"`` or ``"skipgram"``.
        window: the largest window (each centre draws its own in ``1..window``).
        sample: sub-sampling threshold (word2vec's ``-sample``, 1e-3); 0 keeps every word.
        batch_words: corpus words per piece (= per step).
        seed: with the epoch and the piece, seeds every random draw.

    Example::

        >>> stream = EpochStream(np.arange(10) % 4, np.array([3, 3, 2, 2]), "cbow", window=2, sample=0,
        ...                      batch_words=5, seed=1)
        >>> stream.pieces, [b.words for b in stream.batches(epoch=0, start=0)]
        (2, [5, 5])
    """

    def __init__(self, stream: np.ndarray, counts: np.ndarray, architecture: str, window: int, sample: float,
                 batch_words: int, seed: int) -> None:
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if batch_words < 2:
            raise ValueError(f"batch_words must be >= 2, got {batch_words}")
        self.stream = np.asarray(stream, dtype=np.int64)
        self.keep = keep_probabilities(counts, sample)
        self.architecture, self.window, self.sample = architecture, int(window), float(sample)
        self.batch_words, self.seed = int(batch_words), int(seed)
        #: pieces (= steps) per epoch
        self.pieces = -(-self.stream.shape[0] // self.batch_words)
        #: build the rows by the compiled loop (:func:`sohsm.tasks.w2v.kernel.window_rows`) where Numba imports
        self.compiled = numba_available()

    def expected_rows(self) -> int:
        """About how many rows an epoch gives (for plans and progress bars, not exact)."""
        kept = float(self.keep[self.stream].sum())
        return int(kept if self.architecture == "cbow" else kept * (self.window + 1))

    def piece(self, epoch: int, index: int) -> W2VBatch:
        """The batch of piece ``index`` of epoch ``epoch`` (the same every time it is asked for)."""
        lo = index * self.batch_words
        words = self.stream[lo: lo + self.batch_words]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch, index])))
        kept = words[rng.random(words.shape[0]) < self.keep[words]] if self.sample > 0 else words
        spans = rng.integers(1, self.window + 1, size=len(kept))  # (1-D: len, which numpy's stubs type, not shape[0])
        if self.compiled:  # the same rows by a compiled loop (a tenth of the time)
            from sohsm.tasks.w2v.kernel import window_rows

            inputs, offsets, counts, targets = window_rows(kept, spans, self.window, self.architecture == "cbow")
        else:
            inputs, offsets, counts, targets = window_examples(kept, self.window, spans, self.architecture)
        def as_tensor(a):
            return None if a is None else torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

        return W2VBatch(as_tensor(inputs), as_tensor(offsets), as_tensor(counts), as_tensor(targets),
                        int(words.shape[0]))

    def batches(self, epoch: int, start: int):
        """``W2VBatch`` of pieces ``start, start + 1, ...`` of ``epoch`` (pieces without a row are skipped)."""
        for index in range(start, self.pieces):
            batch = self.piece(epoch, index)
            if batch.targets.numel():
                yield batch


def eval_examples(stream: np.ndarray, architecture: str, window: int, rows: int, batch_rows: int = 2048):
    """Held-out rows with the full window, no sub-sampling: the first ``rows`` of ``stream``, in batches."""
    pieces = []
    total = 0
    for lo in range(0, stream.shape[0], 1000):
        inputs, offsets, counts, targets = window_examples(np.asarray(stream[lo: lo + 1000], dtype=np.int64),
                                                           window, None, architecture)
        pieces.append((inputs, counts, targets))
        total += targets.shape[0]
        if total >= rows:
            break
    for inputs, counts, targets in pieces:
        for lo in range(0, targets.shape[0], batch_rows):
            if rows <= 0:
                return
            hi = min(targets.shape[0], lo + batch_rows, lo + rows)
            if counts is None:
                yield W2VBatch(torch.from_numpy(inputs[lo:hi]), None, None, torch.from_numpy(targets[lo:hi]), 0)
            else:
                starts = np.concatenate([[0], np.cumsum(counts)])
                part = inputs[starts[lo]: starts[hi]]
                c = counts[lo:hi]
                offsets = np.concatenate([[0], np.cumsum(c)[:-1]])
                yield W2VBatch(torch.from_numpy(part), torch.from_numpy(offsets), torch.from_numpy(c),
                               torch.from_numpy(targets[lo:hi]), 0)
            rows -= hi - lo
