"""Hierarchies for a run's head: read from a file or a trained run, mapped onto the run's vocabulary.

``--clusters-from FILE|RUN`` (``data.clusters_from``) names the source; the
``tree`` head takes the whole hierarchy, the two-level heads (fixed or
self-organized) a two-level clustering of it. Brown paths files give a
two-level head one cluster per bit string, or per ``data.clusters_cut``-bit prefix.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from sohsm.clustering.hierarchy import hierarchy_to_assignment
from sohsm.clustering.hierarchy_files import detect_format, ids_to_words, map_to_vocab, read_hierarchy
from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head, HierarchicalHead, tree_heads
from sohsm.train.loading import load_run


@dataclass(frozen=True)
class LoadedHierarchy:
    """A hierarchy over a run's vocabulary.

    Attributes:
        tree: nested lists of word ids covering the vocabulary once.
        source: the file or run it came from; format: its format.
        missing: vocabulary words the source lacks (under the fallback node); missing_mass: their token share.
        unknown: words of the source outside the vocabulary (left out).
    """

    tree: list
    source: str
    format: str
    missing: int
    missing_mass: float
    unknown: int

    def summary(self) -> str:
        """One line: where the hierarchy came from and what the fallback node holds."""
        return (f"clusters from {self.source} ({self.format}): {self.missing:,} vocabulary words missing "
                f"({100 * self.missing_mass:.2f}% of training tokens) -> fallback node; "
                f"{self.unknown:,} words of the source not in the vocabulary, left out")


def head_hierarchy(head: Head) -> list:
    """The structure of a trained head as nested lists of word ids.

    Raises:
        ValueError: the head has neither word clusters nor a tree.
    """
    if isinstance(head, HierarchicalHead):
        return head.hierarchy()
    raise ValueError(f"the {type(head).__name__} head has no word clusters or tree to export")


def read_run_head(run_dir: str | os.PathLike[str]) -> tuple[Head, Vocabulary, str]:
    """``(head, vocabulary, head name)`` of the best checkpoint of a run of any task."""
    run = load_run(run_dir)
    return run.head, run.vocab, run.config.head.name


def run_hierarchy_words(run_dir: str | os.PathLike[str]) -> list:
    """The hierarchy of a trained run (of any task), as nested lists of words."""
    head, vocab, _ = read_run_head(run_dir)
    return ids_to_words(head_hierarchy(head), vocab.itos)


def load_hierarchy(source: str | os.PathLike[str], vocab: Vocabulary, format: str | None = None,
                   cut: int | None = None, two_level: bool = False) -> LoadedHierarchy:
    """Read a hierarchy from a file or a run directory and map it onto ``vocab``.

    Args:
        format: one of :data:`sohsm.train.config.CLUSTERS_FORMATS`; ``None``: a folder is a run, a file's format
            is detected.
        cut: brown files: a two-level clustering by this many leading bits.
        two_level: the head takes a two-level clustering: brown files without ``cut``
            give one cluster per bit string, and the missing words one fallback cluster.

    Raises:
        ValueError: a bad file (one line: file, line, problem), a run without clusters, or a
            hierarchy deeper than two levels when ``two_level``.
    """
    path = Path(source)
    if format == "run" or (format is None and path.is_dir()):
        if cut is not None:
            raise ValueError("a prefix cut applies to brown paths files only, not to a run")
        words, format = run_hierarchy_words(path), "run"
    else:
        if format == "brown" or (format is None and cut is not None):
            format = "brown"
        format = format or detect_format(path)
        if two_level and cut is None and format == "brown":
            cut = 1 << 30  # every bit string its own cluster
        words = read_hierarchy(path, format, cut)
    counts = vocab.counts
    branching = None if two_level else max(2, math.ceil(math.sqrt(len(vocab))))
    mapped = map_to_vocab(words, vocab.itos, counts, fallback_branching=branching)
    if two_level:
        try:
            hierarchy_to_assignment(mapped.tree, len(vocab))
        except ValueError as error:  # a deeper hierarchy
            deep = " or ".join(f"the {name!r} head" for name in tree_heads())
            raise ValueError(f"{source}: {error}; a two-level head takes two levels, {deep} any depth"
                             + (" (or cut Brown paths at a prefix length)" if format == "brown" else "")) from None
    return LoadedHierarchy(mapped.tree, str(source), format, mapped.missing, mapped.missing_mass, mapped.unknown)
