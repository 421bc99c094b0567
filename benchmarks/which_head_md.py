"""docs/results/which-head.md's tables, row by row, computed from the named figures of the pages they cite.

which-head.md is written by hand: its prose gives the evidence in words. Its four tables are not: each row is a
figure of fair.json, subword.json or large-vocab.json as this script prints it (the six-epoch LSTM table, the
subword table, the fraction-of-an-epoch table, and the large-vocabulary table with every comparison of
large-vocab.json), and tests/test_claims.py asserts the page's rows are these, row by row. A new kept run changes a
JSON; this script then writes the rows that change.

Usage::

    python benchmarks/which_head_md.py            # rewrites which-head.md's tables from the JSON
    python benchmarks/which_head_md.py --check    # exit 1, naming each row that differs
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHICH_HEAD = ROOT / "docs" / "results" / "which-head.md"
FAIR, SUBWORD = "docs/results/fair.json", "docs/results/subword.json"
LARGE_VOCAB_JSON = "docs/results/large-vocab.json"

WIKITEXT_2, TEXT8 = "WikiText-2 (33k words: `div_value=4`)", "text8 prefix (50k words: `div_value=4`)"
#: the six-epoch LSTM table: (first cell, protocol, the default's run, the peer's label, the peer's run); the metric
#: is dev on text8, test elsewhere
LSTM_ROWS = [
    ("Penn Treebank (10k words: every word at d)", "lstm256-ptb", "self_organized-tied", "full softmax", "full-tied"),
    ("Penn Treebank", "lstm256-ptb", "self_organized-tied", "frequency binning", "two_level_frequency-tied"),
    ("Penn Treebank", "lstm256-ptb", "self_organized-tied", "adaptive softmax", "adaptive-tied"),
    ("Penn Treebank", "lstm256-ptb", "self_organized-tied", "adaptive softmax, tuned", "adaptive_tuned-tied"),
    (WIKITEXT_2, "lstm256-wikitext-2", "self_organized_div4-tied", "adaptive softmax", "adaptive-tied"),
    ("WikiText-2, seed 1 only", "lstm256-wikitext-2", "self_organized_div4-tied", "adaptive softmax, tuned",
     "adaptive_tuned-tied"),
    ("WikiText-2", "lstm256-wikitext-2", "self_organized_div4-tied", "frequency binning", "two_level_frequency-tied"),
    ("WikiText-2", "lstm256-wikitext-2", "self_organized_div4-tied", "itself, every word at d", "self_organized-tied"),
    ("WikiText-2, H200 (4a2cbe9, 283908c)", "lstm256-wikitext-2-cuda", "self_organized_div4-tied", "full softmax",
     "full-tied"),
    (TEXT8, "lstm256-text8", "self_organized_div4-tied", "adaptive softmax", "adaptive-tied"),
    ("text8 prefix", "lstm256-text8", "self_organized_div4-tied", "frequency binning", "two_level_frequency-tied"),
    ("text8 prefix", "lstm256-text8", "self_organized_div4-tied", "itself, every word at d", "self_organized-tied"),
    ("text8 prefix, H200 (4a2cbe9, 283908c)", "lstm256-text8-cuda", "self_organized_div4-tied", "full softmax",
     "full-tied"),
]
#: the subword table: (first cell, run) over 8k and 32k BPE tokens; the fraction-of-an-epoch table: (first cell, head)
SUBWORD_ROWS = [("`two_level_frequency`", "two_level_frequency-tied"), ("`self_organized`", "self_organized-tied"),
                ("`full`", "full-tied"), ("`adaptive` (tied through adaptive input)", "adaptive-tied")]
PROMISE_ROWS = [("`two_level_frequency` (frequency binning)", "two_level_frequency"),
                ("`self_organized`", "self_organized"), ("`full`", "full"),
                ("`adaptive` (tied: adaptive input)", "adaptive")]

#: the large-vocabulary table: its tokenizers and models as the first cell names them, the peers in the order of rows
LARGE_VOCAB, LARGE_VOCAB_MODELS = {"llama3": "Llama 3", "o200k": "o200k"}, {"": "transformer", "lstm256": "LSTM 256"}
LARGE_VOCAB_ANCHORS = {"llama3": "llama-3s-128k", "o200k": "o200ks-200k"}   # which-head-table.md's sections
LARGE_VOCAB_PEERS = {
    "full-tied": "full softmax", "adaptive_20k-tied": "adaptive softmax, 20k head",
    "adaptive_tuned-tied": "adaptive softmax, tuned", "importance_sampling-untied": "importance sampling",
    "two_level_frequency-tied": "frequency binning", "self_organized_spread-tied": "itself, unused spread"}
LARGE_VOCAB_HEADER = ("| vocabulary, model, tokens | against | the head | its | difference | lower on | spread | "
                      "by the rule | source |")


def large_vocab_rows() -> list[str]:
    """Every comparison of large-vocab.json as a row: the head's mean and the peer's (each over its seeds), the gap
    over the seeds both ran, its k of n, the seed-by-seed ratios' spread and the rule's verdict."""
    data, rows = json.loads((ROOT / LARGE_VOCAB_JSON).read_text()), []
    for tokenizer, name in LARGE_VOCAB.items():
        for model, label in LARGE_VOCAB_MODELS.items():
            tables = data[tokenizer].get(model, {}) if model else data[tokenizer]
            for budget in sorted((key for key in tables if key.startswith("tokens-")), key=lambda k: int(k[7:])):
                table = tables[budget]
                if "comparisons" not in table:
                    continue
                assert set(table["comparisons"]) <= set(LARGE_VOCAB_PEERS), f"a peer unlabelled: {table['comparisons']}"
                head = table["runs"]["self_organized-tied"]["test_bpb_mean"]
                for peer, label_of_peer in LARGE_VOCAB_PEERS.items():
                    if peer not in table["comparisons"]:
                        continue
                    gap = table["comparisons"][peer]
                    spread = "–" if gap["spread_pct"] is None else f"{gap['spread_pct']:.2f}%"
                    anchor = (f"{LARGE_VOCAB_ANCHORS[tokenizer]}-vocabulary{'-lstm-256' if model else ''}-wikitext-2-"
                              f"{int(budget[7:]) // 1000}k-tokens")
                    rows.append(f"| {name}, {label}, {int(budget[7:]):,} | {label_of_peer} | {head:.4f} | "
                                f"{table['runs'][peer]['test_bpb_mean']:.4f} | {gap['gap_pct']:+.2f}% | "
                                f"{gap['k']} of {gap['n']} | {spread} | {gap['verdict']} | "
                                f"[the table](which-head-table.md#{anchor}) |")
    return rows


def which_head_tables() -> dict[str, list[str]]:
    """which-head.md's four tables as they must read, row by row (a table by its header), from the named figures:
    each mean over the seeds its difference pairs (fair.md's mean where those are all its seeds), the difference with
    its sign and its k of n."""
    fair = json.loads((ROOT / FAIR).read_text())
    subword = json.loads((ROOT / SUBWORD).read_text())
    lstm = []
    for first, protocol, default, label, peer in LSTM_ROWS:
        table = fair[protocol]
        metric = "dev" if protocol.startswith("lstm256-text8") else "test"
        pair = table["pairs"][f"{default} vs {peer}"][metric]
        seeds = sorted(set(table["runs"][default]["seeds"]) & set(table["runs"][peer]["seeds"]))
        def mean(run: str) -> float:  # the page's mean where the pair has all the run's seeds
            row = table["runs"][run]
            if seeds == sorted(row["seeds"]):
                return row[f"mean_{metric}"]
            return sum(row["seeds"][s][metric] for s in seeds) / len(seeds)
        lstm.append(f"| {first} | {mean(default):.2f} | {label} | {mean(peer):.2f} | {pair['mean_pct']:+.2f}% | "
                    f"{pair['lower']} of {pair['seeds']} | [fair.md](fair.md) |")
    bits = [f"| {first} | " + " | ".join(f"{subword[size]['runs'][run]['mean_test_bpb']:.4f}"
                                         for size in ("bpe:8000", "bpe:32000"))
            + " | [subword.md](subword.md) |" for first, run in SUBWORD_ROWS]
    runs = fair["promise"]["runs"]
    best = min(runs[f"{head}-{tying}"]["mean_test"] for _, head in PROMISE_ROWS for tying in ("tied", "untied"))
    cell = lambda value: f"**{value:.2f}**" if value == best else f"{value:.2f}"  # noqa: E731
    promise = [f"| {first} | {cell(runs[head + '-tied']['mean_test'])} | {cell(runs[head + '-untied']['mean_test'])} | "
               "[fair.md](fair.md) |" for first, head in PROMISE_ROWS]
    return {"| corpus | default | against, tied | its | difference | lower on | source |": lstm,
            LARGE_VOCAB_HEADER: large_vocab_rows(),
            "| head | 8k BPE tokens | 32k BPE tokens | source |": bits, "| head | tied | untied | source |": promise}


def write_tables(text: str, tables: dict[str, list[str]]) -> str:
    """``text`` with the rows under each table's header (after its separator line, up to the first line that is not
    a row) replaced by ``tables``' rows; a header ``text`` lacks is an error, not a table added."""
    lines = text.split("\n")
    for header, rows in tables.items():
        if header not in lines:
            raise SystemExit(f"which-head.md has no table headed {header}")
        at = lines.index(header) + 2
        end = at
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[at:end] = rows
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a row differs")
    args = parser.parse_args(argv)
    text = WHICH_HEAD.read_text()
    written = write_tables(text, which_head_tables())
    changed = [line for line in difflib.unified_diff(text.split("\n"), written.split("\n"), lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    if args.check:
        print("\n".join(changed) or "which-head.md's tables are their figures")
        return 1 if written != text else 0
    if written != text:
        WHICH_HEAD.write_text(written)
    print(f"which-head.md: {len(changed)} line(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
