"""Entry point of the `sohsm` command.

Each subcommand lives in its own module `sohsm.cli.<name>` that defines
``register(subparsers)``; the module adds its parser and sets ``func`` (a
callable taking the parsed ``argparse.Namespace`` and returning an exit code).

Every error is one line on standard error with one prefix, the command's
(``sohsm lm: error: ...``), whoever finds it: argparse (an unknown choice, a
missing or unrecognised flag), a subcommand's own checks (:class:`CommandError`)
or the machine (:class:`OSError`).

Start-up is quick (``sohsm --help``, ``--version`` and ``data list`` import no torch): a command's module is
imported only when that command is run, and modules import torch and the heads where they use them. A Ctrl-C
at any point of a command, its start-up included, is one line, exit status 130.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import textwrap
import warnings
from collections.abc import Iterable
from typing import NoReturn

from sohsm.fields import did_you_mean
from sohsm.version import __version__

#: subcommand modules (``sohsm.cli.<name>``) and their one-line help, in the order `sohsm --help` lists them;
#: only the module of the command run is imported
COMMANDS = {
    "data": "fetch, list and inspect corpora",
    "lm": "train, evaluate and sample from language models",
    "s2s": "headline generation: make pairs, train, decode, score",
    "w2v": "word embeddings with any head (word2vec's CBOW and skip-gram)",
    "clusters": "inspect the word clusters of a trained run",
    "tree": "build word trees for the tree softmax",
    "plot": "draw the paper's Figure 1 for training runs",
}


#: columns of the help where the terminal's width is unknown (a pipe, a file), and at most on a wide terminal
HELP_COLUMNS, MAX_HELP_COLUMNS = 120, 140


class RAW(argparse.RawDescriptionHelpFormatter):
    """Formatter of every subcommand parser: descriptions are wrapped by :func:`wrap`, epilogs kept as written, the
    options as wide as the terminal (:data:`HELP_COLUMNS` where it is no terminal, at most :data:`MAX_HELP_COLUMNS`),
    each help beside its flag."""

    def __init__(self, prog: str) -> None:
        columns = shutil.get_terminal_size((HELP_COLUMNS, 24)).columns
        super().__init__(prog, width=max(60, min(MAX_HELP_COLUMNS, columns) - 2), max_help_position=32)


def wrap(text: str) -> str:
    """A help paragraph wrapped to 100 columns (the parsers keep text as given)."""
    return textwrap.fill(text, 100)


class CommandError(Exception):
    """A user error a subcommand reports as one line and a non-zero exit."""


def error_line(prog: str, message: str) -> str:
    """``sohsm lm: error: MESSAGE``: an error of ``prog`` (``sohsm lm train``) under its command's prefix."""
    return f"{' '.join(prog.split()[:2])}: error: {message}"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line under the command's prefix, as the commands' own are
    (argparse's default prints the whole usage first, under another prefix); ``--help`` shows the usage.

    Flags are taken only as written in full: a prefix (``--hidden`` for ``--hidden-size``) would make a saved
    command mean something else, or nothing, once a flag sharing that prefix is added."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value) -> None:
        """argparse's check of a choice, with the choices close to a mistyped one (``--head self_organised``)."""
        if action.choices is not None and value not in action.choices:
            hint = did_you_mean(value, action.choices)
            listed = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{'; ' + hint if hint else ''} "
                                                 f"(choose from {listed})")

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")  # "argument --head: invalid choice": the flag comes first
        self.exit(2, error_line(self.prog, f"{message} (see {self.prog} --help)") + "\n")


def add_command_group(subparsers: argparse._SubParsersAction, name: str, *, description: str,
                      epilog: str) -> argparse._SubParsersAction:
    """Add command ``name`` with subcommands (``sohsm lm train``, ...); returns the action to add them to.

    Its one-line help is its entry in :data:`COMMANDS`. The command alone prints its help to standard error and
    exits with 2.
    """
    parser = subparsers.add_parser(name, help=COMMANDS[name], formatter_class=RAW, description=wrap(description),
                                   epilog=epilog)
    parser.set_defaults(func=lambda args: usage(parser))
    return parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")


