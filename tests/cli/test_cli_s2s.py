"""`sohsm s2s` end to end on 200 real pairs: titles, a title LM, training with its clusters, decoding, scoring."""
import json

import pytest
import torch

from sohsm.clustering.hierarchy import assignment_to_hierarchy
from sohsm.train import read_metrics

TINY = ["--emb-size", "16", "--hidden-size", "16", "--batch-size", "32", "--no-extra", "--quiet"]


def _one_line_error(code, err):
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data, cli):
    """A title LM and a summariser that takes its clusters, a few steps each."""
    root = tmp_path_factory.mktemp("s2s-runs")
    data = ["--data-dir", tiny_data]
    code, out, err = cli("s2s", "titles", *data, "--no-extra", "--out", root / "titles")
    assert code == 0 and "200 titles" in out, err
    code, _, err = cli("lm", "train", "--corpus", root / "titles", "--head", "self_organized", "--run-dir",
                       root / "lm", "--emb-size", "16", "--hidden-size", "16", "--batch-size", "8", "--bptt", "5",
                       "--max-tokens", 400, "--quiet")
    assert code == 0, err
    code, out, err = cli("s2s", "train", *data, *TINY, "--head", "self_organized", "--clusters-from", root / "lm",
                         "--run-dir", root / "s2s", "--max-tokens", 1500, "--eval-every", 3, "--log-every", 1)
    assert code == 0, err
    return root, data


def test_training_writes_a_run_with_the_lms_clusters(trained):
    root, _ = trained
    records = read_metrics(root / "s2s" / "metrics.jsonl")
    assert [r["kind"] for r in records if r["kind"] == "eval"] and not [r for r in records if r["kind"] == "recluster"]
    lm = torch.load(root / "lm" / "best.pt", weights_only=True)["head"]["assignment"]
    s2s = torch.load(root / "s2s" / "best.pt", weights_only=True)
    assert torch.equal(s2s["head"]["assignment"], lm)  # fixed: the summariser never re-clusters
    assert json.loads((root / "s2s" / "config.json").read_text())["task"] == "s2s"


