"""`sohsm lm compare`: train several heads under identical settings and report them side by side."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from sohsm.cli.main import RAW as _RAW, CommandError, wrap as _wrap
from sohsm.cli.train_options import (
    add_training_options,
    head_options_help,
    head_overrides,
    heads_with,
    parse_option_list,
    requested_head_options,
    training_overrides,
)
from sohsm.data.errors import DataError
from sohsm.head_catalogue import head_names, option_names

#: the heads of a comparison when --heads is not given: the reference, the paper's method, the peer a user
#: has one import away (torch's adaptive softmax) and the classic class-based baseline
DEFAULT_HEADS = ("full", "self_organized", "adaptive", "two_level_frequency")

#: the head the others are compared with, seed by seed, when it is among them (else the first head)
DEFAULT_REFERENCE = "adaptive"

_EPILOG = """\
Each head trains in OUT/<head> (a variant in OUT/<head>-<name>) with the same corpus, model, seed, data
order and budget; every `lm train` option but --head, --run-dir and --resume is accepted and applies to
every run (--update-every and --head-option to the heads that take them). Run the same command again to
continue: finished runs are skipped, unfinished ones resumed, missing ones trained. A run directory made
by `sohsm lm train --run-dir OUT/<head>` with the same options counts as that head's run.

writes into OUT: results.md (the table, with this command), figure1.png (the paper's Figure 1 for all
runs), clusters.md (the learned clusters of the self-organized runs), compare.json (the runs, in order).

examples:
  sohsm lm compare --corpus ptb --out runs/ptb-heads --epochs 2
  sohsm lm compare --corpus wikitext-2 --out runs/wt2 --heads full,self_organized \\
      --time-budget 3600 --emb-size 256 --hidden-size 256 \\
      --variant k200:self_organized:update_every=200,gamma=2
  sohsm lm compare --corpus ptb --out runs/ptb-seeds --seeds 1,2,3   # OUT/seed-1, ...; seeds.md
  sohsm lm compare --out runs/ptb-heads --report-only          # rewrite the report from the runs

