"""`sohsm clusters`: what a trained two-level head's clusters hold (the paper's Table 3)."""
from __future__ import annotations

import argparse
import sys

from sohsm.cli.main import RAW as _RAW, CommandError, wrap as _wrap





def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``clusters`` command and its ``show`` subcommand."""
    parser = subparsers.add_parser(
        "clusters", help="inspect the word clusters of a trained run", formatter_class=_RAW,
        description=_wrap(
            "Inspect the word clusters of a run trained with a two-level head.",
        ),
        epilog="examples:\n  sohsm clusters show runs/ptb-sohsm\n  sohsm clusters show runs/ptb-sohsm --word actor",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="clusters_command", metavar="SUBCOMMAND")
    p = sub.add_parser(
        "show", help="the heaviest clusters and their most frequent words", formatter_class=_RAW,
        description=_wrap(
            "List the clusters of a run's head, heaviest (by share of training tokens) first, with "
            "their sizes, token mass and most frequent words, like the paper's Table 3; or the cluster of one word.",
        ),
        epilog="examples:\n  sohsm clusters show runs/ptb-sohsm --top 8 --words 10\n"
        "  sohsm clusters show runs/ptb-sohsm --word company --words 30\n"
        "  sohsm clusters show runs/ptb-sohsm --checkpoint last",
    )
    p.add_argument("run", metavar="RUN", help="a run directory (from `sohsm lm train`)")
    p.add_argument("--top", type=int, default=8, metavar="N", help="clusters to show (default 8; 0 = all)")
    p.add_argument("--words", type=int, default=10, metavar="N", help="words per cluster (default 10; 0 = all)")
    p.add_argument("--word", metavar="WORD", help="show the cluster of WORD instead")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="best.pt (best dev perplexity, the default) or last.pt")
    p.set_defaults(func=_show)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _show(args: argparse.Namespace) -> int:
    from sohsm.train import cluster_of_word, cluster_table, load_run

    for flag, value in (("--top", args.top), ("--words", args.words)):
        if value < 0:
            raise CommandError(f"{flag} must be >= 0, got {value}")
    words = args.words or None
    try:
        run = load_run(args.run, args.checkpoint)
        if not callable(getattr(run.head, "clusters", None)):
            raise CommandError(f"{args.run} was trained with the {run.config.head.name!r} head, which has no "
                               "word clusters; clusters exist for two-level heads only")
        if args.word is not None:
            rows = [cluster_of_word(run.head, run.vocab, args.word, words)]
            table = cluster_table(run.head, run.vocab, words=0)
            rank = {s.cluster: i + 1 for i, s in enumerate(table)}
        else:
            table = cluster_table(run.head, run.vocab, words)
            rank = {s.cluster: i + 1 for i, s in enumerate(table)}
            rows = table[: args.top] if args.top else table
    except ValueError as error:
        raise CommandError(str(error)) from None
    sizes = [s.size for s in table]
    empty = sum(1 for n in sizes if n == 0)
    print(f"{run.path} (step {run.step:,}): {run.config.head.name} head, {len(table)} clusters "
          f"({empty} empty), {len(run.vocab):,} words")
    print(f"{'rank':>4}  {'cluster':>7}  {'words':>5}  {'tf-mass':>7}  most frequent words")
    for s in rows:
        print(f"{rank[s.cluster]:>4}  {s.cluster:>7}  {s.size:>5}  {s.tf_mass:>7.4f}  {' '.join(s.words)}")
    return 0
