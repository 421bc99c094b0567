"""Reports of finished (or running) runs: one summary per run, a markdown table, the learned clusters.

Every number comes from the run directories themselves (``config.json``,
``metrics.jsonl``, ``last.pt``, ``best.pt``), so a report can be rewritten at
any time from the runs alone; ``sohsm lm compare`` and
``benchmarks/lm_results.py`` both write theirs with these functions.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sohsm.head_catalogue import REFERENCE_HEAD
from sohsm.runs.clusters import cluster_table, learned_first, one_word_note, shown, token_text
from sohsm.train.checkpoint import CONFIG_FILE, LAST, METRICS_FILE
from sohsm.train.loading import load_run
from sohsm.train.metrics import read_metrics


@dataclass(frozen=True)
class RunSummary:
    """What one run did, as a row of a results table.

    Attributes:
        run: the run directory's name.
        head: the head's name.
        options: the head's options (``head.options``, and ``update_every`` and ``tie_weights`` when set).
        tokens, epochs, train_s: training tokens, epochs (fractional) and seconds of training so far.
        tokens_per_s: ``tokens / train_s``.
        best_ppl, ppl: best and last dev perplexity (``None`` before the first evaluation).
        ppl_cluster, ppl_in_cluster: the last evaluation's cluster and in-cluster perplexity (Eq. 5-6).
        reclusterings: re-assignments of the words so far (self-organized heads).
        empty_clusters: clusters without a word in ``last.pt`` (``None`` for heads without clusters).
        signature: head, clusters, K, vocabulary, corpus, seed, version (from ``last.pt``; empty without it).
    """

    run: str
    head: str
    options: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    epochs: float | None = None
    train_s: float = 0.0
    tokens_per_s: float | None = None
    best_ppl: float | None = None
    ppl: float | None = None
    ppl_cluster: float | None = None
    ppl_in_cluster: float | None = None
    reclusterings: int = 0
    empty_clusters: int | None = None
    signature: dict[str, Any] = field(default_factory=dict)


def summarise_run(run_dir: str | os.PathLike[str]) -> RunSummary:
    """The :class:`RunSummary` of a run directory.

    Raises:
        ValueError: no ``config.json`` or ``metrics.jsonl`` in ``run_dir``.
    """
    run_dir = Path(run_dir)
    for name in (CONFIG_FILE, METRICS_FILE):
        if not (run_dir / name).is_file():
            raise ValueError(f"{run_dir} is not a training run directory (no {name})")
    config = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    head = config["head"]
    options = dict(head.get("options") or {})
    if head.get("update_every") is not None:
        options["update_every"] = head["update_every"]
    if (config.get("model") or {}).get("tie_weights"):
        options["tie_weights"] = True
    records = read_metrics(run_dir / METRICS_FILE)
    evals = [r for r in records if r.get("kind") == "eval"]
    timed = [r for r in records if "epoch" in r] or [{"tokens": 0, "elapsed_s": 0.0, "epoch": None}]
    last = max(timed, key=lambda r: (r["tokens"], r["elapsed_s"]))
    final = evals[-1] if evals else {}
    empty, signature = _checkpoint_facts(run_dir / LAST)
    return RunSummary(
        run=run_dir.name, head=head["name"], options=options, tokens=int(last["tokens"]), epochs=last["epoch"],
        train_s=float(last["elapsed_s"]),
        tokens_per_s=last["tokens"] / last["elapsed_s"] if last["elapsed_s"] else None,
        best_ppl=min((r["ppl"] for r in evals), default=None), ppl=final.get("ppl"),
        ppl_cluster=final.get("ppl_cluster"), ppl_in_cluster=final.get("ppl_in_cluster"),
        reclusterings=sum(r.get("kind") == "recluster" for r in records),
        empty_clusters=empty, signature=signature,
    )


def _checkpoint_facts(path: Path) -> tuple[int | None, dict[str, Any]]:
    """Empty clusters of a checkpoint's head (``None`` without clusters) and its signature, K as resolved."""
    try:  # mmap: only the few tensors read here come from the disk
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # no checkpoint yet, or one being replaced: the columns stay empty
        return None, {}
    signature = dict(checkpoint.get("signature", {}))
    head = checkpoint.get("head", {})
    extra = head.get("_extra_state")
    if signature.get("K") is None and isinstance(extra, dict) and extra.get("update_every") is not None:
        signature["K"] = extra["update_every"]  # chosen by the head at its first batch, after the signature
    n_clusters, assignment = signature.get("clusters"), head.get("assignment")
    if n_clusters is None or assignment is None:
        return None, signature
    return int(n_clusters) - int(torch.unique(assignment).numel()), signature


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def seconds_text(seconds: float) -> str:
    """Seconds as a table gives them: ``0.42``, ``7.3``, ``1,254`` (a short run is not rounded to 0)."""
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}" if seconds < 100 else f"{seconds:,.0f}"


