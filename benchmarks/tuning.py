"""One tuning protocol for every head: the same small budget of settings per head, chosen on dev only.

The protocol, written down before its runs (the code below is its only definition):

* **Model and budget.** LSTM 256 (``--emb-size 256 --hidden-size 256``), every head tied (its better form on PTB and
  WikiText-2 at six epochs, docs/results/fair.md; adaptive softmax tied through adaptive input), one epoch
  (``--epochs 1``), every other setting the default. A run's score is its best dev perplexity.
* **Stage A, the head's own settings** (two values of two options each, the head's default among them; seed 1):
  adaptive softmax its cutoffs (torch's text8 setting scaled to N, the default, or a wider head at 10% and 40% of N)
  and ``div_value`` (4, torch's, or 2); frequency binning its number of clusters (sqrt(N), the default, or 2 sqrt(N))
  and its bands (every word at d, or ``div_value=4``); the self-organized head ``div_value`` (none or 4) and its
  shortlist (sqrt(N) words, the default, or 4 sqrt(N)); the full softmax has no option to tune.
* **Stage A2, past the grid's edge** (added after the Penn Treebank runs, where adaptive softmax chose the widest
  cutoffs and the smallest ``div_value`` of its grid; seed 1): where stage A chose an option's last value, the choice
  is also run at the values past it, every combination (adaptive softmax: cutoffs at 20% and 60% of N, and
  ``div_value`` 1), and the lowest of them and the choice is taken on.
* **Stage B, offered to every head alike** (from its stage-A choice; seed 1): the warm-up (0, 30 the default, 100
  steps), then the tied weight's start (``--init-range`` 0.1 the default, or 1/sqrt(d) = 0.0625, a head's own).
* **The choice**: the lowest dev perplexity of each stage; the next stage starts from it.
* **Then each head in its chosen form, seeds 2, 3 and 4** (none of them the tuning seed): PTB and WikiText-2 (test
  perplexity of the best dev checkpoint) and the text8 prefix (dev only; no setting was chosen on it). A corpus not
  tuned takes the choice of the tuned corpus nearest in vocabulary (cutoffs, clusters and shortlists scaled to N).

Usage::

    python benchmarks/tuning.py tune ptb --workers 2           # stages A and B of every head (resumable)
    python benchmarks/tuning.py final ptb --seeds 2,3,4         # the chosen forms (resumable)
    python benchmarks/tuning.py report                          # writes docs/results/tuning.md and tuning.json

Each run's ``config.json`` and ``metrics.jsonl`` (and ``test.json`` for the final runs) are kept in
``docs/results/tuning/CORPUS/``; the report is regenerated from those files alone.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import sys
import threading
from pathlib import Path

import kept_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "tuning"
REPORT = ROOT / "docs" / "results" / "tuning.md"

HIDDEN = 256
BASE = ["--emb-size", str(HIDDEN), "--hidden-size", str(HIDDEN), "--epochs", "1", "--tie-weights"]
#: corpus -> (its flags, N words, has a test split, what it is)
CORPORA: dict[str, tuple[list[str], int, bool, str]] = {
    "ptb": (["--corpus", "ptb"], 10_000, True, "Penn Treebank (10k words)"),
    "wikitext-2": (["--corpus", "wikitext-2"], 33_278, True, "WikiText-2 (33k words)"),
    "text8-small": (["--corpus", "text8-small", "--min-count", "1", "--max-size", "50000"], 50_000, False,
                    "the text8 prefix (50k words)"),
}
HEADS = ("full", "adaptive", "two_level_frequency", "self_organized")
#: a head's stage-A options: option -> its values, the default first (a scale of N where the value depends on N)
GRID: dict[str, dict[str, tuple]] = {
    "full": {},
    "adaptive": {"cutoffs": ("text8", "wide"), "div_value": (4, 2)},
    "two_level_frequency": {"n_clusters": (1, 2), "div_value": (None, 4)},  # n_clusters in sqrt(N)
    "self_organized": {"div_value": (None, 4), "shortlist": (1, 4)},        # shortlist in sqrt(N)
}
#: values past the edge of a head's grid (GRID's values are in the order of their scale), tried from the stage-A choice
#: where it took an option's last value: stage A2, added after the Penn Treebank runs, where adaptive softmax chose the
#: grid's widest cutoffs and smallest ``div_value`` (a choice at the edge says the best may lie beyond it)
PAST_EDGE: dict[str, dict[str, tuple]] = {"adaptive": {"cutoffs": ("wider",), "div_value": (1,)}}
#: the code stage A2's runs and WikiText-2's tuning runs were trained with (a run's kept files do not name it)
A2_TRAINED_AT = "seed 1, trained with v0.3.1's code, commit e4a3319"
#: adaptive softmax's cutoffs past torch's text8 setting, in fractions of N
CUTOFFS = {"wide": (0.1, 0.4), "wider": (0.2, 0.6)}
WARMUPS = (30, 0, 100)  # the default first
INIT_RANGES = (0.1, round(HIDDEN ** -0.5, 4))


def head_options(head: str, setting: dict, n_words: int) -> list[str]:
    """The ``--head-option`` values of a stage-A setting over ``n_words`` words (defaults left out)."""
    options = []
    for key, value in setting.items():
        if value == GRID[head][key][0] and key not in ("div_value",):
            continue  # the head's default: not given
        if key == "div_value":
            if head == "self_organized" or value is not None:  # pinned: a tied LSTM over 20k words would add 4
                options.append(f"div_value={'null' if value is None else value}")
        elif key == "cutoffs":  # "wide" or "wider" (the default, text8, is not given)
            options.append(f"cutoffs=[{','.join(str(round(f * n_words)) for f in CUTOFFS[value])}]")
        elif key in ("n_clusters", "shortlist"):
            options.append(f"{key}={value * math.ceil(math.sqrt(n_words))}")
    return [arg for option in options for arg in ("--head-option", option)]


def setting_name(setting: dict) -> str:
    """A setting's folder name; stage B's defaults left out, so that a stage-B run at them is its stage-A run."""
    shown = {k: v for k, v in setting.items()
             if not (k == "warmup" and v == WARMUPS[0]) and not (k == "init_range" and v == INIT_RANGES[0])}
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in shown.items()) or "default"


def command(head: str, corpus: str, setting: dict, seed: int) -> list[str]:
    """``sohsm lm train`` flags of one run (without ``--run-dir``)."""
    flags, n_words, _, _ = CORPORA[corpus]
    stage_a = {k: v for k, v in setting.items() if k in GRID[head]}
    return [*flags, *BASE, "--head", head, *head_options(head, stage_a, n_words),
            "--warmup", str(setting.get("warmup", WARMUPS[0])),
            "--init-range", str(setting.get("init_range", INIT_RANGES[0])), "--seed", str(seed)]


def best_dev(kept: Path) -> float | None:
    metrics = kept / "metrics.jsonl"
    if not metrics.exists():
        return None
    evals = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = [r["ppl"] for r in evals if r["kind"] == "eval" and r.get("split", "valid") == "valid"]
    return min(evals) if evals and (kept / "setting.json").exists() else None


_print_lock = threading.Lock()


def _say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


def run_one(head: str, corpus: str, setting: dict, seed: int, kept: Path, runs_dir: Path, test: bool) -> float | None:
    """Train (or resume) one run, keep its files, return its best dev perplexity (None: it failed)."""
    if best_dev(kept) is not None and (not test or (kept / "test.json").exists()):
        return best_dev(kept)
    label = str(kept.relative_to(RESULTS))
    run = runs_dir / label
    if not kept_runs.train(run, [*command(head, corpus, setting, seed), "--checkpoint-every", "100", "--quiet"],
                           label):
        return None
    evaluations = {}
    if test:
        evaluations["test"] = kept_runs.evaluate(run, "test", label)
        if evaluations["test"] is None:
            return None
    kept_runs.keep(run, kept, evaluations)
    (kept / "setting.json").write_text(json.dumps({"head": head, "seed": seed, **setting}, indent=1) + "\n")
    _say(f"  {label}: best dev ppl {best_dev(kept):.2f}")
    return best_dev(kept)


def stages(head: str) -> list[list[dict]]:
    """The settings of each stage as changes to the previous stage's choice (stage A: the head's grid)."""
    grid = GRID[head]
    stage_a = [{}]
    for key, values in grid.items():
        stage_a = [{**s, key: v} for s in stage_a for v in values]
    return [stage_a, [{"warmup": w} for w in WARMUPS], [{"init_range": r} for r in INIT_RANGES]]


def past_edge(head: str, chosen: dict) -> list[dict]:
    """Stage A2: the stage-A choice with each option it took at its grid's last value also at the values past it
    (every combination), the choice itself first; [] where no option of ``PAST_EDGE`` is at its edge."""
    settings = [dict(chosen)]
    for key, values in PAST_EDGE.get(head, {}).items():
        if chosen.get(key) == GRID[head][key][-1]:
            settings = [{**s, key: v} for s in settings for v in (chosen[key], *values)]
    return settings if len(settings) > 1 else []


def _stages_from(head: str):
    """Each stage's settings from the previous choice, in order: stage A, A2 (past the edge, where A chose it), B."""
    grid, *rest = stages(head)
    yield "A", lambda chosen: grid
    yield "A2", lambda chosen: past_edge(head, chosen)
    for number, stage in enumerate(rest):
        yield f"B{number + 1}", lambda chosen, stage=stage: [{**chosen, **change} for change in stage]


