"""`sohsm lm`: train, evaluate and sample from LSTM language models with any head."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from sohsm.cli.flags import name_flags
from sohsm.cli.main import RAW as _RAW, CommandError, wrap as _wrap
from sohsm.data.errors import DataError
from sohsm.heads import head_names
from sohsm.train.config import DEFAULT_LR, OPTIMIZERS




#: option dest -> config field it sets (options left out keep the config default, or the run's on --resume)
_TRAIN_FIELDS = {
    "corpus": "data.corpus", "data_dir": "data.data_dir", "cache_dir": "data.cache_dir",
    "min_count": "data.min_count", "max_size": "data.max_size", "text_mode": "data.text_mode",
    "emb_size": "model.emb_size", "hidden_size": "model.hidden_size", "layers": "model.layers",
    "dropout": "model.dropout", "tie_weights": "model.tie_weights",
    "head": "head.name", "update_every": "head.update_every",
    "optimizer": "optim.optimizer", "lr": "optim.lr", "clip": "optim.clip", "weight_decay": "optim.weight_decay",
    "bptt": "bptt", "batch_size": "batch_size", "eval_batch_size": "eval_batch_size", "epochs": "epochs",
    "max_tokens": "max_tokens", "time_budget": "time_budget", "eval_every": "eval_every",
    "checkpoint_every": "checkpoint_every", "log_every": "log_every", "seed": "seed", "device": "device",
}

_TRAIN_EPILOG = """\
defaults are the paper's text8 setting: 1-layer LSTM 512/512, Adagrad lr 0.1, clip 0.25, BPTT 20,
batch 128, weight decay 1e-6 on the LSTM, 5 epochs, K = 1000.

