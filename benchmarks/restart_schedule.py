"""A two-phase schedule for the self-organized head, at equal training tokens.

Phase 1 trains the LSTM LM with the self-organized head for ``--phase1`` epochs
(re-clustering every ``--update-every`` steps); phase 2 starts everything afresh
(same seed: model, head weights and optimizer) on phase 1's final clusters, held
fixed, for the rest of the token budget (``--epochs`` in all). It asks whether
"learn the clusters first, then train on them" beats learning while the clusters
move (docs/results/lm.md reports the answer: at equal tokens, it does not).

Usage::

    python benchmarks/restart_schedule.py --corpus ptb --out runs/ptb-restart --phase1 0.25 \\
        --update-every 10 --epochs 3 --emb-size 256 --hidden-size 256 --dropout 0.2 --seed 1
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sohsm.heads.registry import register_head
from sohsm.heads.two_level.softmax import TwoLevelSoftmax
from sohsm.tasks.lm import LMConfig, load_lm_corpus
from sohsm.train import apply_overrides, train
from sohsm.train.checkpoint import load_checkpoint

_CLUSTERS: dict = {}


@register_head("two_level_phase1_clusters")
def _phase1_clusters(in_features: int, n_classes: int, counts=None) -> TwoLevelSoftmax:
    """A fixed two-level head on the clusters phase 1 ended with."""
    return TwoLevelSoftmax(in_features, n_classes, assignment=_CLUSTERS["assignment"],
                           n_clusters=_CLUSTERS["n_clusters"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="ptb")
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase1", type=float, default=0.25, help="epochs of phase 1")
    parser.add_argument("--update-every", type=int, default=10, help="K during phase 1")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of both phases together")
    parser.add_argument("--emb-size", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    common = {"data.corpus": args.corpus, "model.emb_size": args.emb_size, "model.hidden_size": args.hidden_size,
              "model.dropout": args.dropout, "epochs": args.epochs, "seed": args.seed, "eval_every": 0}
    config = apply_overrides(LMConfig(), {**common, "head.name": "self_organized",
                                            "head.update_every": args.update_every})
    corpus = load_lm_corpus(config)
    tokens_per_epoch = (corpus.train.numel() // config.batch_size - 1) * config.batch_size
    phase1_tokens = int(args.phase1 * tokens_per_epoch)
    out = Path(args.out)
    if not (out / "phase1" / "last.pt").exists():
        train(apply_overrides(config, {"max_tokens": phase1_tokens}), out / "phase1")
    head_state = load_checkpoint(out / "phase1" / "last.pt")["head"]
    _CLUSTERS.update(assignment=head_state["assignment"], n_clusters=int(head_state["cluster_weight"].shape[0]))
    phase2 = apply_overrides(LMConfig(), {**common, "head.name": "two_level_phase1_clusters",
                                             "max_tokens": args.epochs * tokens_per_epoch - phase1_tokens})
    result = train(phase2, out / "phase2")
    print(f"phase 1: {phase1_tokens:,} tokens; phase 2: {result.tokens:,} tokens; best dev ppl {result.best_ppl:.2f}")


if __name__ == "__main__":
    main()
