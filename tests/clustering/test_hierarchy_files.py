"""Hierarchy files: nested JSON lists, Brown paths, word<TAB>class; errors name file and line; round trips."""
from __future__ import annotations

import pytest
import torch

from sohsm import TreeSoftmax, TwoLevelSoftmax
from sohsm.clustering.hierarchy import assignment_to_hierarchy, check_hierarchy, hierarchy_to_assignment
from sohsm.clustering.hierarchy_files import (
    HierarchyFileError,
    brown_cut_width,
    detect_format,
    format_hierarchy,
    ids_to_words,
    map_to_vocab,
    read_hierarchy,
)

BROWN = "0\tthe\t50\n0\ta\t30\n10\tdog\t5\n110\tcat\t4\n111\tbird\t2\n"
WORDS = ["the", "a", "dog", "cat", "bird", "fish", "<unk>"]


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_brown_paths_give_the_trie_or_a_prefix_cut(tmp_path):
    path = write(tmp_path, "paths.txt", BROWN)
    assert detect_format(path) == "brown"
    assert read_hierarchy(path) == [["the", "a"], ["dog", ["cat", "bird"]]]
    assert read_hierarchy(path, cut=1) == [["the", "a"], ["dog", "cat", "bird"]]
    assert read_hierarchy(path, cut=99) == [["the", "a"], ["dog"], ["cat"], ["bird"]]


def test_tsv_and_json_are_read(tmp_path):
    tsv = write(tmp_path, "classes.txt", "the\t0\ndog\t1\na\t0\ncat\tanimals\n")
    assert detect_format(tsv) == "tsv"
    assert read_hierarchy(tsv) == [["the", "a"], ["dog"], ["cat"]]
    js = write(tmp_path, "tree.json", '[["the", "a"],\n [["dog", "cat"], "bird"], "fish"]')
    assert detect_format(js) == "json"
    assert read_hierarchy(js) == [["the", "a"], [["dog", "cat"], "bird"], "fish"]


@pytest.mark.parametrize("name, text, line, problem", [
    ("a.json", '[["the", "a"],\n ["dog", []]]', 2, "empty cluster"),
    ("b.json", '[["the", "a"],\n\n ["dog", "the"]]', 3, "'the' appears twice (first on line 1)"),
    ("c.json", '[["the", "a"]\n ["dog"]]', 2, "expected ',' or ']'"),
    ("d.json", '[["the", 3]]', 1, "expected a word in double quotes"),
    ("e.json", '[["the", "a"]', 1, "a ']' is missing"),
    ("f.txt", "0\tthe\t5\n01\tthe\t3\n", 2, "'the' appears twice"),
    ("g.txt", "0\tthe\t5\n0x1\ta\t3\n", 2, "malformed path"),
    ("h.txt", "0\tthe\t5\n01\ta\n", 2, "malformed line"),
    ("i.txt", "0\tthe\t5\n01\ta\tmany\n", 2, "malformed count"),
    ("j.tsv", "the\t0\na\t1\nthe\t2\n", 3, "appears twice"),
    ("k.tsv", "the\t0\na 1\n", 2, "malformed line"),
])
def test_bad_files_name_file_line_and_problem(tmp_path, name, text, line, problem):
    path = write(tmp_path, name, text)
    fmt = {"json": "json", "txt": "brown", "tsv": "tsv"}[name.rsplit(".", 1)[1]]
    with pytest.raises(HierarchyFileError) as info:
        read_hierarchy(path, fmt)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ") and problem in message and "\n" not in message
    assert isinstance(info.value, ValueError) and info.value.line == line


def test_missing_words_go_to_a_fallback_node_with_their_mass(tmp_path):
    tree = read_hierarchy(write(tmp_path, "paths.txt", BROWN + "0\tzebra\t1\n"))
    counts = [50, 30, 5, 4, 2, 7, 2]
    mapped = map_to_vocab(tree, WORDS, counts)
    assert mapped.missing == 2 and mapped.unknown == 1  # fish, <unk> missing; zebra not in the vocabulary
    assert mapped.missing_mass == pytest.approx(9 / 100)
    assert mapped.tree[-1] == [5, 6]  # the fallback node, last under the root
    check_hierarchy(mapped.tree, len(WORDS))  # every word once


def _two_level(n: int = 40, clusters: int = 7) -> TwoLevelSoftmax:
    torch.manual_seed(0)
    return TwoLevelSoftmax(6, n, assignment="random", n_clusters=clusters, seed=4).double()


@pytest.mark.parametrize("fmt", ["json", "brown", "tsv"])
def test_export_then_import_gives_the_same_clustering_and_log_probs(tmp_path, fmt):
    head = _two_level()
    itos = [f"w{i}" for i in range(head.n_classes)]
    tree = assignment_to_hierarchy(head.assignment)
    path = write(tmp_path, f"clusters.{fmt}", format_hierarchy(ids_to_words(tree, itos), fmt, {w: 1 for w in itos}))
    cut = brown_cut_width(tree) if fmt == "brown" else None
    mapped = map_to_vocab(read_hierarchy(path, fmt, cut), itos)
    assert mapped.missing == 0 and mapped.unknown == 0
    assignment = hierarchy_to_assignment(mapped.tree, head.n_classes)
    assert torch.equal(assignment, head.assignment)  # same clusters, same ids
    again = TwoLevelSoftmax(6, head.n_classes, assignment=assignment, n_clusters=head.n_clusters).double()
    again.load_state_dict(head.state_dict())
    hidden = torch.randn(9, 6, dtype=torch.float64)
    torch.testing.assert_close(again.log_prob(hidden), head.log_prob(hidden), rtol=0, atol=0)


def test_a_deep_tree_round_trips_through_json(tmp_path):
    torch.manual_seed(1)
    head = TreeSoftmax(6, 50, depth=3, bias=True).double()
    itos = [f"w{i}" for i in range(50)]
    path = write(tmp_path, "tree.json", format_hierarchy(ids_to_words(head.hierarchy(), itos), "json"))
    mapped = map_to_vocab(read_hierarchy(path), itos)
    again = TreeSoftmax(6, 50, tree=mapped.tree, bias=True).double()
    again.load_state_dict(head.state_dict())
    assert again.hierarchy() == head.hierarchy()
    hidden = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(again.log_prob(hidden), head.log_prob(hidden), rtol=0, atol=0)


def test_tsv_refuses_a_deep_tree_and_brown_keeps_it(tmp_path):
    tree = [["a", "b"], [["c", "d"], "e"]]
    with pytest.raises(ValueError, match="two-level"):
        format_hierarchy(tree, "tsv")
    path = write(tmp_path, "deep.txt", format_hierarchy(tree, "brown"))
    assert read_hierarchy(path, "brown") == tree
