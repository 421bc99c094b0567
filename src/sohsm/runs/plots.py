"""Figures of training runs: the paper's Figure 1 (perplexities and class changes against training tokens,
epochs, seconds or steps).

Matplotlib is used through its object API with the Agg canvas, so plotting never
needs a display and never changes the caller's pyplot backend.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _run_label(run_dir: Path) -> str:
    try:
        head = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))["head"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        head = "?"
    return f"{run_dir.resolve().name} ({head})"


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

    Epochs of records that do not carry one (re-clusterings) follow from their token count.

    Raises:
        ValueError: an unknown ``x``, or records without what ``x`` counts (written by an older version).
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    rate = _epochs_per_token(records) if x == "epochs" else None
    xs, values = [], []
    for r in records:
        if r.get("kind") != kind or r.get(key) is None or (kind == "train" and r.get("partial")):
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
    line per panel; the legend names the run directory and its head. Heads
    without clusters have no line in the cluster panels.

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
        ValueError: no runs, a directory without ``metrics.jsonl``, a wrong number of labels or an unknown ``x``.

    Example (runs from ``sohsm lm train``; the same as ``sohsm plot runs/full runs/sohsm -o fig1.png``)::

        figure1(["runs/full", "runs/sohsm"], "fig1.png")
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    dirs = [Path(d) for d in run_dirs]
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    if not dirs:
        raise ValueError("figure1 needs at least one run directory")
    if labels is not None and len(labels) != len(dirs):
        raise ValueError(f"got {len(labels)} labels for {len(dirs)} runs")
    runs = []
    for i, d in enumerate(dirs):
        metrics = d / METRICS_FILE
        if not metrics.is_file():
            raise ValueError(f"{d} is not a training run directory (no {METRICS_FILE})")
        runs.append((labels[i] if labels is not None else _run_label(d), read_metrics(metrics)))
    if not any(curve(records, kind, key, "steps")[0] for _, records in runs for kind, key, _, _ in FIGURE1_PANELS):
        empty = ", ".join(str(d) for d in dirs)
        raise ValueError(f"nothing to plot: {METRICS_FILE} of {empty} holds no training or dev record yet "
                         "(a run writes its first at its first log step)")
    out = Path(out) if out is not None else dirs[0] / "figure1.png"

    fig = Figure(figsize=(15, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3, sharex=True).ravel()
    for ax, (kind, key, title, log_y) in zip(axes, FIGURE1_PANELS):
        drawn = False
        for index, (label, records) in enumerate(runs):
            xs, values = curve(records, kind, key, x)
            color = f"C{index % 10}"
            if xs:
                ax.plot(xs, values, marker="o" if len(xs) < 30 else None, markersize=3, color=color,
                        label=label)
                drawn = True
            else:  # keep the run's colour and legend entry in every panel
                ax.plot([], [], color=color, label=label)
        ax.set_title(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        if log_y and drawn and all(v > 0 for _, r in runs for v in curve(r, kind, key, "steps")[1]):
            ax.set_yscale("log")
            plain = FuncFormatter(lambda value, _: f"{value:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        if not drawn:
            ax.text(0.5, 0.5, "no data (no clusters or no records)", ha="center", va="center",
                    transform=ax.transAxes, color="0.5")
    for ax in axes[3:]:
        ax.set_xlabel(X_AXES[x])
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(runs), 4), frameon=False)
    fig.suptitle("Self-organized hierarchical softmax: dev perplexities and class changes (cf. the paper's Figure 1)")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda handle: fig.savefig(handle, format="png", dpi=dpi))
    return out
