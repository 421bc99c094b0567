"""The registered heads' names and option names, without importing torch: what a command's ``--help`` lists.

The registry (:mod:`sohsm.heads.registry`) is filled by importing every head, which imports torch (seconds);
``sohsm lm train --help`` needs only the names. This table is written from the registry by
``python -m sohsm.head_catalogue`` and a test checks that the two agree, so it cannot go stale unnoticed.
Building or checking a head always asks the registry itself.

Beside the table, the roles a run or a task names a head for (its default, the reference of a comparison,
word2vec's two output layers), so that code outside ``heads/`` never writes a head's name itself.
"""
from __future__ import annotations

import sys
from pathlib import Path

#: head name -> its option names in the registry's order (``None``: a factory whose options are not checked)
HEADS: dict[str, tuple[str, ...] | None] = {
    # -- written by `python -m sohsm.head_catalogue`: do not edit by hand --
    "adaptive": ("cutoffs", "div_value", "head_bias"),
    "dsoftmax": ("cutoffs", "dims", "bias"),
    "full": ("bias",),
    "importance_sampling": ("seed", "n_samples", "noise_power", "bias", "remove_accidental_hits", "sparse",
                            "noise_per_row"),
    "nce": ("seed", "n_samples", "noise_power", "sparse", "bias_init", "noise_per_row"),
    "pmi": ("seed", "n_samples", "noise_power", "sparse", "shift", "noise_per_row"),
    "self_organized": ("n_clusters", "init", "shortlist", "projection", "seed", "word_dim", "div_value", "cutoffs",
                       "backend", "cluster_bias", "unseen_words", "gamma", "freq_budget", "update_every",
                       "reclusters_per_epoch", "first_update", "update_growth", "smoothing", "solver", "q_clusters",
                       "freeze_after_tokens", "reset_on_freeze", "moved_vectors", "stay_margin"),
    "tree": ("tree", "depth", "branching", "bias", "seed", "sparse"),
    "tree_file": ("path", "sparse"),
    "tree_huffman": ("seed", "sparse"),
    "tree_random": ("seed", "sparse"),
    "two_level_frequency": ("n_clusters", "projection", "seed", "word_dim", "div_value", "cutoffs", "backend",
                            "cluster_bias"),
    "two_level_random": ("n_clusters", "projection", "seed", "word_dim", "div_value", "cutoffs", "backend",
                         "cluster_bias"),
    # -- end of the written table --
}

#: the head a run trains when it names none: the paper's self-organized hierarchical softmax
DEFAULT_HEAD = "self_organized"
#: the exact softmax over every word, which the other heads are measured against (a comparison's speed column)
REFERENCE_HEAD = "full"
#: word2vec's own output layer, hierarchical softmax over a Huffman tree: a word-embedding run's default head
WORD2VEC_HEAD = "tree_huffman"
#: word2vec's negative sampling (the head's ``"word2vec"`` preset, :func:`sohsm.heads.preset`, makes it exactly so)
NEGATIVE_SAMPLING_HEAD = "pmi"


def head_names() -> list[str]:
    """The heads sohsm registers, sorted (the registry's :func:`~sohsm.heads.head_names`, read without torch)."""
    return sorted(HEADS)


def option_names(name: str) -> tuple[str, ...] | None:
    """Head ``name``'s option names (``None``: not checked); a ``KeyError`` for a name not in the table."""
    return HEADS[name]


def from_registry() -> dict[str, tuple[str, ...] | None]:
    """The table as the registry has it now (imports every head, and torch)."""
    from sohsm.heads import head_names as registered, head_options

    return {name: None if (options := head_options(name)) is None else tuple(options) for name in registered()}


def _render(table: dict[str, tuple[str, ...] | None]) -> list[str]:
    lines = []
    for name, options in table.items():
        start = f'    "{name}": '
        if options is None:
            lines.append(start + "None,")
            continue
        items = [f'"{o}"' for o in options]
        text = start + "(" + ", ".join(items) + ("," if len(items) == 1 else "") + "),"
        if len(text) <= 120:
            lines.append(text)
            continue
        indent, line = " " * (len(start) + 1), start + "("  # wrapped at 120 columns under the opening bracket
        for i, item in enumerate(items):
            piece = item + ("," if i < len(items) - 1 else "),")
            if len(line) + len(piece) + 1 > 120:
                lines.append(line.rstrip())
                line = indent
            line += piece + " "
        lines.append(line.rstrip())
    return lines


def write(path: Path = Path(__file__)) -> bool:
    """Rewrite the table in this file from the registry; whether it changed."""
    text = path.read_text(encoding="utf-8")
    start, end = "    # -- written by", "    # -- end of the written table --"
    head, rest = text.split(start, 1)
    first_line, _ = rest.split("\n", 1)
    _, tail = rest.split(end, 1)
    new = head + start + first_line + "\n" + "\n".join(_render(from_registry())) + "\n" + end + tail
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    print("rewrote the catalogue" if write() else "the catalogue is current")
    sys.exit(0)
