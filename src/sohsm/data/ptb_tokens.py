"""Penn Treebank-style tokens of English news text, as the headline data of Rush et al. (2015) writes them.

Rush et al. built their Gigaword pairs from the Annotated Gigaword, whose text was
tokenised by Stanford CoreNLP in the Penn Treebank (PTB) convention. This module
writes the same kind of tokens from raw text, with rules of its own (no parser,
no trained sentence splitter), so pairs made from LDC's plain English Gigaword
look like the released ones:

=========================  ==========================  ==============================
what                       raw                         tokens
=========================  ==========================  ==============================
brackets                   ``(WTO)``                   ``-LRB- WTO -RRB-``
double quotes              ``"profound" ...``          ````` profound '' ...``
clitics                    ``Japan's``, ``don't``      ``Japan 's``, ``do n't``
``cannot``                 ``cannot``                  ``can not``
punctuation                ``said, he``                ``said , he``
numbers keep , . :         ``1,000.5``, ``10:30``      ``1,000.5``, ``10:30``
currency                   ``NT$15,840``, ``$5``       ``NT$ 15,840``, ``$ 5``
slash (escaped)            ``9/11``                    ``9\\/11``
the sentence's last ``.``  ``... on Friday.``          ``... on Friday .``
abbreviations keep ``.``   ``Mr. Lee``, ``U.S.``       ``Mr. Lee``, ``U.S.``
=========================  ==========================  ==============================

A period that ends a word is a sentence end (split off as its own ``.`` token)
when the word is not a known abbreviation and the next word starts a sentence
(a capital letter, a digit or an opening quote or bracket), or when the word is
the paragraph's last; an abbreviation that ends the paragraph keeps its period
and gets a ``.`` token after it, as CoreNLP does (``the U.S. .``). SGML entities
(``&amp;``) stay as they are, as in the released data.

Example::

    >>> tokenize('Taiwan\\'s exports to the U.S. rose 5.2% (US$1.3 billion) in May, officials said.')
    ['Taiwan', "'s", 'exports', 'to', 'the', 'U.S.', 'rose', '5.2', '%', '-LRB-', 'US$', '1.3', 'billion',
     '-RRB-', 'in', 'May', ',', 'officials', 'said', '.']
"""
from __future__ import annotations

import re

