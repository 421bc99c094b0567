"""The headline-generation training set of Rush et al. (2015), made from your own LDC English Gigaword.

Rush, Chopra and Weston (2015), "A Neural Attention Model for Abstractive Sentence
Summarization" (https://arxiv.org/abs/1509.00685), pair each Gigaword story's
headline with the start of its first paragraph. Their released pipeline (NAMAS,
``dataset/``) works on the Annotated Gigaword; this module does the same on LDC's
plain English Gigaword SGML (:mod:`sohsm.data.gigaword_sgml`), one document at a
time, and writes the folder ``sohsm s2s train --pairs DIR`` reads.

What a story becomes (:func:`prepare`):

1. Only documents of ``type="story"`` are read. The ``<DATELINE>`` element is never
   read; a first paragraph that is only a byline (``By John Smith``) is skipped,
   and a dateline opening the first paragraph (``WASHINGTON (AP) _``,
   ``BEIJING, March 1 (Xinhua) --``) is cut off.
2. Headline and first paragraph become PTB-style tokens
   (:func:`sohsm.data.ptb_tokens.tokenize`), every digit becomes ``#``.
3. The article is the first paragraph's tokens up to and including the first ``.``
   token (NAMAS cuts there; a ``?`` or ``!`` does not end it); the headline too is cut
   after a ``.`` token, as NAMAS cuts it.

NAMAS's filters (``dataset/filter.py``), in its order; a pair is counted under the
first it fails (:data:`FILTERS`):

* ``no sentence end``: the article has no ``.`` token.
* ``blacklisted headline``: the lower-cased headline, as one string of its tokens
  joined by spaces, *contains* any of :data:`HEADLINE_BLACKLIST` as a substring.
  This is NAMAS's test as written: ``ap`` removes every headline with ``japan``
  or ``capital`` in it too, and ``update`` every ``updated``; the released training
  titles indeed hold no ``ap`` anywhere. Entries with spaces (``' by '``) match
  whole words inside the headline only.
* ``article length``: not 10 < article tokens < 100 (11 to 99, punctuation counted).
* ``headline length``: not 3 < headline tokens < 50 (4 to 49, punctuation counted).
  (NAMAS tests both lengths in one condition; here each has its row.)
* ``no shared word``: no word longer than three characters (lower-cased, ``#``
  counted as a character) is in both the headline and the article. NAMAS uses no
  stop-word list: the length is its stand-in.

Then, as NAMAS's ``pull.py`` writes its files, article and headline are lower-cased
and the headline loses the punctuation tokens of :data:`TITLE_DROP`. Two rows of
the table are this module's own: ``empty headline`` (nothing left after that; the
files hold no empty line) and ``in a test set``: a pair whose article is, word for
word, an input of a known test set (Gigaword's test set, DUC-2003, DUC-2004, those
of them in the data directory; a test file's ``UNK`` matches any word, DUC's digits
are read as ``#``). Unlike NAMAS's ``pull.py`` no word becomes ``<unk>`` here: the
summariser's vocabulary (``--min-count``, ``--max-size``) decides that when it trains.

Dev pairs: NAMAS splits train and dev by month files; a stream of a few files
cannot, so a pair goes to the dev set when the CRC-32 of its document id falls in
the first ``valid_share`` of its range: the same document always lands on the same
side, whatever files are read with it.
"""
from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from sohsm.atomic_writes import WriteError, atomic_output
from sohsm.data.errors import DataError
from sohsm.data.files import resolve_data_dir
from sohsm.data.gigaword_sgml import Document, gigaword_files, read_documents
from sohsm.data.headlines import EVAL_SETS, PAIR_FILES
from sohsm.data.pairs import read_lines
from sohsm.data.ptb_tokens import first_sentence, tokenize

#: NAMAS's headline blacklist, matched as substrings of the lower-cased headline (see the module's notes)
HEADLINE_BLACKLIST = (
    "update#", "update", "recasts", "undated", "grafs", "corrects", "retransmitting", "updates", "dateline",
    "writethru", "recaps", "inserts", "incorporates", "adv##", "ld-writethru", "djlfx", "edits", "byline",
    "repetition", "background", "thruout", "quotes", "attention", "ny###", "overline", "embargoed", "ap", "gmt",
    "adds", "embargo", "urgent", "?", " i ", " : ", " - ", " by ", "-lrb-", "-rrb-",
)
#: punctuation tokens NAMAS leaves out of the written headline (its list reads ``-llb-`` where ``-lrb-`` is
#: meant; a headline holding ``-lrb-`` never gets this far, since the blacklist drops it)
TITLE_DROP = frozenset({'"', "'", "''", "!", "=", "-", "--", ",", "?", ".", "``", "`", "-rrb-", "-lrb-", "\\/"})
#: the rows of the table of dropped pairs, in the order the rules are applied
FILTERS = ("not a story", "no headline or text", "no sentence end", "blacklisted headline", "article length",
           "headline length", "no shared word", "empty headline", "in a test set")