def usage(parser: argparse.ArgumentParser) -> int:
    """Print ``parser``'s help to standard error; the exit status of a command given without its subcommand."""
    parser.print_help(sys.stderr)
    return 2


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``sohsm`` parser with the full parsers of ``commands`` (default: all); any other command is there by
    name and help alone, its module not imported."""
    parser = Parser(
        prog="sohsm",
        description="Self-organized hierarchical softmax: train, evaluate and inspect "
        "large-vocabulary models.",
    )
    parser.add_argument("--version", action="version", version=f"sohsm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    built = set(COMMANDS if commands is None else commands)
    for name, help in COMMANDS.items():
        if name in built:
            importlib.import_module(f"sohsm.cli.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=help)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The command ``argv`` runs (its first word that is no option), or ``None``."""
    return next((word for word in argv if not word.startswith("-")), None)


def subcommand_parser(parser: argparse.ArgumentParser, words: Iterable[str | None]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``words`` name (``["lm", "train"]``), as deep as they go; ``parser`` itself
    for none."""
    for word in words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if word is None or not actions or word not in actions[0].choices:
            break
        parser = actions[0].choices[word]
    return parser


def flag_hint(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """``" (did you mean --hidden-size?)"``: the flag of ``parser`` closest to each mistyped one among ``unknown``
    (``--hiden-size``, ``--hiden-size=8``), or ``""`` where none is close."""
    flags = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    mistyped = [word.partition("=")[0] for word in unknown if word.startswith("--")]
    hints = {word: did_you_mean(word, flags, n=1) for word in mistyped}
    hints = {word: hint for word, hint in hints.items() if hint}
    if len(hints) == 1:
        return f" ({next(iter(hints.values()))})"
    return " (" + "; ".join(f"{word}: {hint}" for word, hint in hints.items()) + ")" if hints else ""


def run() -> NoReturn:
    """The ``sohsm`` command and ``python -m sohsm``: :func:`main` on the process's arguments, then exit.

    A process that trained beside others (``torchrun``) leaves with ``os._exit`` once its
    output is flushed, skipping the interpreter's shutdown, where torch 2.13's gloo
    worker threads can abort a run that succeeded (see
    :func:`sohsm.train.distributed.started_a_group`).
    """
    code = main()
    distributed = sys.modules.get("sohsm.train.distributed")  # not imported: no process group was started
    if distributed is not None and distributed.started_a_group():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written to it
                pass
        os._exit(code)
    raise SystemExit(code)


class one_line_warnings:  # noqa: N801 - used as a context manager, as warnings.catch_warnings
    """sohsm's own warnings as one line each (``sohsm: warning: ...``), not Python's two with the source line
    that raised them; warnings of other packages as Python formats them."""

    _package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def __enter__(self) -> None:
        self._format = warnings.formatwarning

        def format_warning(message, category, filename, lineno, line=None):
            if os.path.abspath(filename).startswith(self._package + os.sep):
                return f"sohsm: warning: {message}\n"
            return self._format(message, category, filename, lineno, line)

        warnings.formatwarning = format_warning

    def __exit__(self, *exc) -> None:
        warnings.formatwarning = self._format


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) asks for; its exit status.

    A Ctrl-C during start-up (imports, parsing) is one line and 130, as during a command."""
    try:
        with one_line_warnings():
            return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    parser = build_parser([command for command in [command_of(argv)] if command in COMMANDS])
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # found by the top parser, but said under the subcommand that was given them
        words = [getattr(args, key, None) for key in ("command", f"{args.command}_command")]
        prog = " ".join(["sohsm", *filter(None, words)])
        hint = flag_hint(unknown, subcommand_parser(parser, words))
        print(error_line(prog, f"unrecognized arguments: {' '.join(unknown)}{hint} (see {prog} --help)"),
              file=sys.stderr)
        return 2
    args.argv = argv  # for commands that quote themselves in what they write
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = f"sohsm {args.command}"
    try:
        return int(args.func(args) or 0)
    except CommandError as error:
        print(error_line(prog, str(error)), file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sohsm ... | head`: the reader has gone, and so has the reason to write
        _stdout_to_devnull()
        return 141  # 128 + SIGPIPE, as a process killed by it would report
    except OSError as error:  # a full disk, a read-only folder: the machine's state, one line
        print(error_line(prog, describe_os_error(error)), file=sys.stderr)
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
