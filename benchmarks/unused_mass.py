"""What a head gives the tokens its training never shows: the probability mass on vocabulary rows whose training
count is 0 (most of a 128k-token tokenizer's rows on a small corpus), mean over test positions.

For each run given, the best checkpoint reads the first ``--tokens`` tokens of the test split in order (the run's
BPTT and evaluation batch), scores every row (``head.log_prob``, float64 sums) and reports the mean mass on the
unused rows. For a head with clusters (the self-organized head, frequency binning) it also says where the unused
rows sit: how many clusters hold one, how many hold nothing else, the share of unused rows in those, and the mean
mass on clusters of unused rows alone.

It also says what that mass costs: *renormalized_gain_bits*, the bits per test token the head would save if the
unused rows' mass went to the used rows in proportion (``-log2(1 - m)`` at each position whose target training
uses, ``m`` that position's unused mass, averaged over all positions); ``targets_unused`` counts the positions whose
target training never shows (left out of that sum: moving their mass away would cost there, not save).

Usage::

    python benchmarks/unused_mass.py runs/large-vocab/llama3/tokens-500000/seed-1/self_organized-tied
    python benchmarks/unused_mass.py RUN... --tokens 16384
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from sohsm.tasks.lm import load_lm_corpus, stream_hidden_states
from sohsm.train import load_run

#: hidden states scored at a time (each an ``N``-wide row of float64 probabilities)
ROWS = 512


@torch.no_grad()
def measure(run_dir: Path, tokens: int = 16384) -> dict:
    """The mean probability mass on rows of training count 0, and for a clustered head where those rows sit."""
    run = load_run(run_dir, "best")
    corpus = load_lm_corpus(run.config, run_dir=run_dir)
    unused = torch.as_tensor(run.vocab.counts == 0)
    n = run.head.n_classes
    assignment = getattr(run.head, "assignment", None)
    clustered = isinstance(assignment, torch.Tensor) and assignment.numel() == n
    if clustered:
        assignment = assignment.cpu().long()
        n_clusters = int(assignment.max()) + 1
        size = torch.bincount(assignment, minlength=n_clusters)
        holding = torch.bincount(assignment[unused], minlength=n_clusters)
        only_unused = (holding == size) & (size > 0)
    mass = mass_only = gain_bits = 0.0
    seen = targets_unused = 0
    run.model.eval()
    run.head.eval()
    ids = corpus.test[:tokens]
    unused_rows, used_rows = unused.nonzero().squeeze(1), (~unused).nonzero().squeeze(1)
    only_rows = only_unused[assignment].nonzero().squeeze(1) if clustered else None
    for hidden, target in stream_hidden_states(run.model, ids, run.config.eval_batch_size, run.config.bptt):
        for rows, targets in zip(hidden.split(ROWS), target.split(ROWS)):  # [ROWS, N] at a time: 200k rows x
            log_probs = run.head.log_prob(rows).double()                    # 4,096 positions: 6.5 GB a copy
            probs = log_probs.exp()
            mass += float(probs.index_select(1, unused_rows).sum())
            used_target = ~unused[targets.cpu()].to(probs.device)
            targets_unused += int((~used_target).sum())
            # -log2(1 - m) as -log2 of the used rows' own sum: exact where m is close to 1
            on_used = torch.logsumexp(log_probs[used_target].index_select(1, used_rows), 1)
            gain_bits += float(-on_used.sum()) / math.log(2)
            if clustered:
                mass_only += float(probs.index_select(1, only_rows).sum())
        seen += target.numel()
    out = {"run": run_dir.name, "head": run.config.head.name, "rows": n, "unused_rows": int(unused.sum()),
           "test_tokens": seen, "unused_mass": mass / seen,
           "uniform_share": int(unused.sum()) / n, "renormalized_gain_bits": gain_bits / seen,
           "targets_unused": targets_unused}
    if clustered:
        out |= {"clusters": n_clusters, "clusters_holding_unused": int((holding > 0).sum()),
                "clusters_of_unused_only": int(only_unused.sum()),
                "unused_rows_in_those": int(holding[only_unused].sum()),
                "mass_on_clusters_of_unused_only": mass_only / seen}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run directories")
    parser.add_argument("--tokens", type=int, default=16384, help="test tokens read (default 16384)")
    parser.add_argument("--write", type=Path, nargs="+", metavar="DIR",
                        help="also write each run's figures to DIR/unused.json (one DIR per run, in order)")
    args = parser.parse_args(argv)
    if args.write and len(args.write) != len(args.runs):
        parser.error(f"--write names {len(args.write)} folders for {len(args.runs)} runs: one per run")
    for i, run in enumerate(args.runs):
        figures = measure(run, args.tokens)
        print(json.dumps(figures), flush=True)
        if args.write:
            (args.write[i] / "unused.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