#: the report of the run that wrote the folder
REPORT_FILE = "pairs.json"

_BYLINE = re.compile(r"^\(?\s*by\s+[^.]{1,80}?\)?$", re.IGNORECASE)
_PLACE_CAPS = r"[A-Z][A-Z.'&-]+(?:\s+[A-Z][A-Z.'&-]+)*"            # WASHINGTON, NEW YORK, ST. LOUIS
_PLACE = r"[A-Z][A-Za-z.'&-]+(?:\s+[A-Z][A-Za-z.'&-]+)*"           # Taipei, Los Angeles
_REGION = r"(?:\s*,\s*[A-Z][A-Za-z.'&-]+(?:\s+[A-Z][A-Za-z.'&-]+)*)?"  # , Calif.
_DATE = r"\s*,?\s*[A-Z][a-z]{2,4}\.?\s+\d{1,2}"                      # , Oct. 1
_AGENCY = r"\s*\([A-Za-z][A-Za-z &;.-]{0,30}\)"                       # (AP)
_DATELINES = (
    # a place in capitals, then a dash, then a capital: `WASHINGTON (AP) _ The`, `BEIJING, March 1 (Xinhua) -- China`
    re.compile(rf"^{_PLACE_CAPS}{_REGION}(?:{_DATE})?(?:{_AGENCY})?\s*(?:_|--|-)\s+(?=[A-Z0-9`'\"])"),
    # any place with a date and an agency, the dash optional: `Taipei, March 20 (CNA) President`
    re.compile(rf"^{_PLACE}{_REGION}{_DATE}{_AGENCY}\s*(?:_|--|-)?\s+"),
)
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class Pair:
    """A prepared pair before NAMAS's filters: case as written, digits as ``#``.

    Attributes:
        article: the first sentence's tokens.
        title: the headline's tokens.
    """

    article: list[str]
    title: list[str]


def strip_dateline(paragraph: str) -> str:
    """``paragraph`` without a dateline at its start (``WASHINGTON (AP) _ ...`` -> ``...``).

    A dateline is a place in capitals, perhaps a region, date and agency, then ``_``, ``--`` or ``-``
    and a capital (``WASHINGTON (AP) _ The``); or any place with a date and an agency in brackets, the
    dash optional (``Taipei, Oct. 1 (CNA) President``). Anything else is left alone.

    Example::

        >>> strip_dateline("BEIJING, March 1 (Xinhua) -- China's exports rose.")
        "China's exports rose."
        >>> strip_dateline("U.S. exports rose.")
        'U.S. exports rose.'
    """
    for pattern in _DATELINES:
        match = pattern.match(paragraph)
        if match and match.end() < len(paragraph):
            return paragraph[match.end():]
    return paragraph


def first_paragraph(document: Document) -> str | None:
    """The first paragraph of a story's text that is not a byline, its dateline cut off; ``None`` if none."""
    for paragraph in document.paragraphs:
        if _BYLINE.match(paragraph.strip()):
            continue
        text = strip_dateline(paragraph.strip())
        if text:
            return text
    return None


def _hash_digits(tokens: Iterable[str]) -> list[str]:
    return [_DIGIT.sub("#", t) for t in tokens]


def prepare(document: Document) -> Pair | str:
    """The pair of a Gigaword document (steps 1-3 of the module's notes), or why it has none.

    Returns:
        A :class:`Pair`, or the name of the row of :data:`FILTERS` that drops the document
        (``"not a story"``, ``"no headline or text"``).
    """
    if document.type != "story":
        return "not a story"
    paragraph = first_paragraph(document)
    if not document.headline.strip() or paragraph is None:
        return "no headline or text"
    article = first_sentence(_hash_digits(tokenize(paragraph)))
    title = first_sentence(_hash_digits(tokenize(document.headline)))
    return Pair(article, title)


def blacklisted(title: Sequence[str]) -> str | None:
    """The first entry of :data:`HEADLINE_BLACKLIST` in the headline ``title`` (its tokens), ``None`` if none is."""
    joined = " ".join(title).lower()
    return next((bad for bad in HEADLINE_BLACKLIST if bad in joined), None)


