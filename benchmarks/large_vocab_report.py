"""The page of ``large_vocab.py``: ``docs/results/large-vocab.md`` and its figures by name (``large-vocab.json``),
written from the kept runs and speed measurements alone (``python benchmarks/large_vocab.py report``).

Each budget's runs are summarised over the seeds kept: every seed's test bits per byte, their mean and their spread
(largest minus smallest, in % of the mean). A comparison of the self-organized head with another run takes the seeds
both kept: the gap is the geometric mean of the seed-by-seed ratios of test bits per byte, minus one, "k of n" the
seeds where the self-organized head was lower, and the comparison's spread the range of those ratios (the seeds are
paired: the same data order for both runs). **The rule**, the decision table's (``which_head.py``): *ahead* (or
*behind*) when every seed agrees and the gap is larger than that spread; *level* when the seeds disagree or the gap is
within it; *one seed* where only one seed was kept by both (no spread to weigh the gap against).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

#: the issue's targets for the self-organized head: within this share of the tied full softmax's test bits per byte
#: at this many times its training tokens/s, and ahead of these runs at equal tokens
WITHIN, FASTER, AHEAD_OF = 0.01, 5.0, ("adaptive_20k-tied", "adaptive_tuned-tied", "importance_sampling-untied")
SELF_ORGANIZED, REFERENCE = "self_organized-tied", "full-tied"
#: the self-organized head's variants, each set against its default (not a target: what the option does)
VARIANTS = {"self_organized_spread-tied": "the unseen words spread over the clusters (`--head-option "
                                          "unseen_words=spread`, the default before `unseen_words=apart`)"}


#: the plot, beside the page whatever the page's name (so a page written elsewhere reads the same)
PLOT = "large-vocab.png"


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_summary(folder: Path) -> dict | None:
    """A kept run's figures; ``None`` for one not kept (yet)."""
    if not (folder / "test.json").exists():
        return None
    test = json.loads((folder / "test.json").read_text())
    valid = json.loads((folder / "valid.json").read_text())
    trains = [r for r in _records(folder) if r["kind"] == "train"]
    meta = json.loads((folder / "run.json").read_text())
    unused = json.loads((folder / "unused.json").read_text())
    return {"test_bpb": round(test["bits_per_byte"], 4), "dev_bpb": round(valid["bits_per_byte"], 4),
            "test_ppl_token": round(test["ppl"], 2),
            "tokens_per_s": round(trains[-1]["tokens"] / trains[-1]["elapsed_s"], 1) if trains else None,
            "train_peak_mib": meta["train_peak_rss_mib"], "eval_peak_mib": meta["eval_peak_rss_mib"],
            "commit": meta["commit"], "unused": unused,
            "unused_cost_bpb": (round(unused["renormalized_gain_bits"] * test["tokens"] / test["text_bytes"], 5)
                                if "renormalized_gain_bits" in unused else None)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarise(seeds: dict[str, dict]) -> dict:
    """One run over its kept seeds: each seed's figures, the mean test bits per byte and its spread."""
    bpb = [s["test_bpb"] for s in seeds.values()]
    mean = _mean(bpb)
    return {"seeds": seeds, "n": len(seeds), "test_bpb_mean": round(mean, 4),
            "spread_pct": round(100 * (max(bpb) - min(bpb)) / mean, 2) if len(bpb) > 1 else None,
            "dev_bpb_mean": round(_mean([s["dev_bpb"] for s in seeds.values()]), 4),
            "tokens_per_s_mean": round(_mean([s["tokens_per_s"] for s in seeds.values() if s["tokens_per_s"]]
                                             or [0.0]), 1),
            "unused_mass_mean": round(_mean([s["unused"]["unused_mass"] for s in seeds.values()]), 4),
            "unused_cost": _unused_cost(seeds)}


def _unused_cost(seeds: dict[str, dict]) -> dict | None:
    """The mean bits per byte a run loses to its unused rows, over the seeds where it was measured (``None``: none)."""
    costs = [s["unused_cost_bpb"] for s in seeds.values() if s.get("unused_cost_bpb") is not None]
    return {"bpb_mean": round(_mean(costs), 4), "n": len(costs)} if costs else None


def _cost_cell(run: dict) -> str:
    cost = run["unused_cost"]
    if cost is None:
        return "–"
    return f"{cost['bpb_mean']:.4f}" + (f" ({cost['n']} of {run['n']})" if cost["n"] < run["n"] else "")


def compare(mine: dict, other: dict) -> dict:
    """The self-organized run against ``other`` over the seeds both kept, by the rule of the module."""
    common = sorted(set(mine["seeds"]) & set(other["seeds"]), key=int)
    if not common:
        return {"n": 0}
    ratios = [mine["seeds"][s]["test_bpb"] / other["seeds"][s]["test_bpb"] for s in common]
    gap = 100 * (math.exp(_mean([math.log(r) for r in ratios])) - 1)
    k = sum(r < 1 for r in ratios)
    spread = round(100 * (max(ratios) - min(ratios)), 2) if len(common) > 1 else None
    if spread is None:
        verdict = "one seed"
    elif k in (0, len(common)) and abs(gap) > spread:
        verdict = "ahead" if k else "behind"
    else:
        verdict = "level"
    return {"n": len(common), "k": k, "gap_pct": round(gap, 2), "spread_pct": spread, "verdict": verdict}


def _peak(values: list) -> str:
    """The largest of the peaks measured (a run kept without its training's peak has ``None``: see its run.json)."""
    known = [v for v in values if v is not None]
    return f"{max(known):,}" if known else "–"


def _spread(run: dict) -> str:
    return "one seed" if run["spread_pct"] is None else f"{run['spread_pct']:.2f}% over {run['n']} seeds"


def _gap_text(c: dict, mine: dict, other: dict) -> str:
    paired = ("no spread (one seed)" if c["spread_pct"] is None else
              f"the seed-by-seed ratios' spread {c['spread_pct']:.2f}%")
    return (f"{c['gap_pct']:+.2f}% in test bits per byte, lower on {c['k']} of {c['n']} seed{'s' * (c['n'] > 1)}, "
            f"{paired} (each run's own spread: the self-organized head's {_spread(mine)}, the other's "
            f"{_spread(other)})")


def _verdict(entry: dict, speed: dict | None) -> list[str]:
    """The targets, each met / missed / level / unmeasured, with the numbers."""
    runs = entry["runs"]
    so, full = runs.get(SELF_ORGANIZED), runs.get(REFERENCE)
    rates = (speed or {}).get("runs", {})
    ratio = None
    if rates.get(SELF_ORGANIZED) and rates.get(REFERENCE):
        ratio = rates[SELF_ORGANIZED]["tokens_per_s"] / rates[REFERENCE]["tokens_per_s"]
        entry["speed_ratio"] = round(ratio, 1)
    if so is None:
        return ["- every target: **unmeasured** (the self-organized run is not kept yet)."]
    lines = []
    speed_text = (f"{ratio:.1f}x its training tokens/s (`speed`, one run after the other)" if ratio is not None else
                  "the speed ratio unmeasured")
    if full is None:
        lines.append(f"- within {100 * WITHIN:.0f}% of the tied full softmax's test bits per byte at >= {FASTER:.0f}x "
                     f"its tokens/s: **unmeasured** for quality (no full-softmax run at this budget); {speed_text}.")
    else:
        c = entry["comparisons"][REFERENCE]
        within = c["gap_pct"] <= 100 * WITHIN
        met = within and ratio is not None and ratio >= FASTER
        lines.append(f"- within {100 * WITHIN:.0f}% of the tied full softmax at >= {FASTER:.0f}x its tokens/s: "
                     f"**{'met' if met else 'missed'}**{' on one seed' if c['n'] == 1 else ''}: "
                     f"{_gap_text(c, so, full)}; {speed_text}.")
    for other in AHEAD_OF:
        if runs.get(other) is None:
            lines.append(f"- ahead of {other}: **unmeasured** (not kept at this budget).")
            continue
        c = entry["comparisons"][other]
        word = {"ahead": "met: ahead", "behind": "missed: behind", "level": "level (neither met nor missed)",
                "one seed": ("ahead" if c["k"] else "behind") + " on one seed (no spread yet: neither met nor missed)"}
        lines.append(f"- ahead of {other}: **{word[c['verdict']]}**: {_gap_text(c, so, runs[other])}.")
    for variant, what in VARIANTS.items():
        if runs.get(variant) is not None:
            c = entry.setdefault("variants", {})[variant] = compare(runs[variant], so)  # the variant / default
            word = {"ahead": "lower", "behind": "higher", "level": "level",
                    "one seed": ("lower" if c["k"] else "higher") + " on one seed"}[c["verdict"]]
            lines.append(f"- the self-organized head with {what}, against the default: **{word}**: "
                         + _gap_text(c, runs[variant], so).replace("the self-organized head's", "the variant's")
                         .replace("lower on", "the variant lower on") + ".")
    return lines


def _speed_section(tokenizer: str, speed: dict, named: dict) -> list[str]:
    """``tokenizer``: the section's name (a tokenizer, and the model where it is not the transformer)."""
    lines = [f"## {tokenizer}: training speed", "",
             f"`{speed['command']}` (commit {speed['commit']}): each run trained for about {speed['seconds']:g} s of "
             "steps after its first, one after another.", "",
             "| run | tokens/s | steps timed | peak memory (MiB) |", "|---|---:|---:|---:|"]
    for name, rate in speed["runs"].items():
        lines.append(f"| {name} | {rate['tokens_per_s']:,.1f} | {rate['steps']} | {rate['peak_rss_mib']:,} |"
                     if rate else f"| {name} | (no step timed) | | |")
    named["speed"] = speed["runs"]
    return lines + [""]


def _budget_section(tokenizer: str, budget: int, budget_dir: Path, runs_order: list[str], settings: list[str],
                    named: dict, speed: dict | None) -> list[str]:
    per_run: dict[str, dict] = {}
    for seed_dir in sorted(budget_dir.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        for name in runs_order:
            row = run_summary(seed_dir / name)
            if row:
                per_run.setdefault(name, {})[seed_dir.name.split("-")[1]] = row
    runs = {name: summarise(per_run[name]) for name in runs_order if name in per_run}
    entry = named[f"tokens-{budget}"] = {"runs": runs, "comparisons": {}}
    so = runs.get(SELF_ORGANIZED)
    for name, run in runs.items():
        if so is not None and name != SELF_ORGANIZED:
            entry["comparisons"][name] = compare(so, run)
    lines = [f"## {tokenizer}, {budget:,} training tokens", "",
             f"`sohsm lm train --corpus wikitext-2 {' '.join(settings)} --max-tokens {budget} "
             f"--tokenizer {tokenizer.split(',')[0]} "
             "--head HEAD [--head-option ...] --tie-weights|--no-tie-weights --seed SEED` (each run's exact command: "
             "its `run.json`)", "",
             "| run | test bits/byte, seed by seed | mean | spread | dev bits/byte | tokens/s | train peak MiB "
             "| eval peak MiB | mass on unused rows | its cost, bits/byte | commits |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in runs_order:
        run = runs.get(name)
        if run is None:
            lines.append(f"| {name} | not kept (yet) | | | | | | | | | |")
            continue
        seeds = run["seeds"]
        by_seed = ", ".join(f"s{seed} {row['test_bpb']:.4f}" for seed, row in seeds.items())
        spread = "–" if run["spread_pct"] is None else f"{run['spread_pct']:.2f}%"
        lines.append(
            f"| {name} | {by_seed} | "
            f"{run['test_bpb_mean']:.4f} | {spread} | "
            f"{run['dev_bpb_mean']:.4f} | "
            f"{run['tokens_per_s_mean']:,.1f} | {_peak([r['train_peak_mib'] for r in seeds.values()])} | "
            f"{max(r['eval_peak_mib'] for r in seeds.values()):,} | {100 * run['unused_mass_mean']:.2f}% | "
            f"{_cost_cell(run)} | "
            f"{', '.join(sorted({r['commit'] for r in seeds.values()}))} |")
    any_run = next(iter(runs.values()), None)
    if any_run:
        u = next(iter(any_run["seeds"].values()))["unused"]
        lines += ["", f"Means over the seeds; *spread*: largest minus smallest test bits per byte, in % of the mean. "
                  f"*Mass on unused rows*: the mean probability the model gives the {u['unused_rows']:,} of "
                  f"{u['rows']:,} rows that the training split never uses "
                  f"({100 * u['uniform_share']:.2f}% of the rows: "
                  f"what a uniform distribution would give them), over the first {u['test_tokens']:,} test positions "
                  "(`python benchmarks/unused_mass.py RUN --tokens 16384`), the mean over the seeds. *Its cost*: the "
                  "test bits per byte the head would save were that mass given to the used rows in proportion "
                  "(`renormalized_gain_bits` of `unused.json`, over the same positions, times the test split's "
                  "tokens per byte), the mean over the seeds measured (*k of n* where some runs predate the figure; "
                  "*–*: none measured)."]
    if so:
        u = next(iter(so["seeds"].values()))["unused"]
        if "clusters" in u:
            alone = (f"{u['clusters_of_unused_only']:,} hold nothing else ({u['unused_rows_in_those']:,} unused rows) "
                     f"and get {100 * u['mass_on_clusters_of_unused_only']:.2f}% of the mass"
                     if u["clusters_of_unused_only"] else
                     "none holds unused rows alone: they sit among used ones, spread over the clusters")
            lines += ["", f"Where the self-organized head keeps them (its first seed): "
                      f"{u['clusters_holding_unused']:,} of its {u['clusters']:,} clusters hold an unused row; "
                      f"{alone}."]
    lines += ["", "Targets (issue: the self-organized default against the others at equal tokens; the rule, the "
              "decision table's: ahead or behind only where every seed agrees by more than the seed-by-seed ratios' "
              "spread):", ""]
    return lines + _verdict(entry, speed) + [""]


def _model_sections(title: str, folder: Path, runs_order: list[str], settings: list[str], named: dict) -> list[str]:
    """One model's speed and budgets over one tokenizer (``title``: the tokenizer, and the model where it is not the
    transformer; the command names the tokenizer, its first word)."""
    lines = []
    speed_file = folder / "speed.json"
    speed = json.loads(speed_file.read_text()) if speed_file.exists() else None
    if speed:
        lines += _speed_section(title, speed, named)
    for budget_dir in sorted(folder.glob("tokens-*"), key=lambda p: int(p.name.split("-")[1])):
        lines += _budget_section(title, int(budget_dir.name.split("-")[1]), budget_dir, runs_order, settings,
                                 named, speed)
    return lines


def report(results: Path, output: Path, runs_order: list[str], protocol_title: str, settings: list[str],
           others: dict[str, tuple[str, list[str]]] | None = None) -> str:
    """Write the page and ``output.with_suffix('.json')``; return the page. ``others``: the folder (in a tokenizer's)
    of another model's runs -> (its name, its settings), each its own sections after the transformer's."""
    lines = ["# Large vocabularies on real text: the heads over Llama 3's 128,256 tokens and o200k's 200,019",
             "",
             "Generated by `python benchmarks/large_vocab.py report` from the raw runs committed in",
             "[large-vocab/](large-vocab/) (each run's `config.json`, `metrics.jsonl`, `valid.json`, `test.json`,",
             "`unused.json`, `run.json`). Protocol: " + protocol_title + " (`subword.md`'s transformer), with",
             "`--tokenizer llama3` or `--tokenizer o200k`: the tokenizers' own files, read offline from the",
             "`quicktok-v1` wheel (`pip install 'sohsm[tokenizers]'`). **The head has every row of the tokenizer**",
             "though WikiText-2's training split uses about 27,000 of them: the case of a model trained with that",
             "tokenizer. Bits per byte (loss in bits / UTF-8 bytes of the split's text) take every row's probability",
             "mass: a head that gives unused rows mass pays for it. The self-organized head's default keeps the",
             "tokens training never shows in clusters of their own (`unseen_words=apart`, a run default from",
             "76f9f74); `self_organized_spread-tied` places them as any other token, as the runs before it did.",
             "Every run of a table reads the same number of training tokens."
             + ("" if not others else " The sections named " + " or ".join(
                 f"*{name}*" for name, _ in others.values()) + " train that model instead of the transformer "
                 "(`python benchmarks/large_vocab.py train --model ...`), with the same heads and budgets."),
             "",
             "One thread per run on a 2-core CPU, two runs side by side (and at times a third job): tokens/s are a",
             "guide. The speed tables' runs were measured one after another by the same command.",
             ""]
    intro = len(lines)
    figures: dict = {}
    for tokenizer_dir in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        tokenizer = tokenizer_dir.name
        named = figures[tokenizer] = {}
        lines += _model_sections(tokenizer, tokenizer_dir, runs_order, settings, named)
        for folder, (name, other_settings) in (others or {}).items():
            if (tokenizer_dir / folder).is_dir():
                named[folder] = {}
                lines += _model_sections(f"{tokenizer}, {name}", tokenizer_dir / folder, runs_order, other_settings,
                                         named[folder])
    if plot(figures, output.parent / PLOT):
        lines[intro:intro] = [f"![test bits per byte against training tokens]({PLOT})", "",
                        "The plot: the transformer's runs over each tokenizer kept at two budgets or more, the mean "
                        "test bits per byte (left) and each run's over the self-organized head's, seed by seed over "
                        "the seeds both kept (right: above 0, the head is lower), against training tokens. The "
                        "tables below hold every figure.", ""]
    text = "\n".join(lines).rstrip() + "\n"
    output.write_text(text)
    output.with_suffix(".json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return text


def _curves(named: dict) -> dict[str, list[tuple[int, float, float | None]]]:
    """Run -> (training tokens, mean test bits per byte, its bits per byte over the self-organized head's in %, seed
    by seed; None for the head itself or with no seed in common) at each budget it was kept."""
    curves: dict[str, list] = {}
    for key in sorted((k for k in named if k.startswith("tokens-")), key=lambda k: int(k.split("-")[1])):
        entry = named[key]
        for name, run in entry["runs"].items():
            c = entry["comparisons"].get(name, {})
            over = None if not c.get("n") else 100 * (1 / (1 + c["gap_pct"] / 100) - 1)
            curves.setdefault(name, []).append((int(key.split("-")[1]), run["test_bpb_mean"], over))
    return curves


def plot(figures: dict, path: Path) -> bool:
    """Test bits per byte and the gap to the self-organized head against training tokens, a row of two panels for
    each tokenizer whose transformer runs were kept at two budgets or more; False (nothing written) where none was."""
    shown = {t: _curves(named) for t, named in figures.items()}
    shown = {t: c for t, c in shown.items() if len({b for points in c.values() for b, _, _ in points}) > 1}
    if not shown:
        path.unlink(missing_ok=True)
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 3.6 * len(shown)))
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(shown), 2, squeeze=False)
    for (tokenizer, curves), (left, right) in zip(shown.items(), axes):
        drawn = [0.0]
        for name, points in curves.items():
            budgets = [b / 1e6 for b, _, _ in points]
            line, = left.plot(budgets, [bpb for _, bpb, _ in points], marker="o", label=name)
            gaps = [(b / 1e6, over) for b, _, over in points if over is not None]
            if gaps:
                right.plot(*zip(*gaps), marker="o", color=line.get_color(), label=name)
                drawn += [over for _, over in gaps]
        right.axhline(0, color="black", linewidth=0.8)
        right.set_yscale("symlog", linthresh=2, linscale=2)   # linear within 2%, where the close heads are
        ticks = [v for v in (-10, -5, -2, -1, -0.5, 0, 0.5, 1, 1.5, 2, 5, 10, 20)
                 if min(drawn) - 0.01 <= v <= max(drawn) + 2]               # none that would widen the view
        right.set_yticks(ticks, [f"{v:g}" for v in ticks])
        left.set_ylabel(f"{tokenizer}: test bits/byte (mean)")
        right.set_ylabel("over the self-organized head (%, log past 2)")
        for ax in (left, right):
            ax.set_xlabel("training tokens (millions)")
            ax.grid(True, alpha=0.3)
        left.legend(fontsize=7)
    figure.suptitle("Transformer 4 x 256 over WikiText-2, every row of the tokenizer in the head")
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    return True