def tune_head(head: str, corpus: str, pool: concurrent.futures.Executor, runs_dir: Path) -> dict | None:
    """Run the stages of one head in order, each from the previous choice; the chosen setting."""
    chosen: dict = {}
    for number, stage in _stages_from(head):
        settings = stage(chosen)
        if not settings:
            continue
        futures = {setting_name(s): pool.submit(run_one, head, corpus, s, 1,
                                               RESULTS / corpus / "tune" / head / setting_name(s), runs_dir, False)
                   for s in settings}
        scores = {name: future.result() for name, future in futures.items()}
        if any(score is None for score in scores.values()):
            _say(f"{corpus} {head}: stage {number} incomplete, stopping this head")
            return None
        chosen = next(s for s in settings if setting_name(s) == min(scores, key=scores.get))
        _say(f"{corpus} {head}: stage {number} chose {setting_name(chosen)} ({scores[setting_name(chosen)]:.2f})")
    return chosen


def choice(head: str, corpus: str, results: Path = RESULTS) -> tuple[dict, str] | None:
    """The chosen setting of ``head`` for ``corpus`` and the corpus it was chosen on (the tuned corpus nearest in
    vocabulary), from the kept tuning runs alone; None where no corpus has finished the head's stages."""
    tuned = sorted((c for c in CORPORA if _chosen_on(head, c, results) is not None),
                   key=lambda c: abs(math.log(CORPORA[c][1] / CORPORA[corpus][1])))
    return (_chosen_on(head, tuned[0], results), tuned[0]) if tuned else None


