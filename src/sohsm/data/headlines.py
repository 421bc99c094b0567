"""The headline-generation data sets in a data directory: Gigaword (Rush et al. 2015), DUC-2003, DUC-2004.

Layout under the data directory (``$SOHSM_DATA``)::

    gigaword/train/train.article.txt, train.title.txt            training pairs
    gigaword/train/valid.article.filter.txt, valid.title.filter.txt   dev pairs
    gigaword/valid-subsets/valid.article.filter.10K.txt, valid.title.filter.10K.txt   extra pairs
    gigaword/valid-subsets/valid.src.small.txt, valid.trg.small.txt                   extra pairs
    gigaword/Giga/input.txt, task1_ref0.txt                       test set (writes UNK for <unk>)
    duc2004/input.txt, task1_ref0.txt .. task1_ref3.txt           DUC-2004 task 1 (four references)
    duc2003/ (the same)                                           DUC-2003, a dev set for DUC

:func:`load_pairs_folder` reads instead a folder of pairs made from your own
English Gigaword (:mod:`sohsm.data.gigaword`).

The extra pairs are from Rush's *validation* split: with ``extra=True`` they join
the training pairs after every pair whose article also occurs in the test input
or the dev pairs is removed.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sohsm.data.errors import DataError
from sohsm.data.files import data_dir_origin, resolve_data_dir
from sohsm.data.pairs import Pairs, check_aligned, drop_overlap, read_lines, read_pairs

#: how the test files write the unknown word
TEST_UNK = "UNK"

_TRAIN = ("gigaword/train/train.article.txt", "gigaword/train/train.title.txt")
_VALID = ("gigaword/train/valid.article.filter.txt", "gigaword/train/valid.title.filter.txt")
_EXTRA = (("gigaword/valid-subsets/valid.article.filter.10K.txt", "gigaword/valid-subsets/valid.title.filter.10K.txt"),
          ("gigaword/valid-subsets/valid.src.small.txt", "gigaword/valid-subsets/valid.trg.small.txt"))

#: a folder of pairs made from your own Gigaword (:func:`sohsm.data.gigaword.make_pairs` writes it)
PAIR_FILES = {"train": ("train.article.txt", "train.title.txt"), "valid": ("valid.article.txt", "valid.title.txt")}

#: evaluation sets by name: input file and reference files, relative to the data directory
EVAL_SETS = {
    "gigaword": ("gigaword/Giga/input.txt", ("gigaword/Giga/task1_ref0.txt",)),
    "duc2004": ("duc2004/input.txt", tuple(f"duc2004/task1_ref{i}.txt" for i in range(4))),
    "duc2003": ("duc2003/input.txt", tuple(f"duc2003/task1_ref{i}.txt" for i in range(4))),
}


#: Rush et al.'s released preparation of Gigaword (harvardnlp/sent-summary's ``summary.tar.gz``)
_SUMDATA = ("Rush et al.'s released `sumdata` archive (harvardnlp/sent-summary on GitHub links it as "
            "summary.tar.gz)")


@dataclass(frozen=True)
class HeadlineData:
    """One piece of the headline-generation data: its files in the data directory and where a user gets them.

    None of it is downloaded for the user: Gigaword is LDC's, DUC is NIST's, and both ask for a copy of
    one's own. ``sohsm data list`` shows each piece with what is present; a missing one's message says
    what to get and where it goes.

    Attributes:
        name: the piece's name (``gigaword-train``, ``duc2004``, ...).
        description: what it is, in a few words.
        files: its files, relative to the data directory.
        source: where to get them.
        optional: training works without it.
    """

    name: str
    description: str
    files: tuple[str, ...]
    source: str
    optional: bool = False


HEADLINE_DATA = (
    HeadlineData("gigaword-train", "Gigaword training and dev pairs (Rush et al.'s preparation)", (*_TRAIN, *_VALID),
                 f"{_SUMDATA}: sumdata/train/ (the first 10,000 training and 1,000 dev lines are enough to "
                 "start); or make pairs from your own LDC English Gigaword with `sohsm s2s pairs` and train with "
                 "--pairs DIR"),
    HeadlineData("gigaword-extra", "two more subsets of the archive's validation split (25.6k pairs)",
                 tuple(f for pair in _EXTRA for f in pair),
                 f"subsets of the validation split of {_SUMDATA}; or train with --no-extra", optional=True),
    HeadlineData("gigaword-test", "the Gigaword test set (1,951 pairs)",
                 (EVAL_SETS["gigaword"][0], *EVAL_SETS["gigaword"][1]),
                 f"{_SUMDATA}: sumdata/Giga/"),
    HeadlineData("duc2004", "DUC-2004 task 1 (500 articles, 4 references each)",
                 (EVAL_SETS["duc2004"][0], *EVAL_SETS["duc2004"][1]),
                 "NIST's DUC 2004 data (free, after signing its agreement at duc.nist.gov), task 1, "
                 "one sentence per line; Rush et al.'s archive holds it as sumdata/DUC2004/"),
    HeadlineData("duc2003", "DUC-2003 task 1 (624 articles, 4 references each; a dev set)",
                 (EVAL_SETS["duc2003"][0], *EVAL_SETS["duc2003"][1]),
                 "NIST's DUC 2003 data (as DUC-2004), task 1; Rush et al.'s archive holds it as sumdata/DUC2003/",
                 optional=True),
)


def headline_status(data_dir: str | os.PathLike[str] | None = None) -> list[tuple[HeadlineData, list[str]]]:
    """Each :data:`HEADLINE_DATA` piece with its files absent from the data directory (empty: all there)."""
    root = resolve_data_dir(data_dir)
    return [(piece, [f for f in piece.files if not (root / f).is_file()]) for piece in HEADLINE_DATA]


@dataclass
class TrainingPairs:
    """The pairs a summariser trains and is evaluated on during training.

    Attributes:
        train: training pairs (with the filtered extra pairs when asked for).
        valid: dev pairs.
        extra_dropped: extra pairs removed because their article is in the test input or the dev pairs.
    """

    train: Pairs
    valid: Pairs
    extra_dropped: int = 0


def require_files(what: str, relative: list[str], data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data directory, once every ``relative`` file is in it.

    Raises:
        DataError: one line naming the files that are not there, the data directory and where the
            files come from.
    """
    root = resolve_data_dir(data_dir)
    absent = [r for r in relative if not (root / r).is_file()]
    if absent:
        sources = [f"{', '.join(f for f in piece.files if f in absent)} (get them from {piece.source})"
                   for piece in HEADLINE_DATA if any(f in absent for f in piece.files)]
        sources += [f for f in absent if not any(f in piece.files for piece in HEADLINE_DATA)]
        raise DataError(f"{what} not in your data directory {root} ({data_dir_origin(data_dir)}; set it with "
                        f"--data-dir or $SOHSM_DATA); put there: {'; '.join(sources)} "
                        "(`sohsm data list` shows what is present)")
    return root


