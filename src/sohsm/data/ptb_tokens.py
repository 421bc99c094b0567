"""Penn Treebank-style tokens of English news text, as the headline data of Rush et al. (2015) writes them.

Rush et al. built their Gigaword pairs from the Annotated Gigaword, whose text was
tokenised by Stanford CoreNLP in the Penn Treebank (PTB) convention. The word-level
rules here are NLTK's (:class:`nltk.tokenize.NLTKWordTokenizer`, the Treebank
tokenizer's regular expressions, which need no downloaded data): brackets as
``-LRB-``/``-RRB-``, double quotes as two backticks and two apostrophes, clitics (``Japan 's``, ``do n't``,
``can not``), punctuation split off, numbers kept whole (``1,000.5``, ``10:30``).

NLTK's tokenizer expects one sentence and splits only the period at its end; the
released data needs a few things it does not do, kept here, each with its reason:

=========================  ==========================  ==============================
what                       raw                         tokens
=========================  ==========================  ==============================
sentence ends inside       ``... Friday. Then ...``    ``... Friday . Then ...``
abbreviations keep ``.``   ``Mr. Lee``, ``the U.S.``   ``Mr. Lee``, ``the U.S. .``
currency symbols           ``NT$15,840``, ``US$5``     ``NT$ 15,840``, ``US$ 5``
opening single quotes      ``'no' to``                 ``` no ' to``
inner apostrophes          ``GOV'T``, ``O'Neill``      ``GOV ' T``, ``O'Neill``
slash, star (escaped)      ``9/11``, ``*Note``         ``9\\/11``, ``\\* Note``
SGML entities kept         ``Lai &amp; Chen``          ``Lai &amp; Chen``
=========================  ==========================  ==============================

A period that ends a word is a sentence end (split off as its own ``.`` token)
when the word is not a known abbreviation and the next word starts a sentence
(a capital letter, a digit or an opening quote or bracket), or when the word is
the paragraph's last; an abbreviation that ends the paragraph keeps its period
and gets a ``.`` token after it, as CoreNLP does (``the U.S. .``). No trained
sentence splitter is used (NLTK's Punkt would need downloaded models).

Example::

    >>> tokenize('Taiwan\\'s exports to the U.S. rose 5.2% (US$1.3 billion) in May, officials said.')
    ['Taiwan', "'s", 'exports', 'to', 'the', 'U.S.', 'rose', '5.2', '%', '-LRB-', 'US$', '1.3', 'billion',
     '-RRB-', 'in', 'May', ',', 'officials', 'said', '.']
"""
from __future__ import annotations

import re

from nltk.tokenize import NLTKWordTokenizer

