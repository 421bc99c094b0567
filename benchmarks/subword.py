"""Subword vocabularies: the heads over a byte-level BPE of 8,000 and of 32,000 tokens of WikiText-2.

Two steps, each resumable, as in ``benchmarks/fair_quality.py`` (whose protocol and helpers this reuses):

``train`` trains, for each vocabulary, run and seed, one ``sohsm lm train`` with the transformer CPU protocol of
``fair_quality.py`` on WikiText-2 (``transformer-wikitext-2``: the small transformer, 4 blocks of 256, context 128,
batch 32, 1M training tokens) and ``--tokenizer bpe:SIZE``. Every run reads the same number of training tokens:
subword tokens, so the larger vocabulary, whose tokens are longer, reads more of the text. Each run's best
checkpoint is then evaluated on valid and test (``sohsm lm eval --json``), and ``docs/results/subword/bpe-SIZE/
seed-S/RUN/`` keeps its ``config.json``, ``metrics.jsonl``, ``valid.json`` and ``test.json`` (never checkpoints or
the tokenizer, which the same command trains again the same). Run it again to continue: kept runs are skipped,
interrupted ones resumed from their last checkpoint.

``report`` writes ``docs/results/subword.md`` from the kept files alone: per vocabulary and run, perplexity per
word and bits per byte on valid and test (the numbers that compare across vocabularies, and with a word-level
run's ``sohsm lm eval``; the README says how words and bytes are counted), test perplexity per token, and
tokens/s, means over the seeds; and each run against the full softmax, seed by seed.

Usage::

    python benchmarks/subword.py train --seeds 1,2,3                       # runs in runs/subword/...
    python benchmarks/subword.py train --vocabularies bpe:8000 --runs self_organized-tied --seeds 1
    python benchmarks/subword.py report                                    # writes docs/results/subword.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import fair_quality
import kept_runs
from fair_quality import PROTOCOLS, RUNS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "subword"
REPORT = ROOT / "docs" / "results" / "subword.md"

#: the protocol every run trains with (corpus, settings), but for its vocabulary
PROTOCOL = "transformer-wikitext-2"
VOCABULARIES = ("bpe:8000", "bpe:32000")
#: the runs trained by default: every head tied where it can be (a new run's default)
DEFAULT_RUNS = ("full-tied", "adaptive-tied", "two_level_frequency-tied", "self_organized-tied")
#: the run every other is compared with, seed by seed
REFERENCE = "full-tied"
#: ``--matched``: the transformer made as like ``subword_hf.py``'s Llama as its flags allow (Llama's rotary positions;
#: no dropout, which Llama has not on embeddings or residual branches), kept apart from the protocol's runs
MATCHED_FLAGS = ("--dropout", "0", "--positions", "rotary")
MATCHED_RESULTS = ROOT / "docs" / "results" / "subword-matched"
SPLITS = ("valid", "test")


def _folder_name(vocabulary: str) -> str:
    return vocabulary.replace(":", "-")


def train(vocabularies: list[str], seeds: list[int], runs: list[str], runs_dir: Path, results: Path = RESULTS,
          corpus: str | None = None, extra: list[str] | None = None) -> int:
    """Train, evaluate and keep each run not kept yet; 1 if any failed. ``corpus`` and ``extra`` (flags added after
    the protocol's, which they override) are for a smoke test on a small text."""
    protocol_corpus, settings, _ = PROTOCOLS[PROTOCOL]
    corpus = corpus or protocol_corpus
    failed = 0
    for vocabulary in vocabularies:
        for seed in seeds:
            for name in runs:
                head, tied, options = RUNS[name]
                kept = results / _folder_name(vocabulary) / f"seed-{seed}" / name
                if all((kept / f"{split}.json").exists() for split in SPLITS):
                    continue
                run = runs_dir / _folder_name(vocabulary) / f"seed-{seed}" / name
                new_run = ["--corpus", corpus, *settings, "--tokenizer", vocabulary, "--head", head,
                           *(arg for option in options for arg in ("--head-option", option)),
                           "--tie-weights" if tied else "--no-tie-weights", "--seed", str(seed),
                           "--checkpoint-every", "200", "--quiet", *(extra or [])]
                label = f"{vocabulary} seed {seed} {name}"
                if not kept_runs.train(run, new_run, label):
                    failed += 1
                    continue
                scores = {}
                for split in SPLITS:
                    scores[split] = kept_runs.evaluate(run, split, label)
                    if scores[split] is None:
                        break
                if any(score is None for score in scores.values()):
                    failed += 1
                    continue
                kept_runs.keep(run, kept, scores)
                test = scores["test"]
                print(f"  test ppl per word {test['ppl_word']:.2f}, {test['bits_per_byte']:.4f} bits per byte",
                      flush=True)
    return 1 if failed else 0


def _summary(folder: Path) -> dict | None:
    """Per-word perplexity and bits per byte on valid and test (of the best checkpoint), test perplexity per token,
    tokens per word, training tokens/s; ``None`` for a run not kept (yet)."""
    if not all((folder / f"{split}.json").exists() for split in SPLITS):
        return None
    valid, test = (json.loads((folder / f"{split}.json").read_text()) for split in SPLITS)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trains = [r for r in records if r["kind"] == "train"]
    rate = trains[-1]["tokens"] / trains[-1]["elapsed_s"] if trains else float("nan")
    return {"dev_word": valid["ppl_word"], "test_word": test["ppl_word"], "dev_bpb": valid["bits_per_byte"],
            "test_bpb": test["bits_per_byte"], "test_token": test["ppl"],
            "tokens_per_word": test["split_tokens"] / test["words"], "tokens_per_s": rate}


def report(output: Path = REPORT, results: Path = RESULTS) -> str:
    """Write the report from the kept runs, and its figures by name beside it (``subword.json``); return the report."""
    corpus, settings, title = PROTOCOLS[PROTOCOL]
    lines = ["# Subword vocabularies: the heads over byte-level BPE",
             "",
             "Generated by `python benchmarks/subword.py report` from the raw runs committed in [subword/](subword/)",
             "(each run's `config.json`, `metrics.jsonl`, `valid.json` and `test.json`); the runs were trained by",
             "`python benchmarks/subword.py train --seeds ...`. Protocol: " + title + " (`fair_quality.py`'s",
             f"`{PROTOCOL}`), with `--tokenizer bpe:SIZE`: a byte-level BPE trained on the training split. Every run",
             "reads the same number of training tokens (subword tokens). Numbers are of the best dev checkpoint",
             "(`best.pt`): perplexity per word, exp(loss of the split / its words, one `<eos>` per line counted), and",
             "bits per byte (loss in bits / the UTF-8 bytes of the split's text), which compare across vocabularies",
             "and with word-level runs; perplexity per token compares only within a vocabulary. Means over the seeds;",
             "*tokens/s* is each run's own, trained beside other jobs: a guide, not a speed comparison.",
             "The same model as a Hugging Face Llama trained by the `Trainer`: [subword-hf.md](subword-hf.md).",
             ""]
    folders = [p for p in results.iterdir() if p.is_dir()] if results.is_dir() else []
    figures: dict = {}
    for folder in sorted(folders, key=lambda p: int(p.name.split("-")[1])):
        seeds = sorted(int(p.name.split("-")[1]) for p in folder.glob("seed-*"))
        table = {name: {s: _summary(folder / f"seed-{s}" / name) for s in seeds} for name in RUNS}
        table = {name: row for name, row in table.items() if any(row.values())}
        if not table:
            continue
        lines += [f"## {folder.name.replace('-', ':')}", "",
                  f"`sohsm lm train --corpus {corpus} {' '.join(settings)} --tokenizer {folder.name.replace('-', ':')} "
                  "--head HEAD --tie-weights|--no-tie-weights --seed S`", "",
                  "| run | seeds | dev ppl/word | test ppl/word | dev bits/byte | test bits/byte | test ppl/token "
                  "| tokens/word | tokens/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        named = figures[folder.name.replace("-", ":")] = {"seeds": seeds, "runs": {}, "pairs": {}}
        for name, row in table.items():
            done = [r for r in row.values() if r]
            mean = lambda key: sum(r[key] for r in done) / len(done)  # noqa: E731
            named["runs"][name] = {
                "seeds": {str(s): {"test_word": round(r["test_word"], 2), "test_bpb": round(r["test_bpb"], 4)}
                          for s, r in row.items() if r},
                "mean_test_word": round(mean("test_word"), 2), "mean_test_bpb": round(mean("test_bpb"), 4)}
            lines.append(f"| {name} | {len(done)} | {mean('dev_word'):.2f} | {mean('test_word'):.2f} | "
                         f"{mean('dev_bpb'):.4f} | {mean('test_bpb'):.4f} | {mean('test_token'):.2f} | "
                         f"{mean('tokens_per_word'):.3f} | {mean('tokens_per_s'):,.0f} |")
        if REFERENCE in table:
            against = []
            for name, row in table.items():
                common = [s for s in seeds if row[s] and table[REFERENCE][s]] if name != REFERENCE else []
                if common:
                    test = fair_quality._paired([row[s]["test_word"] for s in common],
                                                [table[REFERENCE][s]["test_word"] for s in common])
                    dev = fair_quality._paired([row[s]["dev_word"] for s in common],
                                               [table[REFERENCE][s]["dev_word"] for s in common])
                    against.append(f"- {name}: {test} [{dev}]")
                    named["pairs"][f"{name} vs {REFERENCE}"] = {"test": fair_quality.paired_figures(
                        [row[s]["test_word"] for s in common], [table[REFERENCE][s]["test_word"] for s in common])}
            if against:
                lines += ["", f"Against **{REFERENCE}**, seed by seed (test ppl per word; dev in brackets):", "",
                          *against]
        lines.append("")
    text = "\n".join(lines)
    output.write_text(text)
    fair_quality.write_figures(output, figures)
    return text


def main(argv: list[str] | None = None) -> int:
    parser, t, _ = fair_quality.command_line(__doc__, "train, evaluate and keep the runs (resumable)",
                                             "write docs/results/subword.md from the kept runs", REPORT, RESULTS)
    t.add_argument("--vocabularies", default=",".join(VOCABULARIES), help="comma-separated bpe:SIZE values "
                   f"(default: {','.join(VOCABULARIES)})")
    t.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    t.add_argument("--runs-dir", type=Path, default=Path("runs/subword"), help="where the run directories go")
    t.add_argument("--results", type=Path, help="where the kept runs go (default: docs/results/subword, with "
                   "--matched docs/results/subword-matched)")
    t.add_argument("--matched", action="store_true", help=f"add {' '.join(MATCHED_FLAGS)}: the model as like "
                   "subword_hf.py's Llama as sohsm's flags make it")
    # a smoke test on a small text: another corpus, and flags that override the protocol's (tiny model, budget)
    t.add_argument("--corpus", help=argparse.SUPPRESS)
    t.add_argument("--extra", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(args.output, args.results))
        return 0
    runs = fair_quality.chosen(parser, args.runs, RUNS, "runs")
    vocabularies = fair_quality.vocabularies(parser, args.vocabularies)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = args.results or (MATCHED_RESULTS if args.matched else RESULTS)
    extra = [*(MATCHED_FLAGS if args.matched else ()), *args.extra.split()]
    return train(vocabularies, [int(s) for s in args.seeds.split(",")], runs, args.runs_dir, results,
                 args.corpus, extra)


if __name__ == "__main__":
    sys.exit(main())
