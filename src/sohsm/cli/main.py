"""Entry point of the `sohsm` command.

Each subcommand lives in its own module `sohsm.cli.<name>` that defines
``register(subparsers)``; the module adds its parser and sets ``func`` (a
callable taking the parsed ``argparse.Namespace`` and returning an exit code).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from sohsm.version import __version__

#: subcommand modules, in the order `sohsm --help` lists them
COMMANDS = ("data", "lm", "s2s", "w2v", "clusters", "tree", "plot")


#: formatter of every subcommand parser: descriptions are wrapped by :func:`wrap`, epilogs kept as written
RAW = argparse.RawDescriptionHelpFormatter


def wrap(text: str) -> str:
    """A help paragraph wrapped to 100 columns (the parsers keep text as given)."""
    return textwrap.fill(text, 100)


class CommandError(Exception):
    """A user error a subcommand reports as one line and a non-zero exit."""


def add_command_group(subparsers: argparse._SubParsersAction, name: str, *, help: str, description: str,
                      epilog: str) -> argparse._SubParsersAction:
    """Add command ``name`` with subcommands (``sohsm lm train``, ...); returns the action to add them to.

    The command alone prints its help to standard error and exits with 2.
    """
    parser = subparsers.add_parser(name, help=help, formatter_class=RAW, description=wrap(description),
                                   epilog=epilog)
    parser.set_defaults(func=lambda args: usage(parser))
    return parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")


def usage(parser: argparse.ArgumentParser) -> int:
    """Print ``parser``'s help to standard error; the exit status of a command given without its subcommand."""
    parser.print_help(sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sohsm",
        description="Self-organized hierarchical softmax: train, evaluate and inspect "
        "large-vocabulary models.",
    )
    parser.add_argument("--version", action="version", version=f"sohsm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"sohsm.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # for commands that quote themselves in what they write
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CommandError as error:
        print(f"sohsm {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sohsm ... | head`: the reader has gone, and so has the reason to write
        _stdout_to_devnull()
        return 141  # 128 + SIGPIPE, as a process killed by it would report
    except OSError as error:  # a full disk, a read-only folder: the machine's state, one line
        print(f"sohsm {args.command}: error: {describe_os_error(error)}", file=sys.stderr)
        return 1


def describe_os_error(error: OSError) -> str:
    """``runs/x/last.pt: No space left on device``: the file (if known) and the system's reason."""
    reason = error.strerror or str(error)
    return f"{error.filename}: {reason}" if error.filename else reason


def _stdout_to_devnull() -> None:
    """Point standard output to ``os.devnull``, so that Python's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # a replaced stdout (tests) has no descriptor
        pass


if __name__ == "__main__":
    raise SystemExit(main())
