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
from typing import Any

from torch import Tensor

from sohsm.clustering.hierarchy import assignment_to_hierarchy, children_to_hierarchy, hierarchy_to_assignment
from sohsm.clustering.hierarchy_files import detect_format, ids_to_words, map_to_vocab, read_hierarchy
from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head, head_options



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
    if callable(getattr(head, "hierarchy", None)):
        return head.hierarchy()
    if isinstance(getattr(head, "assignment", None), Tensor):
        return assignment_to_hierarchy(head.assignment)
    tree = getattr(head, "tree", None)
    if isinstance(tree, Tensor) and tree.dim() == 2:
        return children_to_hierarchy(tree.cpu())
    raise ValueError(f"the {type(head).__name__} head has no word clusters or tree to export")


def run_hierarchy_words(run_dir: str | os.PathLike[str]) -> list:
    """The hierarchy of a trained run (``lm`` or ``s2s``), as nested lists of words."""
    head, vocab = load_any_run(run_dir)
    return ids_to_words(head_hierarchy(head), vocab.itos)


def load_any_run(run_dir: str | os.PathLike[str]) -> tuple[Head, Vocabulary]:
    """``(head, vocabulary)`` of the best checkpoint of a language-model or summariser run."""
    run = load_trained_run(run_dir)
    return run.head, run.vocab


def load_trained_run(run_dir: str | os.PathLike[str], checkpoint: str = "best"):
    """A language-model run (:class:`~sohsm.train.run.LoadedRun`) or a summariser
    (:class:`~sohsm.train.s2s_run.LoadedSummariser`), whichever ``run_dir`` holds; both have
    ``path``, ``step``, ``config.head``, ``head`` and ``vocab``."""
    from sohsm.train.checkpoint import CHECKPOINT_FORMAT, S2S_CHECKPOINT_FORMAT, checkpoint_path, load_checkpoint
    from sohsm.train.run import load_run
    from sohsm.train.s2s_run import load_summariser

    data = load_checkpoint(checkpoint_path(Path(run_dir), checkpoint),
                           formats=(CHECKPOINT_FORMAT, S2S_CHECKPOINT_FORMAT))
    if data.get("format") == S2S_CHECKPOINT_FORMAT:
        return load_summariser(run_dir, checkpoint)
    return load_run(run_dir, checkpoint)


def load_hierarchy(source: str | os.PathLike[str], vocab: Vocabulary, format: str | None = None,
                   cut: int | None = None, two_level: bool = False) -> LoadedHierarchy:
    """Read a hierarchy from a file or a run directory and map it onto ``vocab``.

    Args:
        format: one of :data:`sohsm.train.config.CLUSTERS_FORMATS`; ``None``: a folder is a run, a file's format is detected.
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
            raise ValueError(f"{source}: {error}; a two-level head takes two levels, the 'tree' head any depth"
                             + (" (or cut Brown paths at a prefix length)" if format == "brown" else "")) from None
    return LoadedHierarchy(mapped.tree, str(source), format, mapped.missing, mapped.missing_mass, mapped.unknown)


def takes_tree(head_name: str) -> bool:
    """Whether head ``head_name`` takes a whole hierarchy (a ``tree`` option) rather than clusters."""
    return "tree" in (head_options(head_name) or {})


def hierarchy_options(head_name: str, options: dict[str, Any], loaded: LoadedHierarchy, n_words: int) -> tuple[dict, Tensor | None]:
    """``(options, assignment)``: the head's options with the hierarchy, and the clusters to set after building.

    Raises:
        ValueError: the head takes neither a tree nor clusters.
    """
    takes = head_options(head_name) or {}
    if takes_tree(head_name):
        return {**options, "tree": loaded.tree}, None
    if "n_clusters" not in takes:
        raise ValueError(f"head {head_name!r} takes no hierarchy; use the 'tree' head or a two-level head")
    assignment = hierarchy_to_assignment(loaded.tree, n_words)
    return {**options, "n_clusters": int(assignment.max()) + 1}, assignment


def set_clusters(head: Head, assignment: Tensor, head_name: str) -> None:
    """Give a two-level head the clusters ``assignment``, fixed (a self-organized head stops re-clustering)."""
    if not hasattr(head, "set_assignment"):
        raise ValueError(f"head {head_name!r} has no word clusters to set")
    head.set_assignment(assignment.to(head.assignment.device))
    if hasattr(head, "freeze"):
        head.freeze()