With --seeds every seed's runs go to OUT/seed-S (each with its own report), and OUT/seeds.md holds each
run's best dev perplexity per seed, the mean, and the difference against --reference seed by seed.
"""


def register_compare(sub: argparse._SubParsersAction) -> None:
    """Add ``lm compare`` to the ``lm`` subcommands."""
    p = sub.add_parser(
        "compare", help="train several heads under identical settings and compare them", formatter_class=_RAW,
        description=_wrap(
            "Train a language model with each of several heads under identical settings, one run directory "
            "per head in OUT, then write a results table, the Figure-1 plot and the learned clusters.",
        ),
        epilog=_EPILOG + "\n" + head_options_help(), usage="%(prog)s --out OUT [--heads H1,H2,...] [OPTION ...]",
    )
    g = p.add_argument_group("comparison")
    g.add_argument("--out", required=True, metavar="OUT", help="folder of the runs and the report")
    g.add_argument("--heads", metavar="H1,H2,...",
                   help=f"heads to train, comma-separated, in table order (default: {', '.join(DEFAULT_HEADS)})")
    g.add_argument("--variant", action="append", default=[], metavar="NAME:HEAD:KEY=VALUE,...",
                   help="one more run of HEAD with these head options, in OUT/HEAD-NAME (repeatable), e.g. "
                   "k20:self_organized:update_every=20; tie_weights=false|true sets the run's weight tying")
    g.add_argument("--seeds", metavar="S1,S2,...",
                   help="train every head once per seed, in OUT/seed-S, and report the means over seeds "
                   "(instead of --seed)")
    g.add_argument("--reference", metavar="RUN",
                   help=f"with --seeds: the run the others are compared with, seed by seed (default: "
                   f"{DEFAULT_REFERENCE} when it is among the heads, else the first)")
    g.add_argument("--report-only", action="store_true",
                   help="train nothing: rewrite the report from the runs in OUT")
    from sohsm.tasks.lm import LMConfig

    p.set_defaults(func=_compare, config_flags=add_training_options(p, LMConfig, compare=True))


# -- the runs -----------------------------------------------------------------------------------
def _head_list(text: str | None) -> list[str]:
    if text is None:
        return list(DEFAULT_HEADS)
    heads = [h.strip() for h in text.split(",") if h.strip()]
    unknown = [h for h in heads if h not in head_names()]
    if unknown:
        raise CommandError(f"--heads: unknown head {unknown[0]!r}; known heads: {', '.join(head_names())}")
    repeated = sorted({h for h in heads if heads.count(h) > 1})
    if repeated:
        raise CommandError(f"--heads names {repeated[0]!r} twice; use --variant for a second run of a head")
    return heads


def _variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """``"k20:self_organized:update_every=20"`` -> ``("self_organized-k20", "self_organized", {...})``."""
    name, head, options = (text.split(":", 2) + ["", ""])[:3]
    if not name or head not in head_names():
        raise CommandError(f"--variant expects NAME:HEAD:KEY=VALUE,... with HEAD one of {', '.join(head_names())}, "
                           f"got {text!r}")
    try:
        return f"{head}-{name}", head, parse_option_list(options)
    except ValueError as error:
        raise CommandError(f"--variant {name}: {error}") from None


def _takes(head: str, option: str) -> bool:
    accepted = option_names(head)
    return accepted is None or option in accepted


def _planned_runs(args: argparse.Namespace) -> list[Any]:
    """One :class:`~sohsm.runs.compare.PlannedRun` per head and variant, as `lm train` would configure it.

    The shared --head-option and --update-every go to the heads that take them; a
    variant's own options go to its head and win over the shared ones.
    """
    from sohsm.runs.compare import PlannedRun
    from sohsm.tasks.lm import LMConfig

    base = training_overrides(args, args.config_flags, LMConfig)
    for key in ("head.name", "head.options", "head.update_every"):  # a config file's head: each run has its own
        base.pop(key, None)
    if "data.corpus" not in base:
        raise CommandError("a comparison needs --corpus (the same for every head)")
    shared, update_every = requested_head_options(args)
    specs: list[tuple[str, str, dict[str, Any]]] = [(head, head, {}) for head in _head_list(args.heads)]
    specs += [_variant(text) for text in args.variant]
    runs = []
    for name, head, own in specs:
        options = {k: v for k, v in shared.items() if _takes(head, k)}
        k = update_every if _takes(head, "update_every") else None
        own = dict(own)
        if "update_every" in own:
            k = own.pop("update_every")
        tie = {"model.tie_weights": own.pop("tie_weights")} if "tie_weights" in own else {}
        options.update(own)
        where = f"--variant {name.removeprefix(head + '-')}: " if name != head else ""
        try:
            overrides = {**base, **head_overrides(head, options, k), **tie}
            runs.append(PlannedRun(name, LMConfig.from_overrides(overrides)))
        except (CommandError, ValueError) as error:
            raise CommandError(f"{where}{error}") from None
    _refuse_unused(shared, update_every, [head for _, head, _ in specs])
    return runs


def _refuse_unused(shared: dict[str, Any], update_every: int | None, heads: list[str]) -> None:
    """A shared head option that no head of the comparison takes is a mistake: say so."""
    listed = ", ".join(dict.fromkeys(heads))
    if update_every is not None and not any(_takes(h, "update_every") for h in heads):
        raise CommandError(f"--update-every ({update_every}) means nothing for the heads {listed}: none re-clusters "
                           f"(heads that do: {', '.join(heads_with('update_every'))})")
    for key in shared:
        if not any(_takes(h, key) for h in heads):
            takers = heads_with(key)
            raise CommandError(f"--head-option {key} means nothing for the heads {listed}; heads that take it: "
                               f"{', '.join(takers) or 'none'}")


# -- the command --------------------------------------------------------------------------------
def _compare(args: argparse.Namespace) -> int:
    from sohsm.runs.compare import plan_comparison, run_comparison, save_comparison

    seeds = _seed_list(args)
    if args.report_only:
        return _report_only(args) if not seeds else _seed_report(args, seeds)
    command = "sohsm " + shlex.join(args.argv)
    for seed in seeds if seeds else [None]:
        out = args.out if seed is None else str(Path(args.out) / f"seed-{seed}")
        if seed is not None:
            args.seed = seed
            print(f"seed {seed}: {out}", flush=True)
        runs = _planned_runs(args)
        try:
            plans = plan_comparison(out, runs)
            _print_plan(out, plans)
            save_comparison(out, plans, command)
            outcome = run_comparison(plans, progress=not args.quiet, announce=_announce(len(plans)))
        except (ValueError, DataError) as error:
            raise CommandError(str(error)) from None
        if outcome.interrupted:
            print(f"interrupted: run the same command again to continue ({args.out})")
            return 130
        code = _write_report(out, [p.path for p in plans], command)
        if code:
            return code
    return _seed_report(args, seeds) if seeds else 0


def _seed_list(args: argparse.Namespace) -> list[int] | None:
    """The seeds of ``--seeds`` (``None`` without it); refuses it beside ``--seed`` and a repeated seed."""
    if args.seeds is None:
        if args.reference is not None:
            raise CommandError("--reference compares runs over several seeds: give --seeds too")
        return None
    if args.seed is not None:
        raise CommandError("give either --seed or --seeds, not both")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise CommandError(f"--seeds expects integers separated by commas, e.g. 1,2,3; got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise CommandError(f"--seeds expects distinct integers separated by commas, e.g. 1,2,3; got {args.seeds!r}")
    return seeds


def _seed_report(args: argparse.Namespace, seeds: list[int]) -> int:
    """Write OUT/seeds.md (each run's best dev ppl per seed, the mean, the difference against the reference)."""
    from sohsm.runs.compare import load_comparison
    from sohsm.runs.report import seed_table
    from sohsm.train.checkpoint import write_atomic

    folders = [Path(args.out) / f"seed-{s}" for s in seeds]
    present = [f for f in folders if (f / "compare.json").is_file()]
    if not present:
        raise CommandError(f"{args.out} holds no seed-S comparison of --seeds {args.seeds}: nothing to report")
    command, dirs = load_comparison(present[0])
    runs = [d.name for d in dirs]
    reference = args.reference or (DEFAULT_REFERENCE if DEFAULT_REFERENCE in runs else runs[0])
    if reference not in runs:
        raise CommandError(f"--reference {reference} is not one of the runs ({', '.join(runs)})")
    lines = seed_table(folders, runs, reference, labels=[f"seed {s}" for s in seeds])
    text = (f"# Best dev perplexity over seeds {args.seeds}\n\nProduced by `{command}`; "
            "a run that has not trained as many epochs as the others shows as \u2013 and is left out of its mean.\n\n"
            + "\n".join(lines) + "\n")
    path = Path(args.out) / "seeds.md"
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))
    print("\n".join(lines))
    print(f"{'seeds':<11} {path}")
    return 0