examples:
  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb-sohsm --epochs 1
  sohsm lm train --corpus ptb --head full --run-dir runs/ptb-full --time-budget 600
  sohsm lm train --corpus my_text.txt --head two_level_frequency --run-dir runs/mine \\
      --emb-size 64 --hidden-size 64 --batch-size 32 --max-tokens 200000
  sohsm lm train --run-dir runs/ptb-sohsm --resume --epochs 2      # continue, with a larger budget
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lm`` command and its ``train``, ``eval`` and ``generate`` subcommands."""
    parser = subparsers.add_parser(
        "lm", help="train, evaluate and sample from language models", formatter_class=_RAW,
        description=_wrap(
            "Train an LSTM language model with any output head, evaluate it, continue a text with it.",
        ),
        epilog="examples:\n  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb\n"
        "  sohsm lm eval runs/ptb --split test\n  sohsm lm generate runs/ptb --prompt \"the company said\"",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="lm_command", metavar="SUBCOMMAND")
    _register_train(sub)
    _register_eval(sub)
    _register_generate(sub)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _register_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a language model (or resume a run)", formatter_class=_RAW,
        description=_wrap(
            "Train an LSTM language model with the chosen head in RUN_DIR: config.json, vocab.json, "
            "metrics.jsonl, last.pt and best.pt (best dev perplexity). Stops when the epochs, --max-tokens or "
            "--time-budget run out, or on Ctrl-C, kill (SIGTERM) or a closed terminal (SIGHUP), after saving a "
            "checkpoint; a run whose loss or gradient becomes NaN or infinite stops and keeps its last good one.",
        ),
        epilog=_TRAIN_EPILOG,
    )
    g = p.add_argument_group("data")
    g.add_argument("--corpus", metavar="NAME_OR_PATH", help="a known corpus (ptb, wikitext-2, text8, ...) "
                   "or your own text file or folder (required for a new run)")
    g.add_argument("--data-dir", metavar="DIR", help="data directory (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    g.add_argument("--cache-dir", metavar="DIR",
                   help="cache of tokenised corpora (default: $SOHSM_CACHE, else ~/.cache/sohsm/cache)")
    g.add_argument("--min-count", type=int, metavar="N", help="words seen fewer times become <unk>")
    g.add_argument("--max-size", type=int, metavar="N", help="at most N vocabulary entries")
    g.add_argument("--text-mode", choices=("lines", "running"),
                   help="your own text: 'lines' (an end-of-line token after each line, default) or 'running'")

    g = p.add_argument_group("model and head")
    g.add_argument("--head", choices=head_names(), help="output layer (required for a new run)")
    g.add_argument("--update-every", type=int, metavar="K",
                   help="self-organized head: re-cluster every K optimizer steps (default 1000, 0 = never)")
    g.add_argument("--emb-size", type=int, metavar="N", help="embedding size (default 512)")
    g.add_argument("--hidden-size", type=int, metavar="N", help="LSTM hidden size = head input size (default 512)")
    g.add_argument("--layers", type=int, metavar="N", help="LSTM layers (default 1)")
    g.add_argument("--dropout", type=float, metavar="P", help="dropout (default 0)")
    g.add_argument("--tie-weights", action="store_true", default=None,
                   help="share the embedding with the output word vectors (full head only, emb = hidden size)")

    g = p.add_argument_group("optimization")
    g.add_argument("--optimizer", choices=OPTIMIZERS,
                   help="default adagrad; default rates: " + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items()))
    g.add_argument("--lr", type=float, metavar="LR", help="learning rate (default: the optimizer's, see above)")
    g.add_argument("--clip", type=float, metavar="NORM", help="clip the gradient norm (default 0.25; 0 = no clipping)")
    g.add_argument("--weight-decay", type=float, metavar="W", help="weight decay on the LSTM parameters (default 1e-6)")
    g.add_argument("--bptt", type=int, metavar="T", help="truncated back-propagation length (default 20)")
    g.add_argument("--batch-size", type=int, metavar="B", help="columns per batch (default 128)")
    g.add_argument("--seed", type=int, help="seed of initialisation, dropout and random clusters (default 1)")

    g = p.add_argument_group("budgets, evaluation and files")
    g.add_argument("--run-dir", required=True, metavar="DIR", help="where the run's files go")
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from last.pt (budgets and logging may change; "
                   "other options must match the run)")
    g.add_argument("--epochs", type=int, metavar="N", help="passes over the training data (default 5)")
    g.add_argument("--max-tokens", type=int, metavar="N", help="stop after N training tokens (all sessions)")
    g.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop after this much training time (all sessions, evaluation excluded)")
    g.add_argument("--eval-every", type=int, metavar="STEPS",
                   help="dev evaluation every STEPS steps, and at each epoch's end (default 1000; 0 = epochs only)")
    g.add_argument("--eval-batch-size", type=int, metavar="B", help="columns of the dev evaluation (default 32)")
    g.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                   help="save last.pt every STEPS steps, and at the end (default 1000; 0 = end only)")
    g.add_argument("--log-every", type=int, metavar="STEPS", help="a train record every STEPS steps (default 100)")
    g.add_argument("--device", metavar="DEVICE", help="cpu (default), cuda, cuda:1, ...")
    g.add_argument("--quiet", action="store_true", help="no progress bar or evaluation lines")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from sohsm.train import TrainConfig, apply_overrides, resume_training, train

    overrides = {field: getattr(args, dest) for dest, field in _TRAIN_FIELDS.items() if getattr(args, dest) is not None}
    if overrides.get("optim.clip") == 0:
        overrides["optim.clip"] = None
    try:
        if args.resume:
            result = resume_training(args.run_dir, overrides, progress=not args.quiet)
        else:
            missing = [flag for flag, field in (("--corpus", "data.corpus"), ("--head", "head.name"))
                       if field not in overrides]
            if missing:
                raise CommandError(f"a new run needs {' and '.join(missing)} (or --resume to continue a run)")
            result = train(apply_overrides(TrainConfig(), overrides), args.run_dir, progress=not args.quiet)
    except (ValueError, DataError) as error:
        typed = [dest for dest in _TRAIN_FIELDS if getattr(args, dest) is not None]
        raise CommandError(name_flags(str(error), _TRAIN_FIELDS, typed)) from None
    _print_summary(result)
    return 128 + (result.stop_signal or 2) if result.stopped == "interrupted" else 0  # 130 for Ctrl-C


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _print_summary(result) -> None:
    from sohsm.train import format_signature
    from sohsm.train.guard import signal_name

    run = shlex.quote(str(result.run_dir))
    interrupted = f"interrupted ({signal_name(result.stop_signal)})" if result.stop_signal else "interrupted"
    why = {"done": "all epochs done", "max_tokens": "token budget spent", "time_budget": "time budget spent",
           "interrupted": interrupted}[result.stopped]
    speed = result.tokens / result.elapsed_s if result.elapsed_s > 0 else 0.0
    print(f"stopped     {why}: step {result.step:,}, {result.tokens:,} tokens, epoch {result.epoch:.2f}, "
          f"{result.elapsed_s:.1f} s of training ({speed:,.0f} tokens/s)")
    if result.last_eval is not None:
        e = result.last_eval
        print(f"dev         ppl {e.ppl:.2f}, cluster ppl {_fmt(e.ppl_cluster)}, in-cluster ppl "
              f"{_fmt(e.ppl_in_cluster)} (best ppl {_fmt(result.best_ppl)})")
    print(f"signature   {format_signature(result.signature)}")
    print(f"metrics     {result.paths['metrics']}")
    saved = [str(result.paths[k]) for k in ("last", "best") if result.paths[k].is_file()]
    print(f"checkpoints {', '.join(saved) or 'none yet'}")
    print(f"evaluate    sohsm lm eval {run} --split valid")
    print(f"plot        sohsm plot {run}            # writes {result.run_dir / 'figure1.png'}")
    if result.signature.get("clusters") is not None:
        print(f"clusters    sohsm clusters show {run}")
    print(f"generate    sohsm lm generate {run} --prompt \"the\"")
    if result.stopped != "done":
        print(f"resume      sohsm lm train --run-dir {run} --resume   # add a larger budget if one was spent")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory (from `sohsm lm train`)")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="best.pt (best dev perplexity, the default) or last.pt")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def _register_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="perplexity, cluster and in-cluster perplexity of a run", formatter_class=_RAW,
        description=_wrap(
            "Evaluate a run's checkpoint on a split of its corpus: perplexity, cluster perplexity and "
            "in-cluster perplexity (paper Eq. 5-6), and tokens/s. Writes nothing.",
        ),
        epilog="examples:\n  sohsm lm eval runs/ptb-sohsm\n"
        "  sohsm lm eval runs/ptb-sohsm --split test --checkpoint last",
    )
    _add_run_options(p)
    p.add_argument("--split", choices=("valid", "test"), default="valid", help="which split (default valid)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory, if not where the run found its corpus")
    p.add_argument("--cache-dir", metavar="DIR", help="cache of tokenised corpora")
    p.add_argument("--batch-size", type=int, metavar="B", help="evaluation columns (default: the run's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from sohsm.train import evaluate_run, format_signature

    if args.batch_size is not None and args.batch_size < 1:
        raise CommandError(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        result, run = evaluate_run(args.run, args.split, args.checkpoint, data_dir=args.data_dir,
                                   cache_dir=args.cache_dir, device=args.device, batch_size=args.batch_size)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(json.dumps({"split": args.split, "checkpoint": str(run.path), "step": run.step, **result.to_dict(),
                          "signature": run.signature}))
        return 0
    print(f"split           {args.split} ({result.tokens:,} tokens)")
    print(f"ppl             {result.ppl:.2f}")
    no_clusters = " (the head has no clusters)" if result.ppl_cluster is None else ""
    print(f"cluster ppl     {_fmt(result.ppl_cluster)}{no_clusters}")
    print(f"in-cluster ppl  {_fmt(result.ppl_in_cluster)}{no_clusters}")
    print(f"tokens/s        {result.tokens_per_s:,.0f}")
    print(f"checkpoint      {run.path} (step {run.step:,}, {run.tokens:,} training tokens)")
    print(f"signature       {format_signature(run.signature)}")
    return 0


def _register_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="continue a prompt with a run's model", formatter_class=_RAW,
        description=_wrap(
            "Continue a prompt word by word: sampling from the head's distribution (default), "
            "or greedily taking the most probable word.",
        ),
        epilog="examples:\n  sohsm lm generate runs/ptb-sohsm --prompt \"the company said\" --length 20 --seed 1\n"
        "  sohsm lm generate runs/ptb-sohsm --prompt \"in new york\" --greedy",
    )
    _add_run_options(p)
    p.add_argument("--prompt", required=True, help="the words to continue (empty: start a new line)")
    p.add_argument("--length", type=int, default=30, metavar="N", help="words to add (default 30)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="always take the most probable word")
    how.add_argument("--temperature", type=float, default=1.0, metavar="T",
                     help="sampling temperature (default 1.0; < 1 is more conservative)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: random)")
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from sohsm.train import generate_text

    try:
        out = generate_text(args.run, args.prompt, args.length, greedy=args.greedy, temperature=args.temperature,
                            seed=args.seed, checkpoint=args.checkpoint, device=args.device)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    if out.unknown:
        print(f"note: not in the vocabulary (read as the unknown-word token): {' '.join(out.unknown)}",
              file=sys.stderr)
    print(out.text(include_prompt=True))
    return 0