def results_table(summaries: Sequence[RunSummary]) -> list[str]:
    """A markdown table of the runs, one row each; "speed vs full" appears when a run of the reference head (the full
    softmax, :data:`~sohsm.head_catalogue.REFERENCE_HEAD`) is among them."""
    reference = next((s for s in summaries if s.head == REFERENCE_HEAD and s.tokens_per_s), None)
    speed_column = f" speed vs {REFERENCE_HEAD} |" if reference else ""
    lines = [
        "| run | head | tokens trained | epochs | training s | train tokens/s |" + speed_column
        + " best dev ppl | dev ppl at the end | cluster ppl | in-cluster ppl | re-clusterings |"
        " empty clusters at the end |",
        "|---|---|---:|---:|---:|---:|" + ("---:|" if reference else "") + "---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        speed = ""
        if reference:
            ratio = s.tokens_per_s / reference.tokens_per_s if s.tokens_per_s and reference.tokens_per_s else None
            speed = f" {_fmt(ratio, '.1f')}{'x' if ratio else ''} |"
        lines.append(
            f"| {s.run} | {s.head} | {s.tokens:,} | {_fmt(s.epochs, '.2f')} | {seconds_text(s.train_s)} | "
            f"{_fmt(s.tokens_per_s, ',.0f')} |{speed} {_fmt(s.best_ppl, '.2f')} | {_fmt(s.ppl, '.2f')} | "
            f"{_fmt(s.ppl_cluster, '.2f')} | {_fmt(s.ppl_in_cluster, '.2f')} | {s.reclusterings} | "
            f"{_fmt(s.empty_clusters, 'd')} |"
        )
    return lines


def cluster_lines(run_dir: str | os.PathLike[str], top: int = 8, words: int = 10,
                  checkpoint: str = "best") -> list[str]:
    """The ``top`` heaviest clusters of a run's head as a markdown table (the paper's Table 3).

    The same clusters, in the same order, as ``sohsm clusters show RUN --top TOP --words WORDS``
    prints them (``best.pt`` by default).

    Raises:
        ValueError: the run has no checkpoint, or its head has no clusters.
    """
    run = load_run(run_dir, checkpoint)
    show = token_text(run)
    table = shown(cluster_table(run.head, run.vocab, words=words), show)
    empty = sum(1 for s in table if s.size == 0)
    listed, one_word = learned_first(table)
    skipped = f"; {one_word_note(one_word)}" if one_word else ""
    entries = "words" if show is None else "subwords"
    ranked = "of two or more words" if one_word else ""
    lines = [
        f"`{run.run_dir.name}` ({run.config.head.name} head, {run.path.name} at step {run.step:,}, "
        f"{run.tokens:,} training tokens): the {min(top, len(listed))} heaviest of {len(table)} clusters "
        f"({empty} empty{skipped}), most frequent {entries} first; rank is by tf-mass among the clusters"
        f"{' ' + ranked if ranked else ''}.",
        "",
        f"| rank | cluster | {entries} | tf-mass | most frequent {entries} |",
        "|---:|---:|---:|---:|---|",
    ]
    for rank, s in enumerate(listed[:top], start=1):
        lines.append(f"| {rank} | {s.cluster} | {s.size} | {s.tf_mass:.4f} | {' '.join(s.words)} |")
    return lines


def best_over_seeds(folders: Sequence[str | os.PathLike[str]], runs: Sequence[str]) -> dict[str, list[float | None]]:
    """``{run: [best dev ppl in each folder]}`` for the same runs trained with several seeds, one folder a seed.

    A run missing from a folder, or one that has not trained as many epochs as the most any run of the
    comparison trained (still running, or stopped early), gives ``None``: only equal-token numbers compare.
    """
    paths = [Path(f) for f in folders]
    summaries = {(f, r): summarise_run(f / r) for f in paths for r in runs if (f / r / METRICS_FILE).is_file()}
    budget = max((s.epochs or 0.0 for s in summaries.values()), default=0.0)

    def best(folder: Path, run: str) -> float | None:
        s = summaries.get((folder, run))
        if s is None or s.epochs is None or s.epochs < budget - 1e-6:
            return None
        return s.best_ppl

    return {run: [best(f, run) for f in paths] for run in runs}


def seed_table(folders: Sequence[str | os.PathLike[str]], runs: Sequence[str], reference: str | None = None,
               labels: Sequence[str] | None = None) -> list[str]:
    """Markdown: each run's best dev ppl per seed (a column per folder), the mean, and against ``reference``
    the difference seed by seed and its mean (only seeds where both runs finished count).
    """
    values = best_over_seeds(folders, runs)
    labels = list(labels) if labels is not None else [Path(f).name for f in folders]
    ref = values.get(reference) if reference else None
    header = "| run | " + " | ".join(labels) + " | mean | seeds |"
    rule = "|---|" + "---:|" * (len(labels) + 2)
    if ref is not None:
        header += f" vs {reference}, seed by seed | mean difference vs {reference} |"
        rule += "---|---:|"
    lines = [header, rule]
    for run, vals in values.items():
        known = [v for v in vals if v is not None]
        row = f"| {run} | " + " | ".join(_fmt(v, ".2f") for v in vals)
        row += f" | {_fmt(sum(known) / len(known) if known else None, '.2f')} | {len(known)} |"
        if ref is not None:
            diffs = [None if v is None or r is None else 100 * (v / r - 1) for v, r in zip(vals, ref)]
            paired = [d for d in diffs if d is not None]
            row += " " + ", ".join("–" if d is None else f"{d:+.2f}%" for d in diffs) + " |"
            row += f" {sum(paired) / len(paired):+.2f}% over {len(paired)} |" if paired else " – |"
        lines.append(row)
    return lines
