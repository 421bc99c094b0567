"""Figures of training runs: the paper's Figure 1 (perplexities and class changes against training tokens,
epochs, seconds or steps).

Matplotlib is used through its object API with the Agg canvas, so plotting never
needs a display and never changes the caller's pyplot backend.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sohsm.heads import head_names, learns_clusters
from sohsm.train.checkpoint import CONFIG_FILE, METRICS_FILE, write_atomic
from sohsm.train.metrics import read_metrics

#: the panels of Figure 1: (record kind, value, title, log-scale y)
FIGURE1_PANELS = (
    ("eval", "ppl", "dev perplexity", True),
    ("eval", "ppl_cluster", "dev cluster perplexity", True),
    ("eval", "ppl_in_cluster", "dev in-cluster perplexity", True),
    ("recluster", "change_rate", "class change rate (share of words moved)", False),
    ("recluster", "moved_tf_mass", "token mass of the moved words", False),
    ("train", "ppl", "training perplexity", True),
)


@dataclass(frozen=True)
class PlottedRun:
    """One run of a figure: its legend entry, its head's name (``"?"`` where unknown), its records and the corpus
    it trained on (a known corpus's name or a file's; ``"?"`` where unknown)."""

    label: str
    head: str
    records: list[dict[str, Any]]
    corpus: str = "?"
    #: ``"words"``, or the subword tokenizer it read the corpus with (``bpe:8000``, a ``tokenizer.json``'s name)
    vocabulary: str = "words"


def _run_facts(run_dir: Path) -> tuple[str, str, str]:
    """``(head, corpus, vocabulary)`` of a run from its ``config.json`` (``"?"`` for what it does not say)."""
    try:
        config = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?", "?", "words"
    facts = []
    for section, key in (("head", "name"), ("data", "corpus")):
        try:
            facts.append(Path(str(config[section][key])).name or "?")
        except (KeyError, TypeError):
            facts.append("?")
    tokenizer = (config.get("data") or {}).get("tokenizer") if isinstance(config, dict) else None
    vocabulary = "words" if not tokenizer else str(tokenizer) if str(tokenizer).startswith("bpe:") else \
        Path(str(tokenizer)).name
    return facts[0], facts[1], vocabulary


def dev_key(run: PlottedRun, per_word: bool) -> str:
    """The record value the dev-perplexity panel draws for ``run``: perplexity per word where runs of several
    vocabularies share the figure (a subword run's ``ppl_word``; a word run's ``ppl`` is per word already)."""
    return "ppl_word" if per_word and run.vocabulary != "words" else "ppl"


def corpora_note(runs: Sequence[PlottedRun]) -> str:
    """What the runs trained on, for the title: ``on ptb``, or a warning where they mix corpora (their perplexities
    do not compare); ``""`` where no run says."""
    corpora = sorted({run.corpus for run in runs} - {"?"})
    if len(corpora) > 1:
        return f"runs on {len(corpora)} corpora ({', '.join(corpora)}): perplexities compare only within a corpus"
    return f"on {corpora[0]}" if corpora else ""


#: what the x axis can count, and its label: tokens (the default) compares runs of different batch sizes
X_AXES = {"tokens": "training tokens", "epochs": "epochs", "seconds": "training seconds", "steps": "training steps"}


def _epochs_per_token(records: list[dict[str, Any]]) -> float | None:
    """The run's epochs per training token, from its latest record that has both (an epoch is a fixed count)."""
    for r in reversed(records):
        if r.get("epoch") is not None and r.get("tokens"):
            return float(r["epoch"]) / int(r["tokens"])
    return None


