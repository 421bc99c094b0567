"""The report of a comparison of heads: ``results.md`` (the table), ``figure1.png`` and ``clusters.md``.

It sits above :mod:`sohsm.train` and :mod:`sohsm.runs.plots` and reads only run
directories, so ``sohsm lm compare --report-only`` can rewrite it at any time.
"""
from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from sohsm.heads import head_names, learns_clusters
from sohsm.runs.plots import figure1
from sohsm.runs.report import RunSummary, cluster_lines, results_table, summarise_run
from sohsm.tasks.lm import LMConfig, describe_model
from sohsm.train.checkpoint import CONFIG_FILE, METRICS_FILE, format_signature, write_atomic

#: files of a comparison's report
RESULTS_FILE = "results.md"
FIGURE_FILE = "figure1.png"
CLUSTERS_FILE = "clusters.md"


def write_comparison_report(out: str | os.PathLike[str], run_dirs: Sequence[str | os.PathLike[str]],
                            command: str | None = None, rewritten_by: str | None = None, top: int = 8,
                            words: int = 10) -> dict[str, Path]:
    """Write ``results.md``, ``figure1.png`` and (for self-organized runs) ``clusters.md`` into ``out``.

    Args:
        out: the comparison's folder.
        run_dirs: its runs, in table order; those without records yet are left out.
        command: the command that trained the runs, quoted at the top.
        rewritten_by: the command that rewrote the report, when that is another one.
        top, words: clusters listed per self-organized run, words per cluster.

    Returns:
        ``{"results": ..., "figure": ..., "clusters": ...}`` for the files written.

    Raises:
        ValueError: none of ``run_dirs`` has metrics yet.
    """
    out = Path(out)
    dirs = [Path(d) for d in run_dirs if (Path(d) / METRICS_FILE).is_file()]
    if not dirs:
        raise ValueError(f"{out} holds no run with metrics yet: nothing to report")
    summaries = [summarise_run(d) for d in dirs]
    paths = {"results": out / RESULTS_FILE, "figure": figure1(dirs, out=out / FIGURE_FILE)}
    organized = [d for d, s in zip(dirs, summaries) if s.head in head_names() and learns_clusters(s.head)]
    if organized:
        paths["clusters"] = out / CLUSTERS_FILE
        _write_text(paths["clusters"], _clusters_markdown(organized, top, words))
    _write_text(paths["results"], _results_markdown(dirs, summaries, command, rewritten_by, bool(organized)))
    return paths


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def _results_markdown(dirs: list[Path], summaries: list[RunSummary], command: str | None,
                      rewritten_by: str | None, clusters: bool) -> str:
    config = LMConfig.from_dict(json.loads((dirs[0] / CONFIG_FILE).read_text(encoding="utf-8")))
    lines = [f"# Heads compared on {Path(config.data.corpus).name}", ""]
    if command:
        lines.append(f"Made by `{command}`" + (f"; report rewritten by `{rewritten_by}`." if rewritten_by else "."))
    elif rewritten_by:
        lines.append(f"Report written by `{rewritten_by}` from the runs in this folder.")
    lines += ["", *results_table(summaries), "", f"Every run: {shared_settings(config)}."]
    options = [f"`{s.run}`: " + ", ".join(f"{k}={v}" for k, v in s.options.items()) for s in summaries if s.options]
    if options:
        lines += ["", "Head options: " + "; ".join(options) + "."]
    lines += ["", "Signatures:", ""] + [f"- `{s.run}`: `{format_signature(s.signature)}`" for s in summaries
                                          if s.signature]
    lines += ["", f"Figure 1 (dev perplexities, class changes, training perplexity): ![Figure 1]({FIGURE_FILE})"]
    if clusters:
        lines += ["", f"Learned clusters of the self-organized run(s): [{CLUSTERS_FILE}]({CLUSTERS_FILE})"]
    return "\n".join(lines) + "\n"


def shared_settings(config: LMConfig) -> str:
    """The settings every run of a comparison shares, in one line: model, optimizer, batches, seed, budget."""
    m, o = config.model, config.optim
    budget = [f"{config.epochs} epochs"]
    if config.max_tokens is not None:
        budget.append(f"{config.max_tokens:,} tokens")
    if config.time_budget is not None:
        budget.append(f"{config.time_budget:g} s of training")
    decay = f" divided by {o.lr_decay:g} after each epoch past the first {o.lr_decay_after}" if o.lr_decay != 1 else ""
    schedule = (f", {o.warmup} warm-up steps" if o.warmup else "") + (", cosine decay" if o.lr_schedule == "cosine"
                                                                       else "")
    return (f"corpus {config.data.corpus}, {describe_model(m, config.bptt)} (dropout {m.dropout:g}), "
            f"{o.optimizer} lr {o.learning_rate:g}{decay}{schedule}, clip {o.clip}, weight decay {o.weight_decay:g}, "
            f"BPTT {config.bptt}, batch {config.batch_size}, seed {config.seed}, "
            f"dev evaluation every {config.eval_every} steps; budget: the first spent of {', '.join(budget)}")


def _clusters_markdown(dirs: list[Path], top: int, words: int) -> str:
    lines = ["# Learned clusters", ""]
    for d in dirs:
        lines += [f"## {d.name}", "", *cluster_lines(d, top=top, words=words), "",
                  f"As `sohsm clusters show {shlex.quote(str(d))} --top {top} --words {words}` prints them.", ""]
    return "\n".join(lines)
