"""`sohsm plot`: the paper's Figure 1 (dev perplexities, class changes) for one or more runs."""
from __future__ import annotations

import argparse
import sys

from sohsm.cli.main import COMMANDS, RAW as _RAW, CommandError, describe_os_error, wrap as _wrap


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plot`` command."""
    parser = subparsers.add_parser(
        "plot", help=COMMANDS["plot"], formatter_class=_RAW,
        description=_wrap(
            "Draw dev perplexity, cluster perplexity, in-cluster perplexity, class change rate, moved "
            "token mass and training perplexity against training tokens (or epochs, seconds, steps), one line "
            "per run, as a PNG. Tokens line up runs of different batch sizes.",
        ),
        epilog="examples:\n  sohsm plot runs/ptb-sohsm\n"
        "  sohsm plot runs/ptb-full runs/ptb-sohsm runs/ptb-freq -o figure1.png\n"
        "  sohsm plot runs/ptb-full runs/ptb-sohsm --x seconds -o against-time.png",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories (from `sohsm lm train`)")
    parser.add_argument("-o", "--output", metavar="OUT.png", help="where to write (default: <first RUN>/figure1.png)")
    parser.add_argument("--x", choices=("tokens", "epochs", "seconds", "steps"), default="tokens",
                        help="the x axis (default tokens; seconds: training time without evaluations; "
                        "steps: the paper's)")
    parser.set_defaults(func=_plot)


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sohsm.runs.plots import figure1, read_runs, without_dev_evaluation

    try:
        for run, name in zip(read_runs([Path(r) for r in args.runs]), args.runs):
            if run in without_dev_evaluation([run]):
                print(f"note: {name} has no dev evaluation yet: its training records and re-clusterings are drawn",
                      file=sys.stderr)
        path = figure1(args.runs, args.output, x=args.x)
    except ValueError as error:
        raise CommandError(str(error)) from None
    except OSError as error:  # a read-only or missing folder
        raise CommandError(f"cannot write the figure: {describe_os_error(error)}") from None
    print(path)
    return 0