#: words whose final period is part of the word (compared lower-cased, without the period)
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof gen col lt maj capt sgt cmdr adm gov sen rep rev hon pres supt insp
jr sr st mt ft messrs mme mlle
jan feb mar apr jun jul aug sep sept oct nov dec
co corp inc ltd bros dept univ assn ave blvd rd no nos vol vs etc approx est fig
a.m p.m
""".split())

_WORDS = NLTKWordTokenizer()
# Characters of Unicode's private use area stand for what NLTK would split apart; they are put back after it.
_KEEP = {"&": "\ue000", ";": "\ue001", "$": "\ue002"}
_PUT_BACK = {v: k for k, v in _KEEP.items()}
# the released data keeps SGML entities whole (`&amp;` is in its dictionary 12k times); NLTK splits & and ;
_ENTITY = re.compile(r"&([a-zA-Z]+|#\d+);")
# CoreNLP keeps a currency's letters with its `$` (`us$` 24k times, `nt$` 6k in the dictionary); NLTK splits `$`
_CURRENCY = re.compile(r"(?<![^\s(\[{<\"'`])([A-Za-z]{1,3})\$")
# CoreNLP writes an opening single quote as ` (the title dictionary's 75k); NLTK leaves it '
_OPEN_SINGLE = re.compile(r"(^|(?<=[\s(\[{<]))'(?!(?:s|re|ve|ll|d|m|t|n)(?:\s|$))(?=\w)", re.IGNORECASE)
_CLOSERS = frozenset({"''", "'", "-RRB-", "-RSB-", "-RCB-"})
# a word with an apostrophe inside, not a clitic (`GOV'T`, `M'LAND`, `O'Neill`, `Xi'an`)
_INNER_APOSTROPHE = re.compile(r"([A-Za-z]+)'([A-Za-z]+)")
_VOWELS = frozenset("aeiouyAEIOUY")


def _is_abbreviation(token: str) -> bool:
    """Whether ``token`` (ending in a period) is an abbreviation: a listed word, an initial (``J.``),
    or a word with an inner period (``U.S.``, ``a.m.``)."""
    stem = token[:-1]
    return (stem.lower() in ABBREVIATIONS or (len(stem) == 1 and stem.isalpha())
            or ("." in stem and all(part.isalpha() and len(part) <= 3 for part in stem.split("."))))


def _starts_sentence(token: str) -> bool:
    return token[:1].isupper() or token[:1].isdigit() or token in ("``", "`", "-LRB-", "-LSB-", "-LCB-")


def _ends_in_period(token: str) -> bool:
    return len(token) > 1 and token.endswith(".") and token.strip(".") != ""


def tokenize(text: str) -> list[str]:
    """PTB-style tokens of a paragraph (case and digits as they are).

    Args:
        text: raw text, one paragraph; line breaks count as spaces.

    Returns:
        The tokens, with every sentence-final period its own ``.`` token.
    """
    text = _ENTITY.sub(lambda m: _KEEP["&"] + m.group(1) + _KEEP[";"], text)
    text = _CURRENCY.sub(lambda m: m.group(1) + _KEEP["$"] + " ", text)
    text = _OPEN_SINGLE.sub("` ", text)
    words = _WORDS.tokenize(text, convert_parentheses=True)
    # the index of the next word past closing quotes and brackets (`go." Then`), len(words) for none
    after = [len(words)] * (len(words) + 1)
    for i in range(len(words) - 1, 0, -1):
        after[i - 1] = after[i] if words[i] in _CLOSERS else i
    tokens: list[str] = []
    for i, word in enumerate(words):
        nxt = words[after[i]] if after[i] < len(words) else None
        if word == "." and after[i] == len(words) and tokens and _is_abbreviation(tokens[-1] + "."):
            tokens[-1] += "."  # NLTK split the paragraph's last period off; an abbreviation keeps its own: `U.S. .`
        elif _ends_in_period(word) and (nxt is None or (not _is_abbreviation(word) and _starts_sentence(nxt))):
            # a sentence ends here, its period a token (an abbreviation ending the paragraph keeps its own too);
            # the word is tokenized again, as NLTK splits a clitic (`won't.` -> `wo n't`) only before a space
            tokens += [word] if nxt is None and _is_abbreviation(word) else _WORDS.tokenize(word[:-1])
            tokens.append(".")
            continue
        tokens.append(word)
    return [_put_back(piece) for token in tokens for piece in _split_apostrophe(token)]


def _split_apostrophe(token: str) -> list[str]:
    """``GOV'T`` as ``GOV ' T``: CoreNLP splits a word at an inner apostrophe (the released titles hold ``t``
    10,762 times, ``m`` and ``pore`` of ``M'LAND`` and ``S'PORE``, but no ``gov't``, ``m'land`` or ``s'pore``)
    unless it is a name such as ``O'Neill``, ``D'Ivoire`` or ``Xi'an`` (a single O, D or L, or vowels either
    side), which it keeps; NLTK keeps every one."""
    match = _INNER_APOSTROPHE.fullmatch(token)
    if match is None or token.lower() == "n't":
        return [token]
    before, after = match.groups()
    if (len(before) == 1 and before in "OoDdLl") or (before[-1] in _VOWELS and after[0] in _VOWELS):
        return [token]
    return [before, "'", after]


def _put_back(token: str) -> str:
    # the released data escapes / and * as CoreNLP does (`\/` 2.5k times in its dictionary, `\*` 74); NLTK does not
    return "".join(_PUT_BACK.get(c, c) for c in token).replace("/", "\\/").replace("*", "\\*")


def first_sentence(tokens: list[str]) -> list[str]:
    """The tokens up to and including the first ``.`` token; all of them when there is none.

    As Rush et al.'s pipeline cuts an article: only a ``.`` ends it (a ``?`` or ``!`` does not).
    """
    for i, token in enumerate(tokens):
        if token == ".":
            return tokens[: i + 1]
    return list(tokens)
