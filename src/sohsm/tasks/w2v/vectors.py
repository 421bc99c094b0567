"""A run's word vectors: load, export in word2vec's formats, neighbours, analogies and word similarity.

* :func:`load_vectors`: the input vectors of a ``sohsm w2v train`` run (what word2vec exports).
* :func:`save_word2vec`: word2vec's text format (``N d`` then ``word v1 ... vd`` per line) or its
  binary format (``N d\\n`` then ``word`` + space + ``d`` little-endian float32 + ``\\n``), as
  ``gensim.models.KeyedVectors.load_word2vec_format`` reads them.
* :func:`analogy_accuracy`: questions-words.txt (``: section`` lines, then ``a b c d`` lines), answered
  by 3CosAdd (``argmax_x cos(x, b - a + c)`` over unit vectors, the three question words left out),
  on the questions whose four words are all in the vocabulary; coverage says how many those are.
* :func:`similarity_correlation`: Spearman's rho between human scores of word pairs (WordSim-353's
  ``word1<TAB>word2<TAB>score`` lines, ``#`` comments) and the vectors' cosines, on the pairs in the vocabulary.

Words are compared lower-cased, as gensim's evaluations do by default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sohsm.heads import ClusteredHead
from sohsm.tasks.w2v.model import Word2Vec
from sohsm.train.loading import LoadedRun, load_run

#: export formats
FORMATS = ("text", "binary")


@dataclass
class WordVectors:
    """Words and their vectors (unit length or not), row ``i`` for ``words[i]``.

    Attributes:
        words: the words, most frequent first.
        vectors: ``[N, d]`` float32.
        counts: ``[N]`` training counts.
    """

    words: list[str]
    vectors: Tensor
    counts: np.ndarray
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.vectors.dim() != 2 or self.vectors.size(0) != len(self.words):
            raise ValueError(f"vectors must have shape [{len(self.words)}, d], got {tuple(self.vectors.shape)}")
        self._index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def index(self, word: str) -> int | None:
        """The row of ``word``, else of its lower-cased form, else ``None``."""
        found = self._index.get(word)
        return self._index.get(word.lower()) if found is None else found

    def unit(self) -> Tensor:
        """``[N, d]`` the vectors scaled to unit length (a zero vector stays zero)."""
        return self.vectors / self.vectors.norm(dim=1, keepdim=True).clamp(min=1e-12)


def load_vectors(run_dir: str | os.PathLike[str], checkpoint: str = "last") -> WordVectors:
    """The input vectors of a word-embedding run (its ``last.pt`` by default), without the unknown word.

    The run is read by the one run loader (:func:`sohsm.train.loading.load_run`).

    Raises:
        ValueError: not a run directory, no checkpoint, or not a word-embedding run's.
    """
    run = load_w2v_run(run_dir, checkpoint)
    assert isinstance(run.model, Word2Vec)  # a word-embedding run's
    vocab = run.vocab
    weight = run.model.embedding.weight.detach().float()
    keep = [i for i, w in enumerate(vocab.itos) if i != vocab.unk_id]
    return WordVectors([vocab.itos[i] for i in keep], weight[keep].contiguous(), vocab.counts[keep])


def load_w2v_run(run_dir: str | os.PathLike[str], checkpoint: str = "last") -> LoadedRun:
    """A word-embedding run's model and head as one of its checkpoints holds them, on the CPU.

    Raises:
        ValueError: not a run directory, no such checkpoint, or a run of another task.
    """
    return load_run(run_dir, checkpoint, task="w2v")


def save_word2vec(vectors: WordVectors, path: str | os.PathLike[str], fmt: str = "text") -> None:
    """Write ``vectors`` in word2vec's ``text`` or ``binary`` format, atomically.

    Raises:
        ValueError: an unknown format, or a word with whitespace (the formats cannot hold it).
    """
    from sohsm.train.checkpoint import write_atomic

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    bad = next((w for w in vectors.words if not w or any(c.isspace() for c in w)), None)
    if bad is not None:
        raise ValueError(f"word {bad!r} cannot be written in word2vec's format (empty or with whitespace)")
    array = vectors.vectors.detach().cpu().numpy().astype("<f4", copy=False)
    n, d = array.shape

    def write(handle) -> None:
        handle.write(f"{n} {d}\n".encode())
        if fmt == "binary":
            for word, row in zip(vectors.words, array):
                handle.write(word.encode("utf-8") + b" " + row.tobytes() + b"\n")
        else:
            for word, row in zip(vectors.words, array):
                handle.write((word + " " + " ".join(f"{x:.6g}" for x in row.tolist()) + "\n").encode("utf-8"))

    write_atomic(path, write)


def neighbours(vectors: WordVectors, word: str, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` words of highest cosine with ``word`` (itself left out), best first.

    Raises:
        ValueError: ``word`` is not in the vocabulary.
    """
    row = vectors.index(word)
    if row is None:
        raise ValueError(f"{word!r} is not in the vocabulary ({len(vectors):,} words)")
    unit = vectors.unit()
    cosine = unit @ unit[row]
    cosine[row] = -float("inf")
    values, ids = cosine.topk(min(k, len(vectors) - 1))
    return [(vectors.words[i], float(v)) for v, i in zip(values.tolist(), ids.tolist())]