#: words whose final period is part of the word (compared lower-cased, without the period)
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof gen col lt maj capt sgt cmdr adm gov sen rep rev hon pres supt insp
jr sr st mt ft messrs mme mlle
jan feb mar apr jun jul aug sep sept oct nov dec
co corp inc ltd bros dept univ assn ave blvd rd no nos vol vs etc approx est fig
a.m p.m
""".split())

_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_CLOSERS = frozenset({"''", "'", "-RRB-", "-RSB-", "-RCB-"})
_ENTITY = re.compile(r"&[a-zA-Z]+;|&#\d+;")
# an opening double quote: at the start, or after a space or an opening bracket
_OPEN_QUOTE = re.compile(r'(^|(?<=[\s(\[{<]))"')
_CLITIC = re.compile(r"(?i)^(.+?)('s|'re|'ve|'ll|'d|'m|n't)$")
# a number's inner , . : stay; elsewhere these split off
_INNER = re.compile(r"(?<=\d)[,.:](?=\d)")
_CURRENCY = re.compile(r"^([A-Za-z]{0,3}\$)(?=\d)")


def _split_word(word: str) -> list[str]:
    """Tokens of one whitespace-free piece of text, the final period left attached (see :func:`tokenize`)."""
    if _ENTITY.fullmatch(word) or word in ("''", "``"):
        return [word]
    head: list[str] = []
    tail: list[str] = []
    # leading punctuation
    while word:
        if word.startswith("``"):
            head.append("``")
            word = word[2:]
        elif word[0] == "`":
            head.append("`")
            word = word[1:]
        elif word[0] in _BRACKETS:
            head.append(_BRACKETS[word[0]])
            word = word[1:]
        elif word[0] == "'" and len(word) > 1 and not _CLITIC.match(word):
            head.append("`")
            word = word[1:]
        elif word[0] in ",;:?!" or word.startswith("--"):
            n = 2 if word.startswith("--") else 1
            head.append(word[:n])
            word = word[n:]
        elif word.startswith("..."):
            head.append("...")
            word = word[3:]
        else:
            break
    # trailing punctuation (the final period stays; the caller decides whether it ends a sentence)
    while word:
        if word.endswith("''"):
            tail.insert(0, "''")
            word = word[:-2]
        elif word[-1] in _BRACKETS:
            tail.insert(0, _BRACKETS[word[-1]])
            word = word[:-1]
        elif word.endswith("..."):
            tail.insert(0, "...")
            word = word[:-3]
        elif word.endswith("--"):
            tail.insert(0, "--")
            word = word[:-2]
        elif word[-1] in ",;:?!%" or (word[-1] == "'" and len(word) > 1):
            tail.insert(0, word[-1])
            word = word[:-1]
        elif word[-1] == "." and len(word) > 1 and (word[-2] in _BRACKETS or word[-2] in "\"'%"):
            tail.insert(0, ".")  # `(Taipei).` -> the period follows the bracket
            word = word[:-1]
        else:
            break
    middle: list[str] = []
    if word:
        currency = _CURRENCY.match(word)
        if currency:
            middle.append(currency.group(1))
            word = word[currency.end():]
        parts = [p for p in re.split(r"(--)", word) if p]  # `word--word`
        for part in parts:
            if part == "--":
                middle.append(part)
                continue
            # a final period stays on the last token (`won't.` -> wo n't.): tokenize() decides on it
            period = "." if part.endswith(".") and len(part) > 1 else ""
            core = part[: len(part) - len(period)]
            if core.lower() == "cannot":
                middle += [core[:3], core[3:] + period]
                continue
            clitic = _CLITIC.match(core)
            if clitic and clitic.group(1) not in ("'", ""):
                middle += _split_word(clitic.group(1)) + [clitic.group(2) + period]  # `(FCC)'s` -> FCC -RRB- 's
            else:
                middle.append(part)
    return [t for t in head + middle + tail if t]


def _is_abbreviation(token: str) -> bool:
    """Whether ``token`` (ending in a period) is an abbreviation: a listed word, an initial (``J.``),
    or a word with an inner period (``U.S.``, ``a.m.``)."""
    stem = token[:-1]
    return (stem.lower() in ABBREVIATIONS or (len(stem) == 1 and stem.isalpha())
            or ("." in stem and all(part.isalpha() and len(part) <= 3 for part in stem.split("."))))


def _starts_sentence(token: str) -> bool:
    return token[:1].isupper() or token[:1].isdigit() or token in ("``", "`", "-LRB-", "-LSB-", "-LCB-")


def tokenize(text: str) -> list[str]:
    """PTB-style tokens of a paragraph (case and digits as they are).

    Args:
        text: raw text, one paragraph; line breaks count as spaces.

    Returns:
        The tokens, with every sentence-final period its own ``.`` token.
    """
    text = _OPEN_QUOTE.sub(" `` ", text)
    text = text.replace('"', " '' ")
    protected = _INNER.sub(lambda m: {",": "\x00", ".": "\x01", ":": "\x02"}[m.group(0)], text)
    pieces = [p for w in protected.split() for p in _split_word(w)]
    pieces = [p.replace("\x00", ",").replace("\x01", ".").replace("\x02", ":").replace("/", "\\/") for p in pieces]
    tokens: list[str] = []
    for i, token in enumerate(pieces):
        if len(token) > 1 and token.endswith(".") and token != "...":
            # the next word, past closing quotes and brackets (`go." Then`)
            nxt = next((pieces[j] for j in range(i + 1, len(pieces)) if pieces[j] not in _CLOSERS), None)
            if nxt is None:  # the paragraph's last word
                tokens += [token, "."] if _is_abbreviation(token) else [token[:-1], "."]
                continue
            if not _is_abbreviation(token) and _starts_sentence(nxt):
                tokens += [token[:-1], "."]
                continue
        tokens.append(token)
    return tokens


def first_sentence(tokens: list[str]) -> list[str]:
    """The tokens up to and including the first ``.`` token; all of them when there is none.

    As Rush et al.'s pipeline cuts an article: only a ``.`` ends it (a ``?`` or ``!`` does not).
    """
    for i, token in enumerate(tokens):
        if token == ".":
            return tokens[: i + 1]
    return list(tokens)
