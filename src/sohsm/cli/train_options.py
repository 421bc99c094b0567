"""The training commands of every task (`sohsm lm train`, `s2s train`, `w2v train`, and `lm compare`): one path.

Their flags are generated from the task's config (:mod:`sohsm.cli.config_flags`);
:func:`training_overrides` turns them (and ``--config FILE``) into dotted config
fields, so a run that `lm compare` trains is the run `lm train` would train from
the same flags, and :func:`train_command` trains or resumes a run of any task.
"""
from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sohsm.cli.config_file import read_config_file
from sohsm.cli.config_flags import (  # noqa: F401  (parse_option_list: lm compare's too)
    Flag,
    add_config_flags,
    config_flags,
    given_value,
    parse_head_option,
    parse_option_list,
    render_error,
    typed_fields,
)
from sohsm.cli.main import RAW, CommandError, wrap
from sohsm.data.errors import DataError
from sohsm.head_catalogue import head_names, option_names

if TYPE_CHECKING:  # (the training package imports torch, which --help does without)
    from sohsm.train.config import RunConfig


def add_training_options(p: argparse.ArgumentParser, config_class: type[RunConfig], *,
                         compare: bool = False) -> list[Flag]:
    """Add the flags of ``config_class``'s fields to ``p`` (:mod:`sohsm.cli.config_flags`) and the command's own:
    ``--run-dir`` and ``--resume`` (not for `lm compare`, which also takes no ``--head``), ``--quiet``."""
    def command_flags(run: argparse._ArgumentGroup) -> None:
        if not compare:
            run.add_argument("--run-dir", required=True, metavar="DIR", help="where the run's files go")
            run.add_argument("--resume", action="store_true",
                             help="continue the run in --run-dir from last.pt (budgets, logging intervals, the "
                             "device and data locations may change; other options must match the run)")
        run.add_argument("--quiet", action="store_true", help="no start-up lines, progress bar or evaluation lines")

    return add_config_flags(p, config_class, leave_out=("head.name",) if compare else (), command_flags=command_flags)


def train_usage(config_class: type[RunConfig]) -> str:
    """The usage line of a task's ``train`` command: what a new run needs, or ``--resume``, then the options."""
    needs = " ".join(f"{f.option} {f.metadata.get('metavar') or 'NAME'}" for f in config_flags(config_class)
                     if f.metadata.get("required") and f.path not in config_class.defaulted_fields)
    start = f"[{needs} | --resume]" if needs else "[--resume]"
    return f"%(prog)s --run-dir DIR {start} [OPTION ...]"


def head_options_help() -> str:
    """An epilog paragraph listing each registered head's options, from the head catalogue (the registry's names,
    read without importing torch; a test keeps the two in step)."""
    lines = ["head options (--head-option KEY=VALUE; see each head's docstring for their meaning):"]
    width = max(map(len, head_names()))
    for name in head_names():
        options = option_names(name)
        listed = "any (not checked)" if options is None else ", ".join(options) or "none"
        lines.append(textwrap.fill(listed, 120, initial_indent=f"  {name:<{width}}  ",
                                   subsequent_indent=" " * (width + 4)))
    return "\n".join(lines) + "\n"


def training_overrides(args: argparse.Namespace, flags: list[Flag], config_class: type[RunConfig]) -> dict[str, Any]:
    """The config fields set by ``--config FILE`` and then by the flags typed (the head's options excepted),
    as dotted paths.

    Raises:
        CommandError: an unreadable or invalid config file.
    """
    overrides: dict[str, Any] = {}
    typed = typed_fields(args, flags)
    if getattr(args, "config", None):
        try:
            overrides.update(read_config_file(args.config, config_class, typed))
        except ValueError as error:
            raise CommandError(str(error)) from None
    overrides.update(typed)
    return overrides


def requested_head_options(args: argparse.Namespace) -> tuple[dict[str, Any], int | None]:
    """The ``--head-option`` pairs as a dict and the K of ``--update-every`` (or of ``--head-option update_every``).

    Raises:
        CommandError: a malformed or repeated option, or two different values of K.
    """
    options: dict[str, Any] = {}
    for text in args.head_option or []:
        try:
            key, value = parse_head_option(text)
        except ValueError as error:
            raise CommandError(f"--head-option: {error}") from None
        if key in options:
            raise CommandError(f"--head-option {key} is given twice")
        options[key] = value
    update_every = given_value(getattr(args, "update_every", None))
    if "update_every" in options:
        value = options.pop("update_every")
        if update_every is not None and value != update_every:
            raise CommandError(f"--update-every {update_every} and --head-option update_every={value} disagree")
        update_every = value
    return options, update_every


