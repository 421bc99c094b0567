"""What a head gives the tokens its training never shows: the probability mass on vocabulary rows whose training
count is 0 (most of a 128k-token tokenizer's rows on a small corpus), mean over test positions.

For each run given, the best checkpoint reads the first ``--tokens`` tokens of the test split in order (the run's
BPTT and evaluation batch), scores every row (``head.log_prob``, float64 sums) and reports the mean mass on the
unused rows. For a head with clusters (the self-organized head, frequency binning) it also says where the unused
rows sit: how many clusters hold one, how many hold nothing else, the share of unused rows in those, and the mean
mass on clusters of unused rows alone.

Usage::

    python benchmarks/unused_mass.py runs/large-vocab/llama3/tokens-500000/seed-1/self_organized-tied
    python benchmarks/unused_mass.py RUN... --tokens 16384
"""
from __future__ import annotations

import argparse
import json
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
    mass = mass_only = 0.0
    seen = 0
    run.model.eval()
    run.head.eval()
    ids = corpus.test[:tokens]
    unused_rows = unused.nonzero().squeeze(1)
    only_rows = only_unused[assignment].nonzero().squeeze(1) if clustered else None
    for hidden, target in stream_hidden_states(run.model, ids, run.config.eval_batch_size, run.config.bptt):
        for rows in hidden.reshape(-1, hidden.size(-1)).split(ROWS):  # [ROWS, N] at a time: 200k rows x 4,096
            probs = run.head.log_prob(rows).double().exp()            # positions would be 6.5 GB a copy
            mass += float(probs.index_select(1, unused_rows).sum())
            if clustered:
                mass_only += float(probs.index_select(1, only_rows).sum())
        seen += target.numel()
    out = {"run": run_dir.name, "head": run.config.head.name, "rows": n, "unused_rows": int(unused.sum()),
           "test_tokens": seen, "unused_mass": mass / seen,
           "uniform_share": int(unused.sum()) / n}
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
    args = parser.parse_args(argv)
    for run in args.runs:
        print(json.dumps(measure(run, args.tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