def namas_filter(pair: Pair) -> str | None:
    """The first of NAMAS's filters ``pair`` fails (a row of :data:`FILTERS`), ``None`` if it passes them all."""
    if "." not in pair.article:
        return "no sentence end"
    if blacklisted(pair.title) is not None:
        return "blacklisted headline"
    if not 10 < len(pair.article) < 100:
        return "article length"
    if not 3 < len(pair.title) < 50:
        return "headline length"
    title_words = {w.lower() for w in pair.title if len(w) > 3}
    if not title_words & {w.lower() for w in pair.article if len(w) > 3}:
        return "no shared word"
    return None


def finish(pair: Pair) -> tuple[list[str], list[str]]:
    """``(article, title)`` as written: lower-cased, the title without :data:`TITLE_DROP` tokens."""
    title = [w for w in (t.lower() for t in pair.title) if w not in TITLE_DROP]
    return [w.lower() for w in pair.article], title


class TestArticles:
    """The articles of test sets, to find a training article among them word for word.

    A test file writes ``UNK`` (or ``<unk>``) for words outside its vocabulary: there it matches any word.

    Args:
        sets: ``{name: articles}``, each article a list of lower-cased words with digits as ``#``.

    Example::

        >>> tests = TestArticles({"gigaword": [["japan", "'s", "UNK", "corp.", "rose", "."]]})
        >>> tests.find(["japan", "'s", "nec", "corp.", "rose", "."])
        'gigaword'
        >>> tests.find(["japan", "'s", "nec", "corp.", "fell", "."]) is None
        True
    """

    WILDCARDS = frozenset({"UNK", "<unk>"})
    __test__ = False  # not a test class, whatever its name

    def __init__(self, sets: dict[str, Sequence[Sequence[str]]]) -> None:
        self.names = tuple(sets)
        self.sizes = {name: len(articles) for name, articles in sets.items()}
        self._index: dict[tuple[int, str | None], list[tuple[tuple[str | None, ...], str]]] = {}
        for name, articles in sets.items():
            for article in articles:
                pattern = tuple(None if w in self.WILDCARDS else w for w in article)
                if pattern:
                    self._index.setdefault((len(pattern), pattern[0]), []).append((pattern, name))

    def find(self, article: Sequence[str]) -> str | None:
        """The name of a test set holding ``article``, ``None`` if none does."""
        if not article:
            return None
        for key in ((len(article), article[0]), (len(article), None)):
            for pattern, name in self._index.get(key, ()):
                if all(p is None or p == w for p, w in zip(pattern, article)):
                    return name
        return None

    def __len__(self) -> int:
        return sum(self.sizes.values())


def load_test_articles(data_dir: str | os.PathLike[str] | None = None) -> TestArticles:
    """The inputs of the known test sets (Gigaword's test set, DUC-2004, DUC-2003) found in ``data_dir``
    (default ``$SOHSM_DATA``); a set whose input file is absent is left out (:attr:`TestArticles.names`
    says which were read)."""
    root = resolve_data_dir(data_dir)
    sets: dict[str, Sequence[Sequence[str]]] = {}
    for name, (source, _) in EVAL_SETS.items():
        if (root / source).is_file():
            sets[name] = [_hash_digits(w.lower() if w not in TestArticles.WILDCARDS else w for w in line)
                          for line in read_lines(root / source)]
    return TestArticles(sets)


def in_valid(document_id: str, share: float) -> bool:
    """Whether the document goes to the dev pairs: the CRC-32 of its id in the first ``share`` of its range."""
    return zlib.crc32(document_id.encode("utf-8")) < share * 2**32


@dataclass
class PairsReport:
    """What :func:`make_pairs` read, dropped and wrote.

    Attributes:
        files: the Gigaword files read.
        documents: documents read.
        dropped: pairs dropped, by row of :data:`FILTERS` (every row present, zeros included).
        written: pairs written, ``{"train": n, "valid": n}``.
        blacklisted: the blacklisted headlines by the first entry of :data:`HEADLINE_BLACKLIST` each holds.
        test_sets: the test sets whose articles were looked for, with their sizes.
        valid_share: the share of documents sent to the dev pairs.
        out: the folder written.
    """

    files: list[str]
    documents: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILTERS, 0))
    written: dict[str, int] = field(default_factory=lambda: {"train": 0, "valid": 0})
    blacklisted: dict[str, int] = field(default_factory=dict)
    test_sets: dict[str, int] = field(default_factory=dict)
    valid_share: float = 0.05
    out: str = ""

    def table(self) -> str:
        """The documents, each filter's drops and the pairs written, as an aligned text table."""
        rows = [("documents read", self.documents)]
        rows += [(f"  dropped: {name}", n) for name, n in self.dropped.items()]
        rows += [("pairs written: train", self.written["train"]), ("pairs written: dev", self.written["valid"])]
        width = max(len(name) for name, _ in rows)
        digits = max(len(f"{n:,}") for _, n in rows)
        return "\n".join(f"{name:<{width}}  {n:>{digits},}" for name, n in rows)