@dataclass
class AnalogyResult:
    """Accuracy on an analogy file.

    Attributes:
        correct, answered: questions answered right, and asked (all four words in the vocabulary).
        total: questions in the file.
        sections: ``{section: (correct, answered)}``.
    """

    correct: int
    answered: int
    total: int
    sections: dict[str, tuple[int, int]]

    @property
    def accuracy(self) -> float:
        """``correct / answered`` (0 when nothing could be asked)."""
        return self.correct / self.answered if self.answered else 0.0

    @property
    def coverage(self) -> float:
        """``answered / total``."""
        return self.answered / self.total if self.total else 0.0


def read_analogies(path: str | os.PathLike[str]) -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """``[(section, [(a, b, c, d), ...]), ...]`` of a questions-words file.

    Raises:
        ValueError: a line that is neither ``: section`` nor four words (naming the line).
    """
    sections: list[tuple[str, list]] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith(":"):
            sections.append((line[1:].strip(), []))
            continue
        words = line.split()
        if len(words) != 4:
            raise ValueError(f"{path}:{number}: an analogy line needs 4 words, got {len(words)}: {line!r}")
        if not sections:
            sections.append(("", []))
        sections[-1][1].append(tuple(words))
    return sections


def analogy_accuracy(vectors: WordVectors, path: str | os.PathLike[str], batch_size: int = 512) -> AnalogyResult:
    """3CosAdd accuracy on the questions of ``path`` whose four words are in the vocabulary."""
    unit = vectors.unit()
    correct = answered = total = 0
    sections: dict[str, tuple[int, int]] = {}
    for name, questions in read_analogies(path):
        total += len(questions)
        found = [[vectors.index(w) for w in q] for q in questions]
        ids = torch.tensor([q for q in found if None not in q], dtype=torch.long).reshape(-1, 4)
        right = 0
        for lo in range(0, ids.size(0), batch_size):
            q = ids[lo: lo + batch_size]  # [Q, 4]: a is to b as c is to d
            target = unit[q[:, 1]] - unit[q[:, 0]] + unit[q[:, 2]]  # [Q, d]
            scores = target @ unit.t()  # [Q, N]
            scores.scatter_(1, q[:, :3], -float("inf"))  # the question's own words are no answer
            right += int((scores.argmax(dim=1) == q[:, 3]).sum())
        sections[name] = (right, ids.size(0))
        correct += right
        answered += ids.size(0)
    return AnalogyResult(correct, answered, total, sections)


@dataclass
class SimilarityResult:
    """Spearman's rho of a word-pair file.

    Attributes:
        spearman: rank correlation of the human scores and the cosines, on the pairs used.
        pairs: pairs used (both words in the vocabulary).
        total: pairs in the file.
    """

    spearman: float
    pairs: int
    total: int

    @property
    def coverage(self) -> float:
        return self.pairs / self.total if self.total else 0.0


def read_word_pairs(path: str | os.PathLike[str]) -> list[tuple[str, str, float]]:
    """``(word1, word2, score)`` of a WordSim-353-format file (tab- or space-separated, ``#`` comments).

    Raises:
        ValueError: a line without two words and a number (naming the line).
    """
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split("\t") if "\t" in line else line.split()
        try:
            pairs.append((parts[0].strip(), parts[1].strip(), float(parts[2])))
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{number}: a word-pair line needs 'word1 word2 score', got {line!r}") from None
    return pairs


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties share their mean rank), as ``scipy.stats.spearmanr``.

    >>> round(spearman(np.array([1, 2, 3, 4.0]), np.array([10, 20, 40, 30.0])), 3)
    0.8
    """
    def ranks(a: np.ndarray) -> np.ndarray:
        order = np.argsort(a, kind="mergesort")
        r = np.empty(len(a), dtype=np.float64)
        r[order] = np.arange(1, len(a) + 1)
        for value in np.unique(a):  # ties: their mean rank
            tied = a == value
            if tied.sum() > 1:
                r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(np.asarray(x, dtype=np.float64)), ranks(np.asarray(y, dtype=np.float64))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx ** 2).sum() * (ry ** 2).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")


def similarity_correlation(vectors: WordVectors, path: str | os.PathLike[str]) -> SimilarityResult:
    """Spearman's rho between the file's scores and the cosines, on the pairs in the vocabulary."""
    pairs = read_word_pairs(path)
    unit = vectors.unit()
    human, cosine = [], []
    for a, b, score in pairs:
        i, j = vectors.index(a), vectors.index(b)
        if i is None or j is None:
            continue
        human.append(score)
        cosine.append(float(unit[i] @ unit[j]))
    rho = spearman(np.array(human), np.array(cosine)) if len(human) > 1 else float("nan")
    return SimilarityResult(rho, len(human), len(pairs))


def word_clusters(run_dir: str | os.PathLike[str], checkpoint: str = "last") -> list[list[str]]:
    """The word classes a run's head holds (the self-organized head's learned clusters, the paper's Table 3).

    Returns:
        One list per non-empty cluster, its words most frequent first; the clusters in
        descending training frequency mass.

    Raises:
        ValueError: not a word-embedding run, or its head has no clusters.
    """
    run = load_w2v_run(run_dir, checkpoint)
    head, vocab = run.head, run.vocab
    if not isinstance(head, ClusteredHead):
        raise ValueError(f"the run's head {run.config.head.name!r} has no word clusters")
    counts = torch.from_numpy(vocab.counts.copy()).double()
    clusters = [c for c in head.clusters() if c.numel()]
    clusters.sort(key=lambda c: -float(counts[c].sum()))
    return [[vocab.itos[int(i)] for i in c[counts[c].argsort(descending=True, stable=True)]] for c in clusters]