def load_training_pairs(data_dir: str | os.PathLike[str] | None = None, extra: bool = False) -> TrainingPairs:
    """Gigaword's training and dev pairs from ``data_dir`` (default ``$SOHSM_DATA``).

    Raises:
        DataError: a file is missing or unreadable, has an empty line, or is not aligned with its partner.
    """
    needed = [*_TRAIN, *_VALID]
    if extra:
        needed += [EVAL_SETS["gigaword"][0], *(f for pair in _EXTRA for f in pair)]
    root = require_files("Gigaword's training pairs", needed, data_dir)
    train = read_pairs(root / _TRAIN[0], root / _TRAIN[1])
    valid = read_pairs(root / _VALID[0], root / _VALID[1])
    dropped = 0
    if extra:
        test = read_pairs(root / EVAL_SETS["gigaword"][0], None, unk_alias=TEST_UNK)
        for source, target in _EXTRA:
            more, n = drop_overlap(read_pairs(root / source, root / target), test, valid)
            train, dropped = train + more, dropped + n
    return TrainingPairs(train, valid, dropped)


def load_pairs_folder(folder: str | os.PathLike[str]) -> TrainingPairs:
    """The training and dev pairs of a folder :func:`sohsm.data.gigaword.make_pairs` wrote.

    Raises:
        DataError: the folder is missing, lacks one of its four files (naming them), or a file is
            unreadable, has an empty line or is not aligned with its partner.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: no such folder of headline pairs")
    needed = [name for names in PAIR_FILES.values() for name in names]
    absent = [name for name in needed if not (root / name).is_file()]
    if absent:
        raise DataError(f"{root}: not a folder of headline pairs ({', '.join(absent)} missing; it needs "
                        f"{', '.join(needed)})")
    train = read_pairs(root / PAIR_FILES["train"][0], root / PAIR_FILES["train"][1])
    valid = read_pairs(root / PAIR_FILES["valid"][0], root / PAIR_FILES["valid"][1])
    return TrainingPairs(train, valid)


def resolve_eval_set(name_or_input: str, data_dir: str | os.PathLike[str] | None = None,
                     references: list[str] | None = None) -> tuple[Path, list[Path]]:
    """The input file and reference files of a named evaluation set, or of your own input file.

    Raises:
        DataError: an unknown name that is not a file either.
    """
    if name_or_input in EVAL_SETS:
        source, refs = EVAL_SETS[name_or_input]
        root = require_files(f"the {name_or_input} evaluation set", [source, *(references or refs)], data_dir)
        return root / source, [root / r for r in (references or refs)]
    path = Path(name_or_input).expanduser()
    if not path.is_file():
        raise DataError(f"{name_or_input!r} is neither an evaluation set ({', '.join(EVAL_SETS)}) nor a file")
    return path, [Path(r).expanduser() for r in references or []]


def read_inputs(path: str | os.PathLike[str]) -> Pairs:
    """Articles to decode, ``UNK`` read as ``<unk>`` (as the test set writes it)."""
    return read_pairs(path, None, unk_alias=TEST_UNK)


def read_references(paths: Sequence[str | os.PathLike[str]], n_lines: int | None = None,
                    aligned_with: str | os.PathLike[str] | None = None) -> list[list[str]]:
    """Reference headlines as text: ``refs[i]`` holds line ``i`` of every reference file.

    Raises:
        DataError: no file, a missing or unreadable one, an empty line, or a line count
            other than ``n_lines`` (the hypotheses' or the input's).
    """
    if not paths:
        raise DataError("no reference files given")
    columns = []
    for path in paths:
        lines = [" ".join(words) for words in read_lines(path)]
        if n_lines is not None:
            check_aligned(aligned_with or "the input", n_lines, path, len(lines))
        n_lines = len(lines)
        columns.append(lines)
    return [list(row) for row in zip(*columns)]
