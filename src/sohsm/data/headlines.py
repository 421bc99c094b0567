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
        raise DataError(f"{what} not in your data directory {root} ({data_dir_origin(data_dir)}; set it with "
                        f"--data-dir or $SOHSM_DATA): put {', '.join(absent)} there (docs/s2s.md, section "
                        "Data, says where they come from)")
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


def read_references(paths: list[str | os.PathLike[str]], n_lines: int | None = None,
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