def _chosen_on(head: str, corpus: str, results: Path) -> dict | None:
    chosen: dict = {}
    for _, stage in _stages_from(head):
        settings = stage(chosen)
        if not settings:
            continue
        scores = {setting_name(s): best_dev(results / corpus / "tune" / head / setting_name(s)) for s in settings}
        if any(score is None for score in scores.values()):
            return None
        chosen = next(s for s in settings if setting_name(s) == min(scores, key=scores.get))
    return chosen


def tune(corpus: str, heads: list[str], workers: int, runs_dir: Path) -> int:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, \
            concurrent.futures.ThreadPoolExecutor(len(heads)) as chains:
        results = list(chains.map(lambda h: tune_head(h, corpus, pool, runs_dir), heads))
    return 0 if all(r is not None for r in results) else 1


def final(corpus: str, heads: list[str], seeds: list[int], workers: int, runs_dir: Path) -> int:
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for seed in seeds:
            for head in heads:
                chosen = choice(head, corpus)
                if chosen is None:
                    _say(f"{head}: no corpus has finished its tuning; skipped")
                    continue
                jobs.append(pool.submit(run_one, head, corpus, chosen[0], seed,
                                        RESULTS / corpus / "final" / f"seed-{seed}" / head, runs_dir,
                                        CORPORA[corpus][2]))
    return 0 if jobs and all(job.result() is not None for job in jobs) else 1


def _paired(a: list[float], b: list[float]) -> dict:
    """Seed by seed ratios ``a / b - 1`` in percent: how many lower, the mean of the log ratios, the range."""
    ratios = [math.log(x / y) for x, y in zip(a, b)]
    return {"seeds": len(ratios), "lower": sum(r < 0 for r in ratios), "higher": sum(r > 0 for r in ratios),
            "mean_pct": round(math.expm1(sum(ratios) / len(ratios)) * 100, 2),
            "low_pct": round(math.expm1(min(ratios)) * 100, 2), "high_pct": round(math.expm1(max(ratios)) * 100, 2)}


def _words(p: dict, name: str, other: str) -> str:
    """The claim the seeds allow: lower or higher on k of n seeds, the mean and the range."""
    side = (f"lower on {p['lower']} of {p['seeds']} seed{'s' * (p['seeds'] > 1)}" if p["lower"] >= p["higher"] else
            f"higher on {p['higher']} of {p['seeds']} seed{'s' * (p['seeds'] > 1)}")
    return (f"`{name}` against `{other}`: {side}, mean {p['mean_pct']:+.2f}% "
            f"(range {p['low_pct']:+.2f}% to {p['high_pct']:+.2f}%)")


