"""The fair quality comparison: every head tied where it can be and untied, the same recipe, several seeds.

Two steps, each resumable:

``train`` trains the runs of a protocol (one ``sohsm lm train`` per head, tying and seed, with the
protocol's settings), evaluates each run's best checkpoint on the test split, and copies what a
table needs into the repository: ``docs/results/fair/PROTOCOL/seed-S/RUN/`` gets the run's
``config.json``, ``metrics.jsonl`` and ``test.json`` (never checkpoints). Run it again to continue:
finished runs are skipped, interrupted ones resumed from their last checkpoint.

``report`` regenerates ``docs/results/fair.md`` and its figures by name, ``fair.json`` (README's checks read them),
from those committed files alone: per protocol, each run's best dev perplexity and the test perplexity of that best
checkpoint, seed by seed, the mean, and the paired per-seed differences against the reference runs with a paired
t-test (on log perplexity, so that a difference is a ratio).

Usage::

    python benchmarks/fair_quality.py train promise --seeds 1,2        # runs in runs/fair/promise/...
    python benchmarks/fair_quality.py train lstm256-ptb --seeds 1 --runs self_organized-tied,full-tied
    python benchmarks/fair_quality.py train lstm256-wikitext-2 --device cuda   # kept in fair/lstm256-wikitext-2-cuda/
    python benchmarks/fair_quality.py report                            # writes docs/results/fair.md, fair.json

Runs trained on a GPU (``--device cuda``) are kept and tabled apart from the CPU's, in ``PROTOCOL-cuda``: the same
recipe in float32, but other kernels and another random stream, so a table never pairs runs of two devices.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import kept_runs
import tuning

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "fair"
REPORT = ROOT / "docs" / "results" / "fair.md"

#: the transformer's small CPU model (docs/results/transformer.md)
_TRANSFORMER = ["--model", "transformer", "--layers", "4", "--hidden-size", "256", "--attention-heads", "4",
                "--bptt", "128", "--batch-size", "32"]
_LSTM256 = ["--emb-size", "256", "--hidden-size", "256"]

#: name -> (corpus, settings every run of the protocol shares, what it is)
PROTOCOLS: dict[str, tuple[str, list[str], str]] = {
    "promise": ("ptb", ["--max-tokens", "300000"],
                "Penn Treebank, LSTM 512 (the defaults), a third of an epoch (300k tokens)"),
    "lstm256-ptb": ("ptb", _LSTM256 + ["--epochs", "6"], "Penn Treebank, LSTM 256, six epochs"),
    "lstm256-wikitext-2": ("wikitext-2", _LSTM256 + ["--epochs", "6"], "WikiText-2, LSTM 256, six epochs"),
    "lstm256-text8": ("text8-small", _LSTM256 + ["--epochs", "6", "--min-count", "1", "--max-size", "50000"],
                      "the text8 prefix (50k words), LSTM 256, six epochs"),
    "transformer-ptb": ("ptb", _TRANSFORMER + ["--epochs", "1"],
                        "Penn Treebank, the small transformer (4 x 256), one epoch"),
    "transformer-ptb-3-epochs": ("ptb", _TRANSFORMER + ["--epochs", "3"],
                                 "Penn Treebank, the small transformer (4 x 256), three epochs"),
    "transformer-ptb-6-epochs": ("ptb", _TRANSFORMER + ["--epochs", "6"],
                                 "Penn Treebank, the small transformer (4 x 256), six epochs"),
    "transformer-wikitext-2": ("wikitext-2", _TRANSFORMER + ["--max-tokens", "1000000"],
                               "WikiText-2, the small transformer (4 x 256), 1M tokens"),
}

#: what a protocol's table must say of its runs beyond the command (the code they were trained with, what is missing)
NOTES: dict[str, str] = {
    "promise": "Trained at commit c5884e4; the untied self-organized and frequency-binning runs of seed 1 at "
               "1e5e578, which differs only in the tied weight's start (untied runs train the same).",
    "lstm256-ptb": "Trained at commit c5884e4: seed 1 of six runs, seed 2 of the two tied two-level heads; the tied "
                   "full softmax of seed 1 at 67bee0d (the same training code for this head; 56 minutes on one "
                   "thread beside another run); the tied full softmax and tied adaptive softmax of seed 2 at 0e3a607 "
                   "(the same code for them); seed 3 and the untied runs of seed 2 at 74ebcba (the training code of "
                   "0e3a607); seed 3 of the untied heads at 4a2cbe9 (the same training code); the `div_value=4` "
                   "variant at 78dd720, where it can first be tied; the untied full softmax of seed 1 at 01c3157 (the "
                   "training code of 0e3a607 for this head; about an hour on one thread beside another run), seeds 2 "
                   "and 3 at 750bd75 (the same; 27-29 minutes each beside another run). "
                   "The earlier six-epoch tables (docs/results/lm.md) compared the "
                   "tied self-organized head with untied heads only. `adaptive_tuned-tied` (adaptive softmax in the "
                   "form the tuning protocol chose at one epoch, docs/results/tuning.md; the other heads' choices were "
                   "their defaults, the runs above) seeds 1-3 at 140dea8 (v0.3.0's training code).",
    "lstm256-wikitext-2": "Trained at commit 74ebcba (the training code of 0e3a607), seed 1. The full softmax (33k "
                          "words: about four hours a run on one thread here) and the untied two-level heads were "
                          "trained on a GPU: the next table. The `div_value=4` variant at 78dd720, and seeds 2 and 3 "
                          "of it and of the self-organized head every word at d (seed 3 at f9dcd5f, the same training "
                          "code), to see whether the variant's lead holds: it held on every seed, and the variant is "
                          "the default over 20,000 words from 61719df. Seed 2 of tied frequency binning and tied "
                          "adaptive softmax at f9dcd5f. Seed 3 of tied adaptive softmax and of tied frequency binning, "
                          "and seed 2 of untied adaptive softmax (begun earlier, resumed), at d8dd7ab (the training "
                          "code of 0e3a607 for them). Seed 3 of untied adaptive softmax at 750bd75 (the same "
                          "training code), and seeds 1 and 2 of untied frequency binning on the CPU there too (its GPU "
                          "run, seed 1, is in the next table); seed 3 of it at 884e4ae (the same training code). Seeds "
                          "1-3 of the untied self-organized head on the CPU at 60448b7 (the same training code; its "
                          "GPU run, seed 1, is in the next table). `adaptive_tuned-tied` (adaptive softmax as tuning "
                          "chose it on Penn Treebank, scaled to 33k words) seed 1 with v0.3.1's code (e4a3319), paused "
                          "16 minutes while the tuning's stage A2 "
                          "ran (its tokens/s counts the pause); seeds 2 and 3 not run (the session's CPU time).",
    "lstm256-wikitext-2-cuda": "Trained on one NVIDIA H200 (torch 2.11, CUDA 13.0; float32, no `--amp`; the two-level "
                               "heads on their Triton path) at commit 4a2cbe9 (the training code of 0e3a607), seed 1, "
                               "ten runs sharing the card. Adaptive softmax did not finish in the device time lent (15 "
                               "minutes in all): its CPU runs are in the table above. Seeds 2 and 3 of the tied full "
                               "softmax and of the tied self-organized head every word at d, and seeds 1-3 of the "
                               "`div_value=4` variant (the default here), at 283908c, twelve runs sharing the card "
                               "(their tokens/s are contended figures). Not run: seeds 2 and 3 of the other runs. "
                               "A device moves a run by about 1%: the same head and seed on the CPU reached 118.97 "
                               "test "
                               "(self-organized, tied; 118.20 here) and 127.36 (frequency binning, tied; 128.52 here); "
                               "the variant's three seeds 117.17 on the CPU, 117.61 here.",
    "lstm256-text8": "The text8 prefix has a training and a dev split only: runs are compared on dev. "
                     "Trained at commit 79768e8, seed 1, the tied two-level heads and untied adaptive softmax; seed 1 "
                     "of the `div_value=4` variant (the default here) at 78dd720. Tied adaptive softmax (its better "
                     "form on PTB and here), seeds 1-3, and seeds 2 and 3 of the variant at d8dd7ab: the training "
                     "code of 0e3a607 for adaptive softmax; for the variant, the banded kernel (the same function "
                     "as 78dd720's, computed band by band). Seed 2 of tied frequency binning at 01c3157 (the "
                     "training code of 0e3a607 for this head), seed 3 at 750bd75 (the same); seeds 2 and 3 of the "
                     "self-organized head every word at d, seeds 2 and 3 of untied adaptive softmax and seed 1 of the "
                     "untied self-organized head at 750bd75 (their config.json equals seed 1's but for the seed); "
                     "seed 2 of the untied self-organized head at 884e4ae and seed 3 at 60448b7 (the same "
                     "training code). "
                     "Seeds 1 and 2 of untied frequency binning at 60448b7 (the same training code; its GPU run, "
                     "seed 1, is in the next table), seed 3 at 283908c (the same training code). The full softmax "
                     "(hours a run on one thread here) was trained on "
                     "a GPU: the next table.",
    "lstm256-text8-cuda": "Trained on one NVIDIA H200 as the WikiText-2 GPU table (commit 4a2cbe9, seed 1, float32). "
                          "Untied adaptive softmax did not finish in the device time lent; its CPU run is in the table "
                          "above. Seeds 2 and 3 of the tied full softmax and seeds 1-3 of the `div_value=4` variant "
                          "(the default here) at 283908c, as the WikiText-2 GPU table's. Not run: seeds 2 and 3 of "
                          "the other runs. The same head and seed on the CPU: self-organized, tied "
                          "253.67 dev (253.84 here); frequency binning, tied 270.70 (266.11 here); the variant's three "
                          "seeds 245.13 on the CPU, 243.32 here.",
    "transformer-ptb-3-epochs": "Trained at commit 74ebcba (the training code of 0e3a607), the two two-level heads "
                                "tied, "
                                "seeds 1 and 2; seed 3 at 4a2cbe9 (the same training code): does frequency binning's "
                                "lead at one epoch hold as training goes on? The "
                                "schedule (100 warm-up steps, cosine to a tenth) spans the three epochs.",
    "transformer-ptb-6-epochs": "Trained at commit 3c2db7b (the training code of 0e3a607), the two two-level heads "
                                "tied, seeds 1 and 2: does the self-organized head pass "
                                "frequency binning trained as long as the LSTM tables are? The schedule (100 warm-up "
                                "steps, cosine to a tenth) spans the six epochs. The `self_organized_late-tied` "
                                "variant (from frequency bins, re-clustered once an epoch) at b5f9e93, the same "
                                "training code "
                                "for the transformer (docs/results/transformer.md, \"A late first "
                                "re-clustering\"). The `self_organized_bins_first-tied` "
                                "variant (frequency binning's own clusters, no "
                                "shortlist, self-organized from step 228, the first after one epoch) at 60448b7, the "
                                "same training code (transformer.md, \"Frequency binning's clusters first\").",
    "transformer-ptb": "Trained at commit 0e3a607, every head tied, three seeds, and the untied full softmax of "
                       "seeds 1-3. The untied runs of earlier releases are in "
                       "docs/results/transformer.md (three seeds), which also measures why frequency binning leads "
                       "here. The `self_organized_late-tied` variant (from frequency bins, re-clustered once an "
                       "epoch) at b5f9e93, the training code of 0e3a607 for the transformer. The "
                       "`self_organized_gradual-tied` variant (from frequency bins with limits they obey, a word "
                       "leaving its cluster only for a gain of 1 nat in q) at 7902579, seed 1 only: seeds 2 and 3 were "
                       "to follow if it scored at or below frequency binning's 229.51 test on that seed (set before "
                       "the run); it scored 233.86.",
}

#: run name -> (head, tied, head options); the table's order
RUNS: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "full-tied": ("full", True, ()),
    "full-untied": ("full", False, ()),
    "adaptive-tied": ("adaptive", True, ()),
    "adaptive-untied": ("adaptive", False, ()),
    "two_level_frequency-tied": ("two_level_frequency", True, ()),
    "two_level_frequency-untied": ("two_level_frequency", False, ()),
    # every word at d: the default below 20,000 words, pinned so that the row means one thing on every corpus (a
    # tied LSTM over 20,000 words or more takes div_value=4 by default: the row below)
    "self_organized-tied": ("self_organized", True, ("div_value=null",)),
    "self_organized-untied": ("self_organized", False, ()),
    # rare words in fewer dimensions, as adaptive softmax scores them, tied through their bands' projections
    "self_organized_div4-tied": ("self_organized", True, ("div_value=4",)),
    # from frequency bins, re-clustered once an epoch (the first after a whole epoch): a short budget trains as
    # frequency binning does, a long one still learns its clusters (docs/results/transformer.md)
    "self_organized_late-tied": ("self_organized", True, ("init=frequency", "reclusters_per_epoch=1")),
    # from frequency bins, with limits the bins obey on PTB (gamma 8.3: its largest bin holds 823 of 9,900 words, the
    # default limit 150) and a margin of 1 nat to leave one's cluster: gradual moves (docs/results/transformer.md)
    "self_organized_gradual-tied": ("self_organized", True, ("init=frequency", "gamma=8.3", "stay_margin=1.0")),
    # frequency binning's own clusters (no shortlist) for the transformer's first PTB epoch (227 steps), then
    # re-clustered at the default rate from step 228 on: a short budget is frequency binning, a long one self-organizes
    "self_organized_bins_first-tied": ("self_organized", True, ("init=frequency", "shortlist=0", "first_update=228")),
    # adaptive softmax as the tuning protocol chose it on PTB (docs/results/tuning.md): cutoffs at 10% and 40% of the
    # N words, div_value 2 (torch's stock settings cost it ~5.6% dev there at one epoch)
    "adaptive_tuned-tied": ("adaptive", True, ("cutoffs=[10%N,40%N]", "div_value=2")),
}
#: runs asked for by name only
VARIANTS = ("self_organized_div4-tied", "self_organized_late-tied", "self_organized_gradual-tied",
            "self_organized_bins_first-tied", "adaptive_tuned-tied")
#: what ``train`` trains unless ``--runs`` says: each head tied and untied
MAIN_RUNS = tuple(name for name in RUNS if name not in VARIANTS)

#: the runs every other is compared with, seed by seed
REFERENCES = ("full-tied", "full-untied", "adaptive-untied", "adaptive-tied", "adaptive_tuned-tied",
              "two_level_frequency-tied", "two_level_frequency-untied", "self_organized-tied")
KEPT = (*kept_runs.KEPT, "test.json")
#: corpora with a training and a dev split only: their runs are compared on dev
NO_TEST_SPLIT = ("text8-small",)


def scaled_options(options: tuple[str, ...], corpus: str) -> list[str]:
    """``options`` with each ``P%N`` replaced by P% of the corpus's vocabulary size, rounded (the tuning protocol's
    scaling)."""
    n_words = tuning.CORPORA[corpus][1]
    return [re.sub(r"(\d+)%N", lambda m: str(round(int(m.group(1)) / 100 * n_words)), option) for option in options]


def _folder(protocol: str, device: str) -> str:
    """Where a protocol's runs on a device are kept: the CPU's under the protocol's name, a GPU's beside them."""
    return protocol if device == "cpu" else f"{protocol}-{device.split(':')[0]}"


def train(protocol: str, seeds: list[int], runs: list[str], runs_dir: Path, device: str = "cpu") -> int:
    corpus, settings, _ = PROTOCOLS[protocol]
    folder = _folder(protocol, device)
    failed = 0
    for seed in seeds:
        for name in runs:
            head, tied, options = RUNS[name]
            kept = RESULTS / folder / f"seed-{seed}" / name
            if (kept / "test.json").exists():
                continue
            run = runs_dir / folder / f"seed-{seed}" / name
            new_run = ["--corpus", corpus, *settings, "--head", head,
                       *(arg for option in scaled_options(options, corpus) for arg in ("--head-option", option)),
                       "--tie-weights" if tied else "--no-tie-weights", "--seed", str(seed),
                       "--checkpoint-every", "200", "--device", device, "--quiet"]
            label = f"{folder} seed {seed} {name}"
            if not kept_runs.train(run, new_run, label):
                failed += 1
                continue
            if corpus in NO_TEST_SPLIT:  # the text8 prefix: train and valid only
                result = {"split": "test", "ppl": None, "step": None, "missing": f"corpus {corpus!r} has no test split"}
            else:
                result = kept_runs.evaluate(run, "test", label, device)
                if result is None:
                    failed += 1
                    continue
            kept_runs.keep(run, kept, {"test": result})
            print(f"  test ppl {result['ppl']:.2f}" if result["ppl"] is not None else "  no test split: dev only",
                  flush=True)
    return 1 if failed else 0


def _summary(folder: Path) -> dict | None:
    """Best dev perplexity (and where), the test perplexity of that checkpoint, tokens/s."""
    if not (folder / "test.json").exists():
        return None
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in records if r["kind"] == "eval" and r.get("split", "valid") == "valid"]
    trains = [r for r in records if r["kind"] == "train"]
    best = min(evals, key=lambda r: r["ppl"])
    test = json.loads((folder / "test.json").read_text())
    rate = trains[-1]["tokens"] / trains[-1]["elapsed_s"] if trains else float("nan")
    return {"dev": best["ppl"], "epoch": best["epoch"], "test": test.get("ppl"), "test_step": test.get("step"),
            "tokens_per_s": rate}


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def paired_figures(a: list[float], b: list[float]) -> dict:
    """What ``_paired`` prints, by name (README's checks read them): the seeds, on how many ``a`` is lower and
    higher, the mean of the per-seed ratios a/b - 1 and their range, in percent as printed (two decimals)."""
    diffs = [math.log(x) - math.log(y) for x, y in zip(a, b)]
    pct = lambda d: round(math.expm1(d) * 100, 2)  # noqa: E731
    return {"seeds": len(diffs), "lower": sum(d < 0 for d in diffs), "higher": sum(d > 0 for d in diffs),
            "mean_pct": pct(sum(diffs) / len(diffs)), "low_pct": pct(min(diffs)), "high_pct": pct(max(diffs))}


def write_figures(output: Path, figures: dict) -> None:
    """The figures of a generated page by name, as JSON beside it (``fair.md`` -> ``fair.json``)."""
    output.with_suffix(".json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


def _paired(a: list[float], b: list[float]) -> str:
    """Mean of the per-seed ratios a/b - 1, on how many seeds a is lower and the range of the ratios; from three
    seeds on, a paired t-test on log perplexity (two-sided): with two, one degree of freedom says nothing."""
    diffs = [math.log(x) - math.log(y) for x, y in zip(a, b)]
    mean = sum(diffs) / len(diffs)
    text = f"{math.expm1(mean) * 100:+.2f}%"
    if len(diffs) < 2:
        return text + " (one seed)"
    lower, higher = sum(d < 0 for d in diffs), sum(d > 0 for d in diffs)
    seeds = (f"lower on {lower} of {len(diffs)} seeds" if lower >= higher else
             f"higher on {higher} of {len(diffs)} seeds")
    seeds += f", {math.expm1(min(diffs)) * 100:+.2f}% to {math.expm1(max(diffs)) * 100:+.2f}%"
    if len(diffs) < 3:
        return text + f" ({seeds})"
    from scipy import stats  # the dev extra brings scipy; only the report's test needs it

    result = stats.ttest_rel([math.log(x) for x in a], [math.log(y) for y in b])
    if math.isnan(result.statistic):
        return text + f" (every seed the same, {len(diffs)} seeds)"
    return text + f" ({seeds}; t {result.statistic:+.2f}, p {result.pvalue:.3f})"


def report(output: Path = REPORT, results: Path = RESULTS) -> str:
    lines = ["# Fair quality: every head tied and untied, the same recipe",
             "",
             "Generated by `python benchmarks/fair_quality.py report` from the raw runs committed in",
             "[fair/](fair/) (each run's `config.json`, `metrics.jsonl` and `test.json`); the runs were trained by",
             "`python benchmarks/fair_quality.py train PROTOCOL --seeds ...` (its source lists every protocol's",
             "settings). Perplexity is the best dev perplexity of the run and the test perplexity of that",
             "same checkpoint (`best.pt`). Differences are taken seed by seed (same seed, same data order) as",
             "ratios of perplexities: their mean, on how many seeds the run is lower or higher, and the range of the",
             "ratios; from three seeds on, t and p of a paired two-sided t-test on log perplexity (with two seeds it",
             "says nothing; with three, little).",
             "*tokens/s* is each run's own, trained beside other jobs on a two-core machine: a guide, not a speed",
             "comparison (`benchmarks/heads.py` measures the heads side by side).",
             ""]
    variants = [f"`{name}` is `--head {head} {' '.join('--head-option ' + o for o in options)} "
                f"{'--tie-weights' if tied else '--no-tie-weights'}`" for name, (head, tied, options) in RUNS.items()
                if options]
    if variants:
        lines += ["Runs with head options: " + "; ".join(variants) + ". Every word of `self_organized-tied` is scored "
                  "in d dimensions, on every corpus: the head's default below 20,000 words. Over 20,000 words or more "
                  "a new tied LSTM run of `--head self_organized` takes `div_value=4` (rarer words in fewer "
                  "dimensions, from commit 61719df; `sohsm.tasks.lm.config.vocabulary_head_options`): the "
                  "`self_organized_div4-tied` row is then the default. The runs kept from earlier releases were "
                  "trained without the option, when no option meant every word at d.", ""]
    # each protocol's GPU table after its own
    tables = [table for protocol, (corpus, settings, title) in PROTOCOLS.items()
              for table in ((protocol, corpus, settings, title),
                            (_folder(protocol, "cuda"), corpus, settings + ["--device", "cuda"], title + ", trained on "
                                                                                                         "a GPU"))]
    figures: dict = {}
    for protocol, corpus, settings, title in tables:
        folder = results / protocol
        if not folder.is_dir():
            continue
        seeds = sorted(int(p.name.split("-")[1]) for p in folder.glob("seed-*"))
        table = {name: {s: _summary(folder / f"seed-{s}" / name) for s in seeds} for name in RUNS}
        table = {name: row for name, row in table.items() if any(row.values())}
        named = figures[protocol] = {"title": title, "seeds": seeds, "runs": {}, "pairs": {}}
        for name, row in table.items():
            done = {s: r for s, r in row.items() if r}
            named["runs"][name] = {
                "seeds": {str(s): {"dev": round(r["dev"], 2),
                                   "test": None if r["test"] is None else round(r["test"], 2)}
                          for s, r in done.items()},
                "mean_dev": round(sum(r["dev"] for r in done.values()) / len(done), 2),
                "mean_test": (round(sum(r["test"] for r in done.values()) / len(done), 2)
                              if all(r["test"] is not None for r in done.values()) else None)}
        lines += [f"## {title}", "",
                  f"`sohsm lm train --corpus {corpus} {' '.join(settings)} --head HEAD --tie-weights|--no-tie-weights "
                  f"--seed S` (every other setting the default)", "",
                  *([NOTES[protocol], ""] if protocol in NOTES else []),
                  "| run | " + " | ".join(f"seed {s} dev / test" for s in seeds) + " | mean dev | mean test | tokens/s "
                                                                                   "|",
                  "|---|" + "---:|" * (len(seeds) + 3)]
        for name, row in table.items():
            cells = [f"{r['dev']:.2f} / {_number(r['test'])}" if r else "–" for r in row.values()]
            done = [r for r in row.values() if r]
            mean = lambda key: sum(r[key] for r in done) / len(done)  # noqa: E731
            note = "" if len(done) == len(seeds) else f" ({len(done)} seed{'s' * (len(done) != 1)})"
            mean_test = f"{mean('test'):.2f}{note}" if all(r["test"] is not None for r in done) else "–"
            lines.append(f"| {name} | " + " | ".join(cells) +
                         f" | {mean('dev'):.2f}{note} | {mean_test} | {mean('tokens_per_s'):,.0f} |")
        for reference in REFERENCES:
            if reference not in table:
                continue
            lines += ["", f"Against **{reference}**, seed by seed (test; dev in brackets):", ""]
            for name, row in table.items():
                if name == reference:
                    continue
                common = [s for s in seeds if row[s] and table[reference][s]]
                if not common:
                    continue
                dev = _paired([row[s]["dev"] for s in common], [table[reference][s]["dev"] for s in common])
                pair = named["pairs"][f"{name} vs {reference}"] = {
                    "dev": paired_figures([row[s]["dev"] for s in common],
                                          [table[reference][s]["dev"] for s in common]),
                    "test": None}
                if any(row[s]["test"] is None or table[reference][s]["test"] is None for s in common):
                    lines.append(f"- {name}: no test split [{dev}]")
                    continue
                test = _paired([row[s]["test"] for s in common], [table[reference][s]["test"] for s in common])
                pair["test"] = paired_figures([row[s]["test"] for s in common],
                                              [table[reference][s]["test"] for s in common])
                lines.append(f"- {name}: {test} [{dev}]")
        lines.append("")
    text = "\n".join(lines)
    output.write_text(text)
    write_figures(output, figures)
    return text


def command_line(doc: str, train_help: str, report_help: str, report_output: Path,
                 results: Path) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The two commands every table script takes, ``train`` (with ``--seeds``) and ``report`` (with ``--output`` and
    ``--results``): ``(parser, train, report)``, each script adding its own options to the last two."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help=train_help)
    t.add_argument("--seeds", default="1", help="comma-separated (default: 1)")
    r = sub.add_parser("report", help=report_help)
    r.add_argument("--output", type=Path, default=report_output)
    r.add_argument("--results", type=Path, default=results,
                   help="the kept runs (default: "
                        f"{results.relative_to(ROOT) if results.is_relative_to(ROOT) else results})")
    return parser, t, r


def chosen(parser: argparse.ArgumentParser, text: str, known, what: str) -> list[str]:
    """The comma-separated names of ``text``, refused (exit 2, naming them) where one is not ``known``."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def vocabularies(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """``--vocabularies``' bpe:SIZE values, refused where one is not."""
    values = [v for v in text.split(",") if v]
    if not all(v.startswith("bpe:") and v[4:].isdigit() for v in values):
        parser.error(f"--vocabularies takes bpe:SIZE values, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser, t, _ = command_line(__doc__, "train, test and keep the runs of a protocol (resumable)",
                                "write docs/results/fair.md from the kept runs", REPORT, RESULTS)
    t.add_argument("protocol", choices=sorted(PROTOCOLS))
    t.add_argument("--runs", default=",".join(MAIN_RUNS), help=f"comma-separated, of {', '.join(RUNS)} "
                   f"(default: {', '.join(MAIN_RUNS)})")
    t.add_argument("--runs-dir", type=Path, default=Path("runs/fair"), help="where the run directories go")
    t.add_argument("--device", default="cpu", help="cpu (default) or cuda; a GPU's runs are kept as PROTOCOL-cuda")
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(args.output, args.results))
        return 0
    runs = chosen(parser, args.runs, RUNS, "runs")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return train(args.protocol, [int(s) for s in args.seeds.split(",")], runs, args.runs_dir, args.device)


if __name__ == "__main__":
    sys.exit(main())
