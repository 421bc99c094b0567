"""ROUGE-1, ROUGE-2 and ROUGE-L as ROUGE-1.5.5 computes them for headline generation.

The options of the papers (Rush et al. 2015; Shen et al. 2017), in ROUGE-1.5.5's terms:

* Gigaword: ``-m -n 2 -a``: Porter stemming, full length, F1 (``-p 0.5``), one reference.
* DUC-2004: ``-m -n 2 -a -b 75``: Porter stemming, every summary cut to its first
  75 bytes, recall, four references.

Tokens and stems come from the maintained ``rouge-score`` package (Google
Research), whose tokenizer reproduces ROUGE-1.5.5's: lowercase, every
character other than ``a-z0-9`` a separator, Porter stems for tokens longer than
three characters. ``rouge-score`` scores several references by keeping the best
single one; ROUGE-1.5.5 (``-f A``, its default) *pools* them, and so does this
module::

    recall    = sum_r hits(peer, r) / sum_r |r|
    precision = sum_r hits(peer, r) / (R * |peer|)          R = number of references
    F         = P * R / ((1 - alpha) * P + alpha * R)        alpha = 0.5: the harmonic mean

where ``hits`` counts clipped n-gram matches (ROUGE-N) or the length of the
longest common subsequence (ROUGE-L; a headline is one sentence). Scores of a
test set are the means of the per-headline scores (``-a``), in percent.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

#: the measures reported
MEASURES = ("rouge1", "rouge2", "rougeL")


@dataclass(frozen=True)
class Score:
    """Precision, recall and F of one measure (fractions in [0, 1])."""

    precision: float
    recall: float
    fmeasure: float


@lru_cache(maxsize=1)
def _tokenizer():
    try:
        from rouge_score.tokenizers import DefaultTokenizer
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ValueError("scoring needs the rouge-score package: pip install rouge-score") from None
    return DefaultTokenizer(use_stemmer=True)


def tokenize(text: str) -> list[str]:
    """ROUGE-1.5.5's tokens of ``text``: lowercase alphanumeric runs, Porter-stemmed (``-m``)."""
    return _tokenizer().tokenize(text)


def truncate_bytes(text: str, limit: int | None) -> str:
    """The first ``limit`` bytes of ``text`` (utf-8), as ROUGE-1.5.5's ``-b`` cuts it; ``None``: all."""
    if limit is None:
        return text
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1))


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of ``a`` and ``b``."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def _score(hits: int, peer_total: int, reference_total: int, alpha: float = 0.5) -> Score:
    precision = hits / peer_total if peer_total else 0.0
    recall = hits / reference_total if reference_total else 0.0
    if precision == 0.0 or recall == 0.0:
        return Score(precision, recall, 0.0)
    return Score(precision, recall, precision * recall / ((1 - alpha) * precision + alpha * recall))


def rouge(hypothesis: str, references: Sequence[str], byte_limit: int | None = None) -> dict[str, Score]:
    """ROUGE-1, -2 and -L of one headline against its references, pooled as ROUGE-1.5.5 pools them.

    Example (the first figures hand-checked in docs/s2s.md)::

        >>> s = rouge("police killed the gunman", ["police kill gunman", "the gunman was shot by police"])
        >>> round(s["rouge1"].recall, 4), round(s["rouge1"].precision, 4)     # 6/9, 6/8
        (0.6667, 0.75)

    Raises:
        ValueError: no references.
    """
    if not references:
        raise ValueError("ROUGE needs at least one reference")
    peer = tokenize(truncate_bytes(hypothesis, byte_limit))
    models = [tokenize(truncate_bytes(r, byte_limit)) for r in references]
    out = {}
    for n, name in ((1, "rouge1"), (2, "rouge2")):
        peer_grams = _ngrams(peer, n)
        hits = total = 0
        for model in models:
            grams = _ngrams(model, n)
            hits += sum((peer_grams & grams).values())
            total += sum(grams.values())
        out[name] = _score(hits, sum(peer_grams.values()) * len(models), total)
    hits = sum(_lcs(peer, model) for model in models)
    out["rougeL"] = _score(hits, len(peer) * len(models), sum(len(m) for m in models))
    return out


@dataclass(frozen=True)
class CorpusScores:
    """Mean ROUGE over a test set, in percent.

    Attributes:
        scores: ``{measure: Score}`` of means (percent).
        count: headlines scored.
        options: what was computed, in ROUGE-1.5.5's flags (``-m -n 2 -a [-b 75]``) and words.
    """

    scores: dict[str, Score]
    count: int
    options: str

    def reported(self, which: str) -> dict[str, float]:
        """``{"rouge1": ..., ...}``: the ``"fmeasure"``, ``"recall"`` or ``"precision"`` of each measure."""
        return {m: getattr(self.scores[m], which) for m in MEASURES}


def corpus_rouge(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                 byte_limit: int | None = None) -> CorpusScores:
    """Mean per-headline ROUGE (``-a``) of aligned hypotheses and reference lists.

    Raises:
        ValueError: the two differ in length, or a headline has no reference.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses):,} hypotheses but {len(references):,} reference lists")
    if not hypotheses:
        raise ValueError("nothing to score")
    sums = {m: [0.0, 0.0, 0.0] for m in MEASURES}
    for hypothesis, refs in zip(hypotheses, references):
        for m, s in rouge(hypothesis, refs, byte_limit).items():
            sums[m][0] += s.precision
            sums[m][1] += s.recall
            sums[m][2] += s.fmeasure
    n = len(hypotheses)
    scores = {m: Score(*(100.0 * v / n for v in values)) for m, values in sums.items()}
    n_refs = {len(r) for r in references}
    refs = f"{min(n_refs)}" if len(n_refs) == 1 else f"{min(n_refs)}-{max(n_refs)}"
    flags = "-m -n 2 -a" + (f" -b {byte_limit}" if byte_limit is not None else "")
    options = (f"ROUGE-1.5.5 {flags} -f A (Porter stemming, "
               + (f"cut to {byte_limit} bytes" if byte_limit is not None else "full length")
               + f", {refs} reference(s) pooled, mean over {n:,} headlines; tokens and stems by rouge-score)")
    return CorpusScores(scores, n, options)