def summarize(results: Path = RESULTS) -> dict:
    """Every figure the report shows, from the kept runs alone (also written as tuning.json for README's checks)."""
    summary: dict = {"tuning": {}, "final": {}}
    for corpus in CORPORA:
        for head in HEADS:
            rows = {folder.name: round(best_dev(folder), 2)
                    for folder in sorted((results / corpus / "tune" / head).glob("*")) if best_dev(folder) is not None}
            if rows:
                chosen = _chosen_on(head, corpus, results)
                summary["tuning"].setdefault(corpus, {})[head] = {
                    "dev": rows, "chosen": None if chosen is None else setting_name(chosen)}
        seeds = sorted(int(p.name.split("-")[1]) for p in (results / corpus / "final").glob("seed-*"))
        table = {}
        for head in HEADS:
            per_seed = {}
            for seed in seeds:
                kept = results / corpus / "final" / f"seed-{seed}" / head
                dev = best_dev(kept)
                test = json.loads((kept / "test.json").read_text())["ppl"] if (kept / "test.json").exists() else None
                if dev is not None and (test is not None or not CORPORA[corpus][2]):
                    per_seed[seed] = {"dev": round(dev, 2), "test": None if test is None else round(test, 2)}
            if per_seed:
                key = "test" if CORPORA[corpus][2] else "dev"
                values = [r[key] for r in per_seed.values()]
                setting = json.loads((results / corpus / "final" / f"seed-{min(per_seed)}" / head /
                                      "setting.json").read_text())
                table[head] = {"seeds": per_seed, "metric": key, "mean": round(sum(values) / len(values), 2),
                               "setting": setting_name({k: v for k, v in setting.items() if k not in ("head", "seed")})}
        if table:
            pairs = {}
            for head in table:
                for other in table:
                    common = sorted(set(table[head]["seeds"]) & set(table[other]["seeds"]))
                    if head != other and common:
                        key = table[head]["metric"]
                        pairs[f"{head} vs {other}"] = _paired([table[head]["seeds"][s][key] for s in common],
                                                              [table[other]["seeds"][s][key] for s in common])
            summary["final"][corpus] = {"heads": table, "pairs": pairs}
    return summary


def _past_edge_words(results: Path) -> list[str]:
    """What stage A2 did, per corpus and head whose stage-A choice lay at its grid's edge: the runs past it and
    whether the choice moved."""
    said = []
    for corpus in CORPORA:
        for head in PAST_EDGE:
            grid = stages(head)[0]
            scores = {setting_name(s): best_dev(results / corpus / "tune" / head / setting_name(s)) for s in grid}
            if any(score is None for score in scores.values()):
                continue
            edge = next(s for s in grid if setting_name(s) == min(scores, key=scores.get))
            past = past_edge(head, edge)[1:]
            if not past:
                continue
            done = {setting_name(s): best_dev(results / corpus / "tune" / head / setting_name(s)) for s in past}
            ran = ", ".join(f"`{name}` {dev:.2f}" for name, dev in done.items() if dev is not None)
            missing = [name for name, dev in done.items() if dev is None]
            text = (f"{head.capitalize()} softmax's stage-A choice on {CORPORA[corpus][3]}, "
                    f"`{setting_name(edge)}` ({scores[setting_name(edge)]:.2f} dev), lay at the edge of its grid; "
                    f"stage A2 ran past it ({A2_TRAINED_AT}): {ran or 'nothing yet'}")
            if missing:
                said.append(text + f"; not run: {', '.join(f'`{name}`' for name in missing)}.")
            elif all(dev > scores[setting_name(edge)] for dev in done.values()):
                said.append(text + ": each above the choice, which stands.")
            else:
                best = min(done, key=done.get)
                said.append(text + f": the choice moved to `{best}`; stage B runs from it, and the final runs "
                            "below are of the setting each names.")
    return said


