"""Where trained language models put their probability: the mass each frequency band of words gets.

For every run given, the dev split is read in order (the run's BPTT and evaluation
batch size, state carried) and the model's exact next-word distribution is summed
over bands of the vocabulary's frequency ranks; the table gives the mean mass per
band beside the share of dev tokens in that band and the training unigram mass.
A well-calibrated model gives a band about the share of tokens that fall in it;
a head whose training never shows it a word (a sampled objective in a short
training) can give that word far too much. A second table says where two heads'
perplexities part: each band's share of the dev tokens' summed NLL (nats per dev
token, so the bands add up to the run's NLL, whose exp is its perplexity).

Usage::

    python benchmarks/probability_mass.py runs/ptb-table1/pmi runs/ptb-table1/pmi-shift
    python benchmarks/probability_mass.py RUN... --bands 100 1000 5000 --tokens 20000
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from sohsm.data import load_corpus
from sohsm.tasks.lm import stream_hidden_states
from sohsm.train import load_run


def band_edges(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` frequency-rank ranges cut at ``cuts`` (those below ``n``)."""
    bounds = [0, *[c for c in cuts if 0 < c < n], n]
    return list(zip(bounds, bounds[1:]))


@torch.no_grad()
def band_mass(run_dir: Path, cuts: list[int], tokens: int) -> dict:
    """Mean predicted mass per band, the dev tokens' share per band, and the unigram mass per band."""
    run = load_run(run_dir, "best")
    d = run.config.data
    corpus = load_corpus(d.corpus, d.data_dir, min_count=d.min_count, max_size=d.max_size, cache_dir=d.cache_dir,
                         text_mode=d.text_mode)
    ids = corpus.valid[:tokens]
    n = run.head.n_classes
    counts = torch.as_tensor(run.vocab.counts, dtype=torch.float64)
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.argsort(counts, descending=True, stable=True)] = torch.arange(n)  # 0 = most frequent
    edges = band_edges(n, cuts)
    band_of_word = torch.zeros(n, dtype=torch.long)
    for b, (lo, hi) in enumerate(edges):
        band_of_word[(rank >= lo) & (rank < hi)] = b
    predicted = torch.zeros(len(edges), dtype=torch.float64)
    seen = torch.zeros(len(edges), dtype=torch.float64)
    nll = torch.zeros(len(edges), dtype=torch.float64)
    total = 0
    for hidden, target in stream_hidden_states(run.model, ids, run.config.eval_batch_size, run.config.bptt):
        log_probs = run.head.log_prob(hidden).double()  # [T, N]
        predicted.index_add_(0, band_of_word, log_probs.exp().sum(0))
        seen.index_add_(0, band_of_word[target], torch.ones(target.numel(), dtype=torch.float64))
        nll.index_add_(0, band_of_word[target], -log_probs.gather(1, target[:, None]).squeeze(1))
        total += target.numel()
    unigram = torch.zeros(len(edges), dtype=torch.float64).index_add_(0, band_of_word, counts / counts.sum())
    return {"edges": edges, "predicted": (predicted / total).tolist(), "dev": (seen / total).tolist(),
            "unigram": unigram.tolist(), "nll": (nll / total).tolist(), "tokens": total, "head": run.config.head.name,
            "options": run.config.head.options}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run directories")
    parser.add_argument("--bands", type=int, nargs="+", default=[100, 1000, 5000],
                        help="frequency ranks where bands start (default: 100 1000 5000)")
    parser.add_argument("--tokens", type=int, default=20000, help="dev tokens read (default 20000)")
    args = parser.parse_args(argv)
    rows = [(run, band_mass(run, args.bands, args.tokens)) for run in args.runs]
    edges = rows[0][1]["edges"]
    names = [f"ranks {lo + 1:,}-{hi:,}" for lo, hi in edges]
    print(f"Mean predicted probability per band of frequency ranks, over the first {rows[0][1]['tokens']:,} "
          "dev tokens:\n")
    print("| run | head | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for run, r in rows:
        options = ",".join(f"{k}={v}" for k, v in sorted(r["options"].items()))
        head = r["head"] + (f" ({options})" if options else "")
        print(f"| {run.name} | {head} | " + " | ".join(f"{100 * p:.1f}%" for p in r["predicted"]) + " |")
    first = rows[0][1]
    print("| dev tokens in the band | | " + " | ".join(f"{100 * p:.1f}%" for p in first["dev"]) + " |")
    print("| training unigram mass | | " + " | ".join(f"{100 * p:.1f}%" for p in first["unigram"]) + " |")
    print("\nEach band's part of the dev NLL (nats per dev token; the parts add up to the run's NLL):\n")
    print("| run | head | " + " | ".join(names) + " | NLL | ppl |")
    print("|---|---|" + "---:|" * (len(names) + 2))
    for run, r in rows:
        total_nll = sum(r["nll"])
        print(f"| {run.name} | {r['head']} | " + " | ".join(f"{v:.4f}" for v in r["nll"])
              + f" | {total_nll:.4f} | {math.exp(total_nll):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