def heads_with(option: str) -> list[str]:
    """The registered heads that take ``option``."""
    return [name for name in head_names() if option in (option_names(name) or ())]


def check_update_every(head: str, update_every: int | None) -> None:
    """Refuse ``--update-every`` for a head that never re-clusters.

    Raises:
        CommandError: naming the flag, its value, the head and the heads that take it.
    """
    takes = option_names(head) if head in head_names() else None
    if update_every is not None and "update_every" not in (takes or ("update_every",)):
        raise CommandError(f"--update-every ({update_every}) means nothing for head {head!r}: it never re-clusters "
                           f"(heads that do: {', '.join(heads_with('update_every'))})")


def head_overrides(head: str, options: dict[str, Any], update_every: int | None) -> dict[str, Any]:
    """The config fields of a head with its options, checked against the head's signature.

    Raises:
        CommandError: an option the head does not take, or a value of the wrong type.
    """
    from sohsm.heads import check_head_options

    check_update_every(head, update_every)
    try:
        check_head_options(head, options)
    except ValueError as error:
        raise CommandError(str(error)) from None
    overrides: dict[str, Any] = {"head.name": head}
    if options:
        overrides["head.options"] = dict(options)
    if update_every is not None:
        overrides["head.update_every"] = update_every
    return overrides


def stop_reason(result: Any, budget: str = "token") -> str:
    """Why a session stopped, in the words every task's summary uses: ``all epochs done``, ``token budget spent``
    (``budget``: what the task's ``--max-tokens`` counts, "row" for word vectors), ``time budget spent``,
    ``interrupted (SIGTERM)``."""
    if result.stopped == "interrupted":
        from sohsm.train.guard import signal_name

        return f"interrupted ({signal_name(result.stop_signal)})" if result.stop_signal else "interrupted"
    return {"done": "all epochs done", "max_tokens": f"{budget} budget spent",
            "time_budget": "time budget spent"}[result.stopped]


def training_time(result: Any, unit: str = "tokens", also: str = "") -> str:
    """``"1.1 s of training (18,148 tokens/s)"``: a summary's seconds of training (all sessions) and this session's
    speed, as its progress bar's closing line gives it (``also``: more said in its brackets); a resumed run says
    whose is which; compiling, where the session compiled (``--compile``, word2vec's Numba loops), is given apart."""
    text = f"{result.elapsed_s:.{2 if result.elapsed_s < 1 else 1}f} s of training"
    resumed = result.session_tokens != result.tokens
    if result.session_s > 0:
        text += f" ({result.tokens_per_s:,.0f} {unit}/s{' this session' if resumed else ''}{also})"
    if result.compile_s > 0:
        text += f" + {result.compile_s:.1f} s compiling ({getattr(result, 'compiled', '--compile')}; not counted)"
    return text


def dev_line(result: Any, scores: Callable[[Any], str]) -> str | None:
    """A summary's ``dev`` line: ``scores(last evaluation)`` and the best perplexity; for a session that stopped
    before its first evaluation, the run's best perplexity so far; ``None`` for a run never evaluated."""
    if result.last_eval is not None:
        best = "n/a" if result.best_ppl is None else f"{result.best_ppl:.2f}"
        return f"dev         {scores(result.last_eval)} (best {best})"
    if result.best_ppl is not None:
        return (f"dev         best ppl {result.best_ppl:.2f} (from an earlier session; this one stopped before "
                "its first evaluation)")
    return None


