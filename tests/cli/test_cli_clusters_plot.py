"""`sohsm clusters show` and `sohsm plot` on runs trained on a slice of real PTB text."""
from __future__ import annotations

import re
import struct

import pytest

from sohsm.runs.plots import curve, figure1
from sohsm.runs.report import cluster_lines

TOKENS_PER_STEP = 16 * 10
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ptb_slice, small, cli, private_env, one_thread):
    """A self-organized run (90 steps, K = 30), a frequency-binning run (40 steps) and a full softmax (30 steps)."""
    root = tmp_path_factory.mktemp("runs")
    for name, head, steps in (("sohsm", "self_organized", 90), ("freq", "two_level_frequency", 40),
                              ("full", "full", 30)):
        extra = ["--update-every", 30] if head == "self_organized" else []
        code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", head, "--run-dir", root / name, *small,
                           "--max-tokens", steps * TOKENS_PER_STEP, "--eval-every", 30, *extra)
        assert code == 0, err
    return root


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# -- clusters -----------------------------------------------------------------------------------
def test_clusters_show_lists_heaviest_clusters_with_words(runs, cli):
    code, out, err = cli("clusters", "show", runs / "sohsm", "--top", 5, "--words", 6)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert "self_organized head" in lines[0] and "clusters" in lines[0]
    rows = lines[2:]
    assert len(rows) == 5
    masses = [float(row.split()[3]) for row in rows]
    assert masses == sorted(masses, reverse=True)
    assert all(1 <= len(row.split()) - 4 <= 6 for row in rows)
    assert "the" in out.replace("(", " ").split()  # the most frequent word: a heavy cluster, or a one-word one named


def test_one_word_clusters_are_counted_not_listed_before_the_learned_ones(runs, cli):
    """A shortlist's one-word clusters (the, <unk>, <eos>) are the heaviest: listed by mass they hide the classes."""
    code, out, err = cli("clusters", "show", runs / "sohsm", "--top", 5)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert re.search(r"; \d+ one-word clusters not listed \(the <unk> <eos> ", lines[0]), lines[0]
    assert all(int(row.split()[2]) > 1 for row in lines[2:])
    assert [int(row.split()[0]) for row in lines[2:]] == [1, 2, 3, 4, 5]  # ranks skip no hidden cluster
    code, out, err = cli("clusters", "show", runs / "sohsm", "--word", "the")
    learned = int(re.search(r"(\d+) clusters \(", out).group(1)) - int(re.search(r"; (\d+) one-word", lines[0])[1])
    assert code == 0 and int(out.splitlines()[2].split()[0]) == learned + 1, out  # after the learned ones
    code, out, err = cli("clusters", "show", runs / "sohsm", "--top", 5, "--one-word")
    assert code == 0 and "not listed" not in out, err
    rows = out.strip().splitlines()[2:]
    assert ["1", "the"] in [row.split()[2:5:2] for row in rows]  # among the others, by mass
    table = cluster_lines(runs / "sohsm", top=5)
    assert "one-word clusters not listed (the <unk> <eos> " in table[0]
    assert all(int(row.split("|")[3]) > 1 for row in table[4:]) and len(table) == 4 + 5
    assert [int(row.split("|")[1]) for row in table[4:]] == [1, 2, 3, 4, 5]


def test_clusters_show_word(runs, cli):
    code, out, err = cli("clusters", "show", runs / "freq", "--word", "company", "--words", 0)
    assert code == 0, err
    rows = out.strip().splitlines()[2:]
    assert len(rows) == 1 and "company" in rows[0].split()[4:]
    assert int(rows[0].split()[2]) == len(rows[0].split()) - 4  # --words 0 lists the whole cluster


def test_clusters_show_errors(runs, cli):
    code, out, err = cli("clusters", "show", runs / "full")
    assert code == 2 and "no word clusters" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("clusters", "show", runs / "sohsm", "--word", "qwxzv")
    assert code == 2 and "not in the vocabulary" in err
    code, out, err = cli("clusters", "show", runs / "nothing-here")
    assert code == 2 and "not a run directory" in err