def test_resume_continues_exactly(trained, cli):
    root, data = trained
    common = [*data, *TINY, "--head", "full", "--log-every", 1, "--eval-every", 0]
    assert cli("s2s", "train", *common, "--run-dir", root / "straight", "--max-tokens", 1200)[0] == 0
    assert cli("s2s", "train", *common, "--run-dir", root / "halves", "--max-tokens", 500)[0] == 0
    code, _, err = cli("s2s", "train", "--run-dir", root / "halves", "--resume", "--quiet", "--max-tokens", 1200)
    assert code == 0, err
    losses = [[(r["step"], r["nll_nats"]) for r in read_metrics(run / "metrics.jsonl")
               if r["kind"] == "train" and not r.get("partial")] for run in (root / "straight", root / "halves")]
    assert [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
    assert max(abs(a - b) for (_, a), (_, b) in zip(*losses)) <= 1e-6


def test_decode_and_score_gigaword_and_duc(trained, cli):
    root, data = trained
    code, out, err = cli("s2s", "decode", root / "s2s", "--input", "gigaword", *data, "--out", root / "giga.txt")
    assert code == 0 and "decoded 30 headlines" in err, err
    assert len((root / "giga.txt").read_text().splitlines()) == 30
    code, out, err = cli("s2s", "score", root / "giga.txt", "--references", "gigaword", *data, "--json")
    assert code == 0, err
    scores = json.loads(out)
    assert scores["measure"] == "fmeasure" and scores["count"] == 30 and 0 <= scores["rouge1"] <= 100

    code, out, err = cli("s2s", "decode", root / "s2s", "--input", "duc2004", *data, "--duc", "--quiet",
                         "--beam", 2)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 30 and all(len(line.split()) == 30 for line in lines)  # no end tag: exactly 30 words
    (root / "duc.txt").write_text(out)
    code, out, err = cli("s2s", "score", root / "duc.txt", "--references", "duc2004", *data, "--duc")
    assert code == 0 and "(recall, 30 headlines)" in out and "-b 75" in out, err


# -- bad input: one line, non-zero exit, nothing written --------------------------------------------
def test_bad_inputs_are_one_line_and_write_nothing(trained, tmp_path, cli):
    root, data = trained
    hypotheses = tmp_path / "h.txt"
    hypotheses.write_text("a b\nc d\n")
    short = tmp_path / "r.txt"
    short.write_text("a b\n")
    assert "has 1 lines but" in _one_line_error(*cli("s2s", "score", hypotheses, "--references", short)[::2])
    empty = tmp_path / "e.txt"
    empty.write_text("a b\n\n")
    assert "line 2 is empty" in _one_line_error(*cli("s2s", "score", hypotheses, "--references", empty)[::2])
    assert "no such file" in _one_line_error(*cli("s2s", "score", hypotheses, "--references",
                                                  tmp_path / "missing.txt")[::2])

    articles = tmp_path / "articles.txt"
    articles.write_text("one article\n\nanother\n")
    out = tmp_path / "out.txt"
    line = _one_line_error(*cli("s2s", "decode", root / "s2s", "--input", articles, "--out", out)[::2])
    assert "line 2 is empty" in line and not out.exists()


def test_a_clusters_run_with_another_vocabulary_is_refused(trained, tmp_path, cli):
    root, data = trained
    code, _, err = cli("s2s", "train", *data, *TINY, "--min-count", 2, "--head", "self_organized",
                       "--clusters-from", root / "lm", "--run-dir", tmp_path / "run", "--max-tokens", 100)
    assert "another vocabulary" in _one_line_error(code, err)
    assert not (tmp_path / "run").exists()
    code, _, err = cli("s2s", "train", *data, *TINY, "--head", "full", "--clusters-from", root / "lm",
                       "--run-dir", tmp_path / "run", "--max-tokens", 100)
    assert "no word clusters" in _one_line_error(code, err) and not (tmp_path / "run").exists()


def test_unaligned_training_files_are_refused(tmp_path, tiny_data, cli):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    title = data / "gigaword" / "train" / "train.title.txt"
    title.write_text("".join(title.read_text().splitlines(keepends=True)[:-1]))
    code, _, err = cli("s2s", "train", "--data-dir", data, *TINY, "--head", "full", "--run-dir", tmp_path / "run")
    assert "has 199 lines but" in _one_line_error(code, err) and not (tmp_path / "run").exists()


def test_hierarchy_files_and_the_tree_head(trained, tmp_path, cli):
    """Exported clusters as a file: a two-level head takes them, the tree head the whole tree; both decode."""
    root, data = trained
    clusters = tmp_path / "clusters.tsv"
    assert cli("clusters", "export", root / "lm", "--format", "tsv", "--out", clusters)[0] == 0
    code, _, err = cli("s2s", "train", *data, *TINY, "--head", "two_level_random", "--clusters-from", clusters,
                       "--run-dir", tmp_path / "two", "--max-tokens", 300, "--eval-every", 0)
    assert code == 0, err
    lm = torch.load(root / "lm" / "best.pt", weights_only=True)["head"]["assignment"]
    taken = torch.load(tmp_path / "two" / "last.pt", weights_only=True)["head"]["assignment"]
    assert assignment_to_hierarchy(taken) == assignment_to_hierarchy(lm)  # the same clusters (empty ones dropped)
    code, _, err = cli("s2s", "train", *data, *TINY, "--head", "tree", "--clusters-from", root / "lm",
                       "--run-dir", tmp_path / "tree", "--max-tokens", 300, "--eval-every", 0)
    assert code == 0, err
    code, out, err = cli("s2s", "decode", tmp_path / "tree", "--checkpoint", "last", "--input", "gigaword",
                         *data[:2], "--quiet", "--max-len", 3)
    assert code == 0 and out.count("\n") > 0, err


def test_a_beam_that_does_not_fit_in_memory_is_refused_in_one_line(trained, tmp_path, cli, monkeypatch):
    from sohsm.models import beam

    root, data = trained
    out = tmp_path / "giga.txt"
    code, _, err = cli("s2s", "decode", root / "s2s", "--input", "gigaword", *data, "--beam", 10**9, "--quiet")
    assert code == 0, err  # cut to the vocabulary, and the vocabulary's beam fits
    monkeypatch.setattr(beam, "available_memory_bytes", lambda device: 2**20)
    line = _one_line_error(*cli("s2s", "decode", root / "s2s", "--input", "gigaword", *data, "--beam", 10**9,
                                "--out", out)[::2])
    assert "cut to the vocabulary's" in line and "the widest that fits is" in line and not out.exists()


def test_missing_gigaword_or_duc_names_the_files_and_where_they_go(tmp_path, cli):
    line = _one_line_error(*cli("s2s", "train", "--data-dir", tmp_path, *TINY, "--head", "full", "--run-dir",
                                tmp_path / "run")[::2])
    assert f"Gigaword's training pairs not in your data directory {tmp_path} (given" in line
    assert "put there: gigaword/train/train.article.txt, gigaword/train/train.title.txt" in line
    assert "(get them from Rush et al.'s released `sumdata` archive" in line and "sumdata/train/" in line
    assert not (tmp_path / "run").exists()
    (tmp_path / "h.txt").write_text("a headline\n")
    line = _one_line_error(*cli("s2s", "score", tmp_path / "h.txt", "--references", "duc2004", "--duc",
                                "--data-dir", tmp_path)[::2])
    assert "the duc2004 evaluation set not in your data directory" in line and "duc2004/task1_ref3.txt" in line
    assert "NIST's DUC 2004 data" in line


def test_data_list_shows_each_headline_piece_with_what_to_get_and_where(tmp_path, cli):
    (tmp_path / "duc2003").mkdir()
    (tmp_path / "duc2003" / "input.txt").write_text("an article\n")
    code, out, err = cli("data", "list", "--data-dir", tmp_path)
    assert code == 0, err
    section = out[out.index("headline generation"):]
    for name in ("gigaword-train", "gigaword-extra", "gigaword-test", "duc2004", "duc2003"):
        assert name in section
    assert "duc2003         partial" in section and "duc2004         missing" in section
    assert f"put: {tmp_path / 'duc2003' / 'task1_ref0.txt'}" in section
    assert f"{tmp_path / 'duc2003' / 'input.txt'}," not in section  # present: not asked for
    assert "get: NIST's DUC 2004 data" in section and "sumdata/Giga/" in section


def test_clusters_show_export_and_clusters_from_take_a_summariser_run(trained, tmp_path, cli):
    root, data = trained
    code, out, err = cli("clusters", "show", root / "s2s", "--top", 3)
    assert code == 0 and "self_organized head" in out, err
    code, out, err = cli("clusters", "export", root / "s2s", "--format", "json", "--out", tmp_path / "c.json")
    assert code == 0, err
    exported = json.loads((tmp_path / "c.json").read_text())
    lm_export = tmp_path / "lm.json"
    assert cli("clusters", "export", root / "lm", "--format", "json", "--out", lm_export)[0] == 0
    assert sorted(map(sorted, exported)) == sorted(map(sorted, json.loads(lm_export.read_text())))  # the LM's clusters
    code, _, err = cli("s2s", "train", *data, *TINY, "--head", "self_organized", "--clusters-from", root / "s2s",
                       "--run-dir", tmp_path / "again", "--max-tokens", 200)
    assert code == 0, err
    again = torch.load(tmp_path / "again" / "last.pt", weights_only=True)["head"]["assignment"]
    assert torch.equal(again, torch.load(root / "s2s" / "best.pt", weights_only=True)["head"]["assignment"])