def add_train_command(sub: argparse._SubParsersAction, config_class: type[RunConfig], summary: Callable[[Any], None], *,
                      help: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """Add a task's ``train`` subcommand: the flags of ``config_class``, then :func:`train_command` and
    ``summary(result)`` (printed by the writing rank only, which under torchrun speaks for all).

    Its exit status is 0, or ``128 + N`` when stop signal N interrupted the run (130 for Ctrl-C).
    """
    p = sub.add_parser("train", help=help, formatter_class=RAW, description=wrap(description),
                       epilog=epilog + "\n" + head_options_help(), usage=train_usage(config_class))

    def run(args: argparse.Namespace) -> int:
        result = train_command(args, config_class, args.config_flags)
        if result is None:  # resumed with every budget spent: said so, nothing trained
            return 0
        if result.writer:
            summary(result)
        return 128 + (result.stop_signal or 2) if result.stopped == "interrupted" else 0

    p.set_defaults(func=run, config_flags=add_training_options(p, config_class))
    return p


def refuse_early(args: argparse.Namespace, config_class: type[RunConfig], flags: list[Flag],
                 overrides: dict[str, Any]) -> None:
    """The refusals of a `train` command that need neither torch nor the data, made before either is loaded (they
    take seconds): a run directory with nothing to resume; a new run's values (:meth:`RunConfig.check_values`:
    ranges, choices, fields that go together), a corpus that is neither a known name nor a file or folder; a device
    the machine lacks (:func:`sohsm.train.early.device_refusal`). The loop makes its own checks again, with torch.

    Raises:
        CommandError: one line, the fields named by the flags typed.
    """
    from sohsm.data.corpora import check_corpus_exists
    from sohsm.train.early import check_device, check_resumable, check_run_dir

    try:
        if args.resume:
            device = overrides.get("device") or _saved_device(check_resumable(args.run_dir))
        else:
            check_run_dir(args.run_dir)
            settled_later = ("head.options", "head.update_every")  # read with --head-option, and by the head
            config = config_class.from_overrides({k: v for k, v in overrides.items() if k not in settled_later},
                                                 draft=True)
            corpus = getattr(getattr(config, "data", None), "corpus", None)
            if isinstance(corpus, str):
                check_corpus_exists(corpus)
            device = config.device
        if isinstance(device, str):
            check_device(device)
    except (ValueError, DataError) as error:
        typed = {f.path for f in flags if getattr(args, f.dest, None) not in (None, [])}
        raise CommandError(render_error(error, flags, typed)) from None


def _saved_device(run_dir: Path) -> Any:
    """The ``device`` of the run in ``run_dir`` (its ``config.json``), or ``None`` where it cannot be read (the
    loop then says what is wrong with the file)."""
    from sohsm.train.early import CONFIG_FILE

    try:
        return json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8")).get("device")
    except (OSError, ValueError, AttributeError):
        return None


def train_command(args: argparse.Namespace, config_class: type[RunConfig], flags: list[Flag]):
    """Train a new run of ``config_class``'s task in ``args.run_dir``, or resume it (``--resume``): the one path
    of every task's `train` command.

    A new run needs the flags whose field's metadata says ``required`` (unless ``--config`` sets them, or the
    config's ``defaulted_fields`` lets its default stand).
    Returns the :class:`~sohsm.train.TrainResult`, or ``None`` for a resumed run whose budgets are spent,
    after one line on standard output saying so and which flags ask for more.

    Raises:
        CommandError: one line, its fields named by the flags the user typed.
    """
    overrides = training_overrides(args, flags, config_class)
    options, update_every = requested_head_options(args)
    head = getattr(args, "head", None)
    if not args.resume:
        missing = [f.option for f in flags if f.metadata.get("required") and f.path not in overrides
                   and f.path not in config_class.defaulted_fields]
        if missing:
            raise CommandError(f"a new run needs {' and '.join(missing)} (or --resume to continue a run)")
    refuse_early(args, config_class, flags, overrides)

    from sohsm.train import resume_training, train
    from sohsm.train.rundir import NothingToTrain

    try:
        if args.resume:
            options = {**overrides.pop("head.options", {}), **options}
            if update_every is None:
                update_every = overrides.pop("head.update_every", None)
            head = overrides.pop("head.name", head)
            if head is not None:
                overrides.update(head_overrides(head, options, update_every))
            else:
                overrides.update({"head.options": options} if options else {})
                overrides.update({"head.update_every": update_every} if update_every is not None else {})
            return resume_training(args.run_dir, overrides, progress=not args.quiet)
        name = overrides.pop("head.name", config_class().head.name)
        file_options, file_k = overrides.pop("head.options", {}), overrides.pop("head.update_every", None)
        overrides.update(head_overrides(name, {**file_options, **options}, file_k if update_every is None
                                        else update_every))
        return train(config_class.from_overrides(overrides), args.run_dir, progress=not args.quiet)
    except NothingToTrain as done:
        print(render_error(done, flags, set()))
        return None
    except (ValueError, DataError) as error:
        typed = {f.path for f in flags if getattr(args, f.dest, None) not in (None, [])}
        raise CommandError(render_error(error, flags, typed)) from None