def _report_only(args: argparse.Namespace) -> int:
    from sohsm.runs.compare import load_comparison

    command, dirs = load_comparison(args.out)
    if args.heads is not None or args.variant:
        dirs = [Path(args.out) / h for h in _head_list(args.heads)] + [Path(args.out) / _variant(v)[0]
                                                                       for v in args.variant]
    return _write_report(args.out, dirs, command, rewritten_by="sohsm " + shlex.join(args.argv))


def _write_report(out: str, dirs: list[Path], command: str | None, rewritten_by: str | None = None) -> int:
    from sohsm.runs.report import results_table, summarise_run
    from sohsm.runs.results import write_comparison_report

    try:
        paths = write_comparison_report(out, dirs, command, rewritten_by=rewritten_by)
        table = results_table([summarise_run(d) for d in dirs if (d / "metrics.jsonl").is_file()])
    except ValueError as error:
        raise CommandError(str(error)) from None
    print("\n".join(table))
    for key, path in paths.items():
        print(f"{key:<11} {path}")
    return 0


def _print_plan(out: str, plans: list) -> None:
    print(f"comparison  {out}: {len(plans)} runs with the same corpus, model, seed and budget")
    width = max(len(p.run.name) for p in plans)
    for p in plans:
        what = {"new": "new run", "partial": f"resume at {p.tokens:,} tokens",
                "done": f"done ({p.tokens:,} tokens), skipped"}[p.status]
        head = p.run.config.head
        options = dict(head.options, **({"update_every": head.update_every} if head.update_every is not None else {}))
        extra = "  " + ", ".join(f"{k}={v}" for k, v in options.items()) if options else ""
        print(f"  {p.run.name:<{width}}  {what}{extra}")
    sys.stdout.flush()


def _announce(total: int):
    def announce(index: int, plan) -> None:
        verb = "training" if plan.status == "new" else "resuming"
        print(f"[{index + 1}/{total}] {plan.run.name}: {verb} in {plan.path}", flush=True)

    return announce
