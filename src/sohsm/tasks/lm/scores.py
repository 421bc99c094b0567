"""Measures of a language model that compare across vocabularies: perplexity per word and bits per byte.

Both compare words against subwords and one tokenizer against another. They come from the loss of a whole split,
``L = nll_per_token * tokens`` (nats; ``tokens``: the split's tokens, of which all but the first and at most
``batch_size - 1`` at its end are scored, so ``L`` extends their mean to the whole split)::

    ppl per word  = exp(L / words)       words: the split's words as a word vocabulary reads them, one
                                          <eos> per line included (sohsm.data.loading)
    bits per byte = L / ln 2 / bytes     bytes: the UTF-8 bytes of the split's text, each line's words joined
                                          by single spaces and ended by a newline (running text: a space
                                          after every word)

For a word vocabulary the tokens are the words, and perplexity per word is perplexity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sohsm.train.evaluation import EvalResult


@dataclass(frozen=True)
class SplitEvalResult(EvalResult):
    """:class:`~sohsm.train.evaluation.EvalResult` of a corpus split, with the measures that compare across
    vocabularies (see the module docstring).

    Attributes:
        split_tokens: the split's tokens (``tokens`` of them were scored).
        words: the split's words; ``None`` where the corpus does not say.
        text_bytes: the UTF-8 bytes of the split's text; ``None`` where the corpus does not say.
        ppl_word: perplexity per word.
        bits_per_byte: the loss in bits per byte of text.
        subwords: whether the tokens are subwords (else they are the words).
    """

    split_tokens: int
    words: int | None
    text_bytes: int | None
    ppl_word: float | None
    bits_per_byte: float | None
    subwords: bool


def split_scores(result: EvalResult, split_tokens: int, words: int | None, text_bytes: int | None,
                 subwords: bool) -> SplitEvalResult:
    """``result`` with perplexity per word and bits per byte of a split of ``split_tokens`` tokens, ``words`` words
    and ``text_bytes`` bytes (the module docstring's formulas)."""
    loss = result.nll_nats * split_tokens  # nats, the scored tokens' mean extended to the whole split
    ppl_word = math.exp(min(loss / words, 700.0)) if words else None
    bits_per_byte = loss / math.log(2) / text_bytes if text_bytes else None
    return SplitEvalResult(**result.to_dict(), split_tokens=split_tokens, words=words, text_bytes=text_bytes,
                           ppl_word=ppl_word, bits_per_byte=bits_per_byte, subwords=subwords)