def make_pairs(inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, valid_share: float = 0.05,
               tests: TestArticles | None = None, on_bytes: Callable[[int], None] | None = None) -> PairsReport:
    """Write Rush et al.'s headline pairs of the Gigaword files ``inputs`` into the folder ``out``.

    Streams the documents (nothing is held but the test articles); writes ``train.article.txt``,
    ``train.title.txt``, ``valid.article.txt``, ``valid.title.txt`` (one sentence a line, aligned) and
    ``pairs.json`` (this report) atomically: on any error no file of ``out`` is replaced, and the
    folders this call created are removed again.

    Args:
        inputs: ``.gz`` files of English Gigaword, or folders holding them.
        out: the folder to write (created if missing; files already there are replaced).
        valid_share: the share of documents that go to the dev pairs, in (0, 1).
        tests: test articles a pair's article must not be (``None``: none).
        on_bytes: called with the compressed bytes read since its last call (a progress bar).

    Returns:
        The :class:`PairsReport`, also written to ``pairs.json``.

    Raises:
        ValueError: ``valid_share`` outside (0, 1).
        DataError: an input is missing, not gzip or not Gigaword SGML; ``out`` is a file; or no training or
            no dev pair is left.
        sohsm.atomic_writes.WriteError: ``out`` cannot be written (naming the file and the reason).
    """
    if not 0 < valid_share < 1:
        raise ValueError(f"valid_share must be in (0, 1), got {valid_share}")
    files = gigaword_files(list(inputs))
    tests = tests if tests is not None else TestArticles({})
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: a file, not a folder to write the pairs into")
    created = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    report = PairsReport([str(f) for f in files], test_sets=dict(tests.sizes), valid_share=valid_share, out=str(out))
    try:
        with ExitStack() as stack:
            # entered first, so replaced last: a pairs.json always describes the files beside it
            report_handle = stack.enter_context(atomic_output(out / REPORT_FILE, "w"))
            handles = {split: [(name, stack.enter_context(atomic_output(out / name, "w"))) for name in names]
                       for split, names in PAIR_FILES.items()}
            for path in files:
                for document in read_documents(path, on_bytes):
                    report.documents += 1
                    pair = prepare(document)
                    reason = pair if isinstance(pair, str) else namas_filter(pair)
                    if reason is None:
                        assert not isinstance(pair, str)  # (a string is why a document was dropped)
                        article, title = finish(pair)
                        if not title:
                            reason = "empty headline"
                        elif tests.find(article) is not None:
                            reason = "in a test set"
                    if reason is not None:
                        report.dropped[reason] += 1
                        if reason == "blacklisted headline":
                            assert not isinstance(pair, str)  # the filters read a pair
                            entry = blacklisted(pair.title)
                            assert entry is not None  # the filter found it
                            report.blacklisted[entry] = report.blacklisted.get(entry, 0) + 1
                        continue
                    split = "valid" if in_valid(document.id, valid_share) else "train"
                    for (name, handle), words in zip(handles[split], (article, title)):
                        try:
                            handle.write(" ".join(words) + "\n")
                        except OSError as error:  # named here: every open file's context sees it
                            raise WriteError(error.errno, error.strerror, str(out / name)) from None
                    report.written[split] += 1
            for split, what in (("train", "training"), ("valid", "dev")):
                if not report.written[split]:
                    raise DataError(f"no {what} pair left of {report.documents:,} documents in {len(files)} file(s) "
                                    f"(dropped: {', '.join(f'{k} {v:,}' for k, v in report.dropped.items() if v)})"
                                    + ("; give more files or a larger --valid-share" if split == "valid" else ""))
            report.blacklisted = dict(sorted(report.blacklisted.items(), key=lambda item: -item[1]))
            json.dump(report.__dict__, report_handle, indent=1)
    except BaseException:
        for folder in created:
            try:
                folder.rmdir()  # only if empty: the temporary files are gone by now
            except OSError:
                break
        raise
    return report