def report(output: Path = REPORT, results: Path = RESULTS) -> str:
    summary = summarize(results)
    lines = ["# Every head tuned alike", "",
             ("Generated by `python benchmarks/tuning.py report` from the runs kept in [tuning/](tuning/) (each run's "
             "`config.json`, `metrics.jsonl`, `setting.json` and, for the final runs, `test.json`). The protocol, "
             "written before its runs, is the docstring of `benchmarks/tuning.py`; in short: LSTM 256, every head "
             "tied, **one epoch**, the same small grid of each head's own options (stage A), then the warm-up and "
             "the tied weight's start offered to every head (stage B), each choice the lowest dev perplexity of "
             "seed 1; then every head in its chosen form on seeds 2-4, which no choice saw."), "",
             ("Differences are taken seed by seed (same seed, same data order) as ratios of perplexities, and worded "
             "by what the seeds show: lower on k of n seeds, the mean of the ratios and their range. No p-value is "
             "given: three seeds cannot make one mean much."), ""]
    begun = [f"`{head}` {len(row['dev'])} run{'s' * (len(row['dev']) != 1)}"
             for head, row in summary["tuning"].get("wikitext-2", {}).items()]
    wikitext = (f"begun, not finished: {', '.join(begun)}, below, {A2_TRAINED_AT}" if begun else "not run")
    wikitext += "".join(f"; `{head}` finished its stages there and chose `{row['chosen']}`, and its final runs below "
                        "were not trained again in that form" for head, row in
                        summary["tuning"].get("wikitext-2", {}).items() if row["chosen"])
    lines += [(f"What the protocol asked and these runs do not have: the tuning on WikiText-2's dev split ({wikitext}: "
               "the final runs below take Penn Treebank's choices, scaled to each N), and the full softmax in the "
               "final runs on WikiText-2 and the text8 prefix (not run: one epoch of it over 33k-50k words takes hours "
               "on one CPU thread)." + "".join(" " + words for words in _past_edge_words(results))), ""]
    for corpus, heads in summary["tuning"].items():
        lines += [f"## Tuning on {CORPORA[corpus][3]}: best dev perplexity, seed 1", ""]
        for head, row in heads.items():
            lines.append(f"- `{head}` (chosen: `{row['chosen'] or 'not finished'}`): " +
                         ", ".join(f"`{name}` {dev:.2f}" for name, dev in sorted(row["dev"].items(),
                                                                                  key=lambda item: item[1])))
        lines.append("")
    for corpus, final_table in summary["final"].items():
        heads = final_table["heads"]
        metric = next(iter(heads.values()))["metric"]
        seeds = sorted({s for row in heads.values() for s in row["seeds"]})
        lines += [f"## Each head in its chosen form: {CORPORA[corpus][3]}, {metric} perplexity", "",
                  "| head | chosen setting | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
                  "|---|---|" + "---:|" * (len(seeds) + 1)]
        for head, row in sorted(heads.items(), key=lambda item: item[1]["mean"]):
            cells = [f"{row['seeds'][s][metric]:.2f}" if s in row["seeds"] else "–" for s in seeds]
            note = "" if len(row["seeds"]) == len(seeds) else f" ({len(row['seeds'])} seeds)"
            lines.append(f"| `{head}` | `{row['setting']}` | " + " | ".join(cells) + f" | {row['mean']:.2f}{note} |")
        lines += ["", "Seed by seed:", ""]
        best = min(heads, key=lambda h: heads[h]["mean"])
        for other in heads:
            if other != best:
                lines.append("- " + _words(final_table["pairs"][f"{best} vs {other}"], best, other))
        if "self_organized" in heads and best != "self_organized":
            for other in heads:
                if other not in (best, "self_organized"):
                    lines.append("- " + _words(final_table["pairs"][f"self_organized vs {other}"], "self_organized",
                                               other))
        lines.append("")
    text = "\n".join(lines)
    output.write_text(text)
    output.with_suffix(".json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (("tune", "stages A and B of each head on a corpus's dev split"),
                       ("final", "each head in its chosen form, several seeds")):
        p = sub.add_parser(name, help=what)
        p.add_argument("corpus", choices=sorted(CORPORA))
        p.add_argument("--heads", default=",".join(HEADS), help=f"comma-separated (default: {','.join(HEADS)})")
        p.add_argument("--workers", type=int, default=1, help="runs at a time, one thread each (default: 1)")
        p.add_argument("--runs-dir", type=Path, default=Path("runs/tuning"), help="where the run directories go")
        if name == "final":
            p.add_argument("--seeds", default="2,3,4", help="comma-separated (default: 2,3,4)")
    sub.add_parser("report", help="write docs/results/tuning.md and tuning.json from the kept runs")
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report())
        return 0
    heads = [h for h in args.heads.split(",") if h]
    if unknown := [h for h in heads if h not in HEADS]:
        parser.error(f"unknown heads {unknown}; known: {', '.join(HEADS)}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.command == "tune":
        return tune(args.corpus, heads, args.workers, args.runs_dir)
    return final(args.corpus, heads, [int(s) for s in args.seeds.split(",")], args.workers, args.runs_dir)


if __name__ == "__main__":
    sys.exit(main())