# -- plot ---------------------------------------------------------------------------------------
def test_plot_default_output_is_a_png_in_the_first_run(runs, cli):
    code, out, err = cli("plot", runs / "sohsm")
    assert code == 0, err
    png = runs / "sohsm" / "figure1.png"
    assert out.strip() == str(png)
    width, height = _png_size(png.read_bytes())
    assert width >= 1000 and height >= 600 and png.stat().st_size > 20_000


def test_plot_several_runs(runs, cli, tmp_path):
    out_png = tmp_path / "figs" / "fig1.png"
    code, out, err = cli("plot", runs / "sohsm", runs / "freq", runs / "full", "-o", out_png)
    assert code == 0, err
    _png_size(out_png.read_bytes())


def test_figure1_library_call(runs, tmp_path):
    # the docstring's example, on real runs
    path = figure1([runs / "full", runs / "sohsm"], tmp_path / "fig1.png", dpi=40)
    assert path == tmp_path / "fig1.png" and path.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_refuses_a_directory_without_metrics(tmp_path, cli):
    code, out, err = cli("plot", tmp_path)
    assert code == 2 and "metrics.jsonl" in err and not (tmp_path / "figure1.png").exists()


def test_plot_refuses_a_run_without_records_and_writes_nothing(tmp_path, cli):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text("")  # a run stopped before its first log step
    code, out, err = cli("plot", run_dir)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "nothing to plot" in lines[0] and str(run_dir) in lines[0]
    assert not (run_dir / "figure1.png").exists() and out == ""


def test_plot_before_the_first_dev_evaluation_draws_the_rest_and_says_so(runs, cli, tmp_path):
    early = tmp_path / "early"
    early.mkdir()
    (early / "config.json").write_bytes((runs / "sohsm" / "config.json").read_bytes())
    records = (runs / "sohsm" / "metrics.jsonl").read_text().splitlines()
    (early / "metrics.jsonl").write_text("".join(r + "\n" for r in records if '"kind": "eval"' not in r))
    assert len(records) > len((early / "metrics.jsonl").read_text().splitlines())  # evaluations were dropped
    code, out, err = cli("plot", early)
    assert code == 0 and out.strip() == str(early / "figure1.png")
    assert err.strip() == f"note: {early} has no dev evaluation yet: its training records and re-clusterings are drawn"
    _png_size((early / "figure1.png").read_bytes())


@pytest.mark.parametrize("x", ["tokens", "epochs", "seconds", "steps"])
def test_plot_against_each_x_axis(runs, cli, tmp_path, x):
    out_png = tmp_path / f"{x}.png"
    code, out, err = cli("plot", runs / "sohsm", runs / "full", "--x", x, "-o", out_png)
    assert code == 0, err
    _png_size(out_png.read_bytes())


def test_curves_line_up_runs_by_tokens_epochs_and_seconds(runs):
    """Every x axis is the record's own count: tokens = steps x tokens a step; epochs grow with tokens at
    one rate per run (re-clusterings, which carry no epoch, included); seconds never go back."""
    from sohsm.train.metrics import read_metrics

    records = read_metrics(runs / "sohsm" / "metrics.jsonl")
    for kind, key in (("eval", "ppl"), ("recluster", "change_rate")):  # its one training record is partial
        steps, values = curve(records, kind, key, "steps")
        tokens, same = curve(records, kind, key, "tokens")
        assert steps and same == values and tokens == [s * TOKENS_PER_STEP for s in steps]
        epochs, _ = curve(records, kind, key, "epochs")
        rates = [e / t for e, t in zip(epochs, tokens)]
        assert max(rates) == pytest.approx(min(rates), rel=1e-3)
        seconds, _ = curve(records, kind, key, "seconds")
        assert seconds == sorted(seconds) and seconds[-1] > 0
    with pytest.raises(ValueError, match="x must be one of tokens, epochs, seconds, steps"):
        curve(records, "eval", "ppl", "words")
    old = [{k: v for k, v in r.items() if k != "tokens"} for r in records]
    with pytest.raises(ValueError, match="no tokens .*plot it against steps"):
        curve(old, "eval", "ppl", "tokens")
