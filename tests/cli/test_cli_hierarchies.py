"""`sohsm clusters export` and `--clusters-from FILE|RUN` on runs trained on a slice of real PTB text."""
from __future__ import annotations

import json

import pytest
import torch

STEPS = ["--max-tokens", 20 * 160, "--eval-every", 0]


@pytest.fixture(scope="module")
def source(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A two-level run with random clusters, and its clusters exported in every format."""
    root = tmp_path_factory.mktemp("hierarchies")
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_random", "--run-dir", root / "src",
                       *small, *STEPS)
    assert code == 0, err
    for fmt in ("json", "brown", "tsv"):
        code, _, err = cli("clusters", "export", root / "src", "--format", fmt, "--out", root / f"clusters.{fmt}")
        assert code == 0, err
    return root


def _head_state(run):
    return torch.load(run / "last.pt", map_location="cpu", weights_only=True)["head"]


def _cut_width(source) -> int:
    """Bits of the cluster ids in the brown export: ceil(log2(clusters))."""
    return (len(json.loads((source / "clusters.json").read_text())) - 1).bit_length()


@pytest.mark.parametrize("fmt", ["json", "tsv", "brown"])
def test_exported_clusters_train_a_run_with_the_same_clusters(source, ptb_slice, small, cli, tmp_path, fmt):
    run = tmp_path / "run"
    extra = ["--clusters-cut", _cut_width(source)] if fmt == "brown" else []
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_random", "--clusters-from",
                       source / f"clusters.{fmt}", *extra, "--run-dir", run, *small, *STEPS, "--seed", 7)
    assert code == 0, err
    assert torch.equal(_head_state(run)["assignment"], _head_state(source / "src")["assignment"])


def test_brown_cut_width_is_reported_and_json_holds_words(source, cli):
    code, out, err = cli("clusters", "export", source / "src", "--format", "brown", "--out", source / "again.txt")
    assert code == 0 and f"--clusters-cut {_cut_width(source)}" in err
    tree = json.loads((source / "clusters.json").read_text())
    assert all(isinstance(c, list) and all(isinstance(w, str) for w in c) for c in tree) and "the" in sum(tree, [])
    code, out, _ = cli("clusters", "export", source / "src", "--format", "tsv")
    assert code == 0 and out.splitlines()[0].count("\t") == 1


def test_tree_head_takes_a_json_tree_and_a_run(source, ptb_slice, small, cli, tmp_path):
    for name, clusters in (("file", source / "clusters.json"), ("run", source / "src")):
        run = tmp_path / name
        code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "tree", "--clusters-from", clusters,
                           "--run-dir", run, *small, *STEPS)
        assert code == 0, err
        code, out, err = cli("clusters", "export", run, "--format", "json")
        assert code == 0, err
        assert json.loads(out) == json.loads((source / "clusters.json").read_text())


def test_missing_words_are_reported(source, ptb_slice, small, cli, tmp_path):
    partial = tmp_path / "few.tsv"
    partial.write_text("the\t0\nof\t0\nzebra-unseen\t1\ncompany\t1\n")
    quiet = [a for a in small if a != "--quiet"]
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_random", "--clusters-from",
                         partial, "--run-dir", tmp_path / "run", *quiet, *STEPS)
    assert code == 0, err
    line = next(row for row in (out + err).splitlines() if "vocabulary words missing" in row)
    vocab = json.loads((tmp_path / "run" / "vocab.json").read_text())
    n_words = len(vocab["itos"]) if isinstance(vocab, dict) and "itos" in vocab else None
    assert f"{n_words - 3:,} vocabulary words missing" in line if n_words else "missing" in line
    assert "1 words of the source not in the vocabulary" in line
    assert _head_state(tmp_path / "run")["assignment"].max() == 2  # two clusters and the fallback


@pytest.mark.parametrize("text, problem", [
    ("the\t0\nof\t1\nthe\t2\n", ":3: the word 'the' appears twice"),
    ('[["the", "of"],\n []]', ":2: an empty cluster"),
])
def test_a_bad_file_stops_with_one_line_and_writes_nothing(ptb_slice, small, cli, tmp_path, text, problem):
    bad = tmp_path / ("bad.json" if text.startswith("[") else "bad.tsv")
    bad.write_text(text)
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "tree", "--clusters-from", bad,
                         "--run-dir", tmp_path / "run", *small, *STEPS)
    assert code == 2 and problem in err and str(bad) in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_head_without_clusters_refuses_a_hierarchy(source, ptb_slice, small, cli, tmp_path):
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--clusters-from",
                       source / "clusters.json", "--run-dir", tmp_path / "run", *small, *STEPS)
    assert code == 2 and "takes no hierarchy" in err and not (tmp_path / "run").exists()


def test_a_deep_tree_is_refused_by_a_two_level_head(ptb_slice, small, cli, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('[["the", ["of", "a"]], ["company"]]')
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "two_level_random", "--clusters-from", deep,
                       "--run-dir", tmp_path / "run", *small, *STEPS)
    assert code == 2 and "3 levels deep" in err and "'tree' head" in err and not (tmp_path / "run").exists()