def curve(records: list[dict[str, Any]], kind: str, key: str, x: str = "tokens") -> tuple[list[float], list[float]]:
    """The points of one panel for one run: ``key`` of its ``kind`` records against ``x`` (a key of :data:`X_AXES`).

    Epochs of records that do not carry one (re-clusterings) follow from their token count. A partial training
    record (a session's last interval, shorter than ``log_every``) counts only where no full one follows it
    (a resumed session's next record covers the same steps again), and only where it covers at least half the
    steps of the run's full ones: the mean of an interrupted session's last 2 steps beside means of 100 would
    draw a near-vertical drop that is no change of the loss.

    Raises:
        ValueError: an unknown ``x``, or records without what ``x`` counts (written by an older version).
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    rate = _epochs_per_token(records) if x == "epochs" else None
    full = [i for i, r in enumerate(records) if r.get("kind") == "train" and not r.get("partial")]
    last_full = max(full, default=-1)
    lengths = sorted(records[i]["interval_steps"] for i in full if records[i].get("interval_steps"))
    shortest = lengths[len(lengths) // 2] / 2 if lengths else 0  # half the full intervals' (median) length
    xs, values = [], []
    for i, r in enumerate(records):
        if r.get("kind") != kind or r.get(key) is None:
            continue
        if kind == "train" and r.get("partial") and (i < last_full or r.get("interval_steps", shortest) < shortest):
            continue
        if x == "steps":
            at = r["step"]
        elif x == "tokens":
            at = r.get("tokens")
        elif x == "seconds":
            at = r.get("elapsed_s")
        else:
            at = r.get("epoch", None if rate is None or r.get("tokens") is None else rate * r["tokens"])
        if at is None:
            raise ValueError(f"a {kind!r} record at step {r.get('step')} has no {x} (written by an older sohsm); "
                             "plot it against steps")
        xs.append(float(at))
        values.append(float(r[key]))
    return xs, values


def figure1(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str] | None = None,
            labels: Sequence[str] | None = None, dpi: int = 120, x: str = "tokens") -> Path:
    """Draw the paper's Figure 1 for one or more runs and save it as a PNG.

    Six panels against training tokens (or ``x``): dev perplexity, dev cluster perplexity,
    dev in-cluster perplexity (Eq. 5-6), class change rate and token mass of the
    moved words at each re-clustering, and training perplexity. Each run is one
    line per panel; the legend names the run directory and its head. A panel with
    no line says why (``no dev evaluation yet``, ``no re-clustering yet``, heads
    without clusters); the others are drawn.

    Args:
        run_dirs: run directories (each with a ``metrics.jsonl``).
        out: the PNG to write; default ``<first run>/figure1.png``.
        labels: legend entries, one per run; default ``"<run name> (<head>)"``.
        dpi: resolution.
        x: the x axis: ``"tokens"`` (runs of different batch sizes line up), ``"epochs"``, ``"seconds"``
            (training time, evaluations excluded) or ``"steps"`` (the paper's).

    Returns:
        The path written.

    Raises:
        ValueError: no runs, a directory without ``metrics.jsonl`` or without any record yet, a wrong number
            of labels or an unknown ``x``.

    Example (runs from ``sohsm lm train``; the same as ``sohsm plot runs/full runs/sohsm -o fig1.png``)::

        figure1(["runs/full", "runs/sohsm"], "fig1.png")
    """
    dirs = [Path(d) for d in run_dirs]
    runs = read_runs(dirs, labels)
    fig = draw_figure1(runs, x)
    out = Path(out) if out is not None else dirs[0] / "figure1.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda handle: fig.savefig(handle, format="png", dpi=dpi))
    return out


def read_runs(dirs: Sequence[Path], labels: Sequence[str] | None = None) -> list[PlottedRun]:
    """The records of each run, with its legend entry and head.

    Raises:
        ValueError: no runs, a directory without ``metrics.jsonl``, records of no run yet, a wrong number of labels.
    """
    if not dirs:
        raise ValueError("figure1 needs at least one run directory")
    if labels is not None and len(labels) != len(dirs):
        raise ValueError(f"got {len(labels)} labels for {len(dirs)} runs")
    runs = []
    for i, d in enumerate(dirs):
        metrics = d / METRICS_FILE
        if not metrics.is_file():
            raise ValueError(f"{d} is not a training run directory (no {METRICS_FILE})")
        head, corpus, vocabulary = _run_facts(d)
        runs.append(PlottedRun(labels[i] if labels is not None else f"{d.resolve().name} ({head})", head,
                               read_metrics(metrics), corpus, vocabulary))
    if not any(curve(run.records, kind, key, "steps")[0] for run in runs for kind, key, _, _ in FIGURE1_PANELS):
        empty = ", ".join(str(d) for d in dirs)
        raise ValueError(f"nothing to plot: {METRICS_FILE} of {empty} holds no training or dev record yet "
                         "(a run writes its first at its first log step)")
    return runs


def without_dev_evaluation(runs: Sequence[PlottedRun]) -> list[PlottedRun]:
    """The runs that have no dev evaluation yet (their figure shows training records and re-clusterings only)."""
    return [run for run in runs if not any(r.get("kind") == "eval" for r in run.records)]


def _empty_panel_text(kind: str, runs: Sequence[PlottedRun]) -> str:
    """Why a panel has no line: nothing of its kind yet, or heads that have no clusters."""
    if kind == "eval":
        if without_dev_evaluation(runs) == list(runs):
            return "no dev evaluation yet"
        return "no clusters (the heads have none)"
    if kind == "recluster":
        reclusters = [run for run in runs
                      if run.head in head_names() and learns_clusters(run.head)]
        return "no re-clustering yet" if reclusters else "no re-clustering (the heads keep their clusters)"
    return "no training record yet"


def draw_figure1(runs: Sequence[PlottedRun], x: str = "tokens"):
    """The figure of :func:`figure1` (a matplotlib ``Figure`` on the Agg canvas) for runs read by :func:`read_runs`.

    Log-scale axes label their decades, and steps between them where that leaves room (2, 3, 4, 6 of each
    decade over up to three decades, every step over less than one). The title names the corpus; where the runs
    mix corpora it says so, and each legend entry names its run's.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    fig = Figure(figsize=(15, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3, sharex=True).ravel()
    mixed = len({run.corpus for run in runs} - {"?"}) > 1
    per_word = len({run.vocabulary for run in runs}) > 1  # per-token perplexities of two vocabularies do not compare
    labels = [f"{run.label} [{', '.join(([run.corpus] if mixed else []) + ([run.vocabulary] if per_word else []))}]"
              if mixed or per_word else run.label for run in runs]
    for ax, (kind, key, title, log_y) in zip(axes, FIGURE1_PANELS):
        drawn = False
        keys = [dev_key(run, per_word) if (kind, key) == ("eval", "ppl") else key for run in runs]
        if per_word and (kind, key) == ("eval", "ppl"):
            title = "dev perplexity per word (several vocabularies)"
        elif per_word and kind != "recluster":
            title += " per token"
        for index, run in enumerate(runs):
            xs, values = curve(run.records, kind, keys[index], x)
            color = f"C{index % 10}"
            if xs:
                ax.plot(xs, values, marker="o" if len(xs) < 30 else None, markersize=3, color=color,
                        label=labels[index])
                drawn = True
            else:  # keep the run's colour and legend entry in every panel
                ax.plot([], [], color=color, label=labels[index])
        ax.set_title(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        if log_y and drawn and all(v > 0 for run, k in zip(runs, keys)
                                   for v in curve(run.records, kind, k, "steps")[1]):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.yaxis.set_minor_formatter(_minor_log_labels())
        if not drawn:
            ax.set_yticks([])  # an empty axis has no scale to show
            ax.text(0.5, 0.5, _empty_panel_text(kind, runs), ha="center", va="center",
                    transform=ax.transAxes, color="0.5")
    for ax in axes[3:]:
        ax.set_xlabel(X_AXES[x])
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(runs), 4), frameon=False)
    note = corpora_note(runs)
    fig.suptitle("Self-organized hierarchical softmax: dev perplexities and class changes (cf. the paper's Figure 1)"
                 + (f"\n{note}" if mixed else f", {note}" if note else ""))
    return fig


def _minor_log_labels():
    """matplotlib's LogFormatter, which labels a log axis's minor ticks where they have room (all of them over
    less than a decade, 2, 3, 4 and 6 of each over up to three, none beyond), writing plain numbers (300, not
    3x10^2), so that a value between decades (a best dev ppl of 175) has a labelled tick near it."""
    from matplotlib.ticker import LogFormatter

    class MinorLogLabels(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:g}"

    return MinorLogLabels(labelOnlyBase=False, minor_thresholds=(3, 1))
