"""`sohsm tree`: build a word tree for the tree softmax from a trained run (Mnih and Hinton's bootstrap)."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from sohsm.cli.main import RAW as _RAW, CommandError, add_command_group, wrap as _wrap


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tree`` command and its ``build`` subcommand."""
    sub = add_command_group(
        subparsers, "tree",
        description="Build binary word trees for the tree hierarchical softmax from trained runs.",
        epilog="examples:\n  sohsm tree build runs/ptb-tree-random --output ptb-bootstrap.pt",
    )
    p = sub.add_parser(
        "build", help="a bootstrapped tree from a run's context vectors", formatter_class=_RAW,
        description=_wrap(
            "Average, over the run's training text, the hidden state that predicted each word, then split "
            "the words recursively in two with 2-component spherical Gaussian mixtures (Mnih and Hinton "
            "2009). 'balanced' halves every node; 'adaptive' sends each word to its more probable "
            "component. The tree file is read by the 'tree_file' head (option path).",
        ),
        epilog="examples:\n  sohsm lm train --corpus ptb --head tree_random --run-dir runs/ptb-tree-random --epochs 1\n"
        "  sohsm tree build runs/ptb-tree-random --output ptb-bootstrap.pt --variant adaptive",
    )
    p.add_argument("run", metavar="RUN", help="a run directory (from `sohsm lm train`)")
    p.add_argument("--output", "-o", required=True, type=Path, metavar="FILE", help="the tree file to write (.pt)")
    p.add_argument("--variant", choices=("balanced", "adaptive"), default="balanced",
                   help="how a node's words are split (default balanced)")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best", help="best.pt (default) or last.pt")
    p.add_argument("--max-tokens", type=int, metavar="N", help="average over the first N training tokens only")
    p.add_argument("--seed", type=int, default=0, help="seed of the mixtures' starting means (default 0)")
    p.add_argument("--data-dir", metavar="DIR", help="where the run's corpus is, if not where it was found")
    p.add_argument("--device", default="cpu", help="where to run the model (default cpu)")
    p.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    from sohsm.clustering import save_tree, tree_paths
    from sohsm.data import DataError
    from sohsm.tasks.lm.config import LMConfig
    from sohsm.tasks.lm.context import build_bootstrap_tree

    if args.max_tokens is not None and args.max_tokens < 1:
        raise CommandError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.output.exists():
        raise CommandError(f"{args.output} exists; choose another --output or remove it")
    try:
        built = build_bootstrap_tree(args.run, args.variant, checkpoint=args.checkpoint, seed=args.seed,
                                     max_tokens=args.max_tokens, data_dir=args.data_dir, device=args.device)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        save_tree(args.output, built.children, kind="bootstrap", variant=args.variant, seed=args.seed,
                  source_run=str(built.run.run_dir), source_step=built.run.step, corpus=built.run.signature["corpus"])
    except (ValueError, DataError, OSError) as error:
        raise CommandError(str(error)) from None
    lengths = tree_paths(built.children).lengths.double()
    counts = built.counts.double()
    unseen = int((built.counts == 0).sum())
    print(f"{args.output}: {args.variant} tree over {len(lengths):,} words from {built.run.path} "
          f"(step {built.run.step:,}); path length min {int(lengths.min())}, mean {lengths.mean():.2f}, "
          f"max {int(lengths.max())}; {float((counts * lengths).sum() / counts.sum()):.2f} per training token"
          + (f"; {unseen} words never predicted (placed by the mean context)" if unseen else ""))
    assert isinstance(built.run.config, LMConfig)  # a language model's run (the tree reads its context vectors)
    corpus = built.run.config.data.corpus
    output = shlex.quote(str(args.output))
    print(f"train with it: sohsm lm train --corpus {shlex.quote(str(corpus))} --head tree_file --head-option "
          f"path={output} --run-dir RUN_DIR")
    print(f"in Python:     sohsm.build_head('tree_file', d, {len(lengths)}, path={str(args.output)!r})")
    return 0
