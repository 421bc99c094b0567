"""Figure 1 of runs that have not got far yet, and log axes whose labels have room."""
from __future__ import annotations

import math

import pytest

from sohsm.runs.plots import PlottedRun, curve, draw_figure1, without_dev_evaluation


def _train_records(ppls: list[float]) -> list[dict]:
    return [{"kind": "train", "step": 10 * (i + 1), "tokens": 1600 * (i + 1), "elapsed_s": float(i + 1),
             "epoch": 0.01 * (i + 1), "ppl": ppl, "nll_nats": math.log(ppl)} for i, ppl in enumerate(ppls)]


def _recluster(step: int) -> dict:
    return {"kind": "recluster", "step": step, "tokens": 160 * step, "elapsed_s": step / 10, "change_rate": 0.5,
            "moved_tf_mass": 0.2}


def _panels(fig) -> dict[str, object]:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def _empty_text(ax) -> str | None:
    return ax.texts[0].get_text() if ax.texts else None


def test_before_the_first_dev_evaluation_the_rest_is_drawn():
    records = [*_train_records([900.0, 700.0, 600.0]), _recluster(20)]
    run = PlottedRun("run (self_organized)", "self_organized", records)
    assert without_dev_evaluation([run]) == [run]
    panels = _panels(draw_figure1([run]))
    for title in ("dev perplexity", "dev cluster perplexity", "dev in-cluster perplexity"):
        assert _empty_text(panels[title]) == "no dev evaluation yet"
    for title in ("training perplexity", "class change rate (share of words moved)"):
        assert _empty_text(panels[title]) is None and len(panels[title].lines[0].get_xdata()) >= 1


def test_an_empty_panel_says_whether_the_heads_have_clusters():
    records = [*_train_records([900.0, 700.0]), {"kind": "eval", "step": 20, "tokens": 3200, "elapsed_s": 2.0,
                                                 "ppl": 650.0, "ppl_cluster": None, "ppl_in_cluster": None}]
    panels = _panels(draw_figure1([PlottedRun("run (full)", "full", records)]))
    assert _empty_text(panels["dev cluster perplexity"]) == "no clusters (the heads have none)"
    assert _empty_text(panels["class change rate (share of words moved)"]).startswith("no re-clustering (")
    so = PlottedRun("run (self_organized)", "self_organized", records)
    assert _empty_text(_panels(draw_figure1([so]))["token mass of the moved words"]) == "no re-clustering yet"


def test_a_partial_training_record_counts_until_a_full_one_follows():
    records = _train_records([900.0, 700.0])
    records[-1]["partial"] = True  # a session stopped before its second log step
    assert curve(records, "train", "ppl", "steps") == ([10.0, 20.0], [900.0, 700.0])
    resumed = [*records, *_train_records([900.0, 700.0, 650.0])[2:]]  # the next session's full record
    assert curve(resumed, "train", "ppl", "steps") == ([10.0, 30.0], [900.0, 650.0])


def test_an_interrupted_sessions_short_last_interval_is_not_drawn_beside_full_ones():
    """Means of 10 steps, then an interrupted session's mean of 2: not a point of the curve (its drop is the
    interval's length, not the loss's); one of 6 steps, and a run of partial records alone, still are."""
    records = _train_records([900.0, 700.0, 400.0])
    for r in records:
        r["interval_steps"] = 10
    records[-1].update(partial=True, interval_steps=2, step=22)
    assert curve(records, "train", "ppl", "steps") == ([10.0, 20.0], [900.0, 700.0])
    records[-1].update(interval_steps=6, step=26)
    assert curve(records, "train", "ppl", "steps") == ([10.0, 20.0, 26.0], [900.0, 700.0, 400.0])
    alone = _train_records([900.0])
    alone[0].update(partial=True, interval_steps=2)
    assert curve(alone, "train", "ppl", "steps") == ([10.0], [900.0])


@pytest.mark.parametrize("high, low", [(8000.0, 300.0), (100_000.0, 100.0), (900.0, 300.0), (160.0, 120.0),
                                       (10_000.0, 175.0), (2000.0, 175.0)])
def test_log_axes_label_their_ticks_without_overlap(high, low):
    ppls = [high * (low / high) ** (i / 29) for i in range(30)]
    fig = draw_figure1([PlottedRun("run (full)", "full", _train_records(ppls))])
    ax = _panels(fig)["training perplexity"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bottom, top = ax.get_ylim()
    labels = [tick.label1 for tick in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
              if bottom <= tick.get_loc() <= top and tick.label1.get_visible() and tick.label1.get_text()]
    assert len(labels) >= 2, [label.get_text() for label in labels]
    boxes = [label.get_window_extent(renderer) for label in labels]
    for i, box in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            assert not box.overlaps(boxes[j]), (labels[i].get_text(), labels[j].get_text())


def _tick_labels(fig, title: str) -> list[float]:
    ax = _panels(fig)[title]
    fig.canvas.draw()
    bottom, top = ax.get_ylim()
    return [tick.get_loc() for tick in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
            if bottom <= tick.get_loc() <= top and tick.label1.get_visible() and tick.label1.get_text()]


@pytest.mark.parametrize("high", [2000.0, 10_000.0])
def test_a_best_value_between_decades_has_a_labelled_tick_near_it(high):
    """Over one or two decades the steps between them are labelled: 175 is read against 200, not only 100."""
    ppls = [high * (175.0 / high) ** (i / 29) for i in range(30)]
    ticks = _tick_labels(draw_figure1([PlottedRun("run (full)", "full", _train_records(ppls))]), "training perplexity")
    assert any(abs(tick / 175.0 - 1) < 0.2 for tick in ticks), ticks


def test_runs_on_several_corpora_say_so_in_the_title_and_the_legend():
    records = _train_records([900.0, 700.0])
    runs = [PlottedRun("a (full)", "full", records, "ptb"), PlottedRun("b (full)", "full", records, "wikitext-2")]
    fig = draw_figure1(runs)
    title = fig.get_suptitle()
    assert "2 corpora (ptb, wikitext-2)" in title and "compare only within a corpus" in title
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["a (full) [ptb]", "b (full) [wikitext-2]"]
    assert draw_figure1(runs[:1]).get_suptitle().endswith(", on ptb")


def test_runs_of_several_vocabularies_are_compared_per_word():
    """Per-token perplexities of a word run and a subword run do not compare: the dev panel draws perplexity per
    word (a subword run's ``ppl_word``), says so, and each legend entry names its vocabulary."""
    words = [{"kind": "eval", "step": s, "tokens": 100 * s, "ppl": p} for s, p in ((1, 300.0), (2, 200.0))]
    subwords = [{"kind": "eval", "step": s, "tokens": 100 * s, "ppl": p, "ppl_word": w}
                for s, p, w in ((1, 60.0, 320.0), (2, 40.0, 190.0))]
    runs = [PlottedRun("a (full)", "full", words, "ptb"), PlottedRun("b (full)", "full", subwords, "ptb", "bpe:8000")]
    fig = draw_figure1(runs)
    panels = _panels(fig)
    dev = panels["dev perplexity per word (several vocabularies)"]
    assert [list(line.get_ydata()) for line in dev.get_lines()] == [[300.0, 200.0], [320.0, 190.0]]
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["a (full) [words]", "b (full) [bpe:8000]"]
    assert "dev perplexity" in _panels(draw_figure1(runs[1:]))  # one vocabulary: per token, as before
