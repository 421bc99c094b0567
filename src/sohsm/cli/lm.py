"""`sohsm lm`: train, evaluate and sample from language models (LSTM or transformer) with any head."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from sohsm.cli.lm_compare import register_compare
from sohsm.cli.main import RAW as _RAW, CommandError, add_command_group, wrap as _wrap
from sohsm.cli.train_options import add_train_command, dev_line, stop_reason, training_time
from sohsm.data.errors import DataError

_TRAIN_EPILOG = """\
defaults: the paper's text8 setting (LSTM 512/512, Adagrad lr 0.1, clip 0.25, BPTT 20, batch 128, weight
decay 1e-6, 5 epochs) but a 30-step warm-up, dropout 0.2 and tied weights, which measured better
(the paper's: --warmup 0 --dropout 0 --no-tie-weights); the self-organized head re-clusters ~8 times an epoch.

examples:
  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb-sohsm --epochs 1
  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb-g2 \\
      --head-option gamma=2 --head-option init=frequency --update-every 200
  sohsm lm train --corpus ptb --head full --run-dir runs/ptb-full --time-budget 600
  sohsm lm train --corpus my_text.txt --head two_level_frequency --run-dir runs/mine \\
      --emb-size 64 --hidden-size 64 --batch-size 32 --max-tokens 200000
  sohsm lm train --run-dir runs/ptb-sohsm --resume --epochs 2      # continue, with a larger budget
  sohsm lm train --corpus wikitext-2 --tokenizer bpe:8000 --head self_organized \\
      --run-dir runs/wt2-bpe    # a byte-level BPE of 8,000 subwords trained on the training split
  torchrun --nproc-per-node 2 -m sohsm lm train --corpus ptb --head self_organized \\
      --run-dir runs/ptb-ddp --batch-size 128    # 2 processes, 64 columns each; rank 0 writes
  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb-bf16 --amp bf16 --compile
  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb-tf --model transformer \\
      --hidden-size 256 --attention-heads 4    # 4 blocks, context 128, AdamW, 100 warm-up steps, cosine
  sohsm lm train --corpus ptb --head pmi --run-dir runs/ptb-pmi --layers 2 --emb-size 300 \\
      --hidden-size 300 --dropout 0.5 --batch-size 20 --optimizer sgd --lr 20 --clip 0.25 \\
      --lr-decay 1.2 --lr-decay-after 6 --epochs 39    # the PMI-LM paper's PTB recipe
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lm`` command and its ``train``, ``compare``, ``eval`` and ``generate`` subcommands."""
    sub = add_command_group(
        subparsers, "lm",
        description="Train a language model (the paper's LSTM, or a transformer) with any output head, evaluate "
        "it, continue a text with it.",
        epilog="examples:\n  sohsm lm train --corpus ptb --head self_organized --run-dir runs/ptb\n"
        "  sohsm lm compare --corpus ptb --out runs/ptb-heads --epochs 2\n"
        "  sohsm lm eval runs/ptb --split test\n  sohsm lm generate runs/ptb --prompt \"the company said\"",
    )
    _register_train(sub)
    register_compare(sub)
    _register_eval(sub)
    _register_generate(sub)


def _register_train(sub: argparse._SubParsersAction) -> None:
    from sohsm.tasks.lm import LMConfig

    add_train_command(
        sub, LMConfig, _print_summary, help="train a language model (or resume a run)",
        description="Train a language model (the paper's LSTM, or a transformer: --model transformer) with the "
        "chosen head in RUN_DIR: config.json, vocab.json (tokenizer.json too with --tokenizer: subwords), "
        "metrics.jsonl, last.pt and best.pt (best dev perplexity). Stops when the epochs, --max-tokens or "
        "--time-budget run out, or on Ctrl-C, kill (SIGTERM) or a closed terminal (SIGHUP), after saving a "
        "checkpoint; a run whose loss or gradient becomes NaN or infinite stops and keeps its last good one.",
        epilog=_TRAIN_EPILOG,
    )


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _dev_scores(e) -> str:
    """``ppl 91.20, cluster ppl 12.10, in-cluster ppl 7.54``; a head without clusters has no parts to give."""
    if e.ppl_cluster is None:
        return f"ppl {e.ppl:.2f}"
    return f"ppl {e.ppl:.2f}, cluster ppl {e.ppl_cluster:.2f}, in-cluster ppl {_fmt(e.ppl_in_cluster)}"


def _print_summary(result) -> None:
    from sohsm.train import format_signature

    run = shlex.quote(str(result.run_dir))
    print(f"stopped     {stop_reason(result)}: step {result.step:,}, {result.tokens:,} tokens, epoch "
          f"{result.epoch:.2f}, {training_time(result)}")
    dev = dev_line(result, _dev_scores)
    if dev is not None:
        print(dev)
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
            "in-cluster perplexity (paper Eq. 5-6), bits per byte of text, and tokens/s. A subword run "
            "(--tokenizer) reports perplexity per token and per word; both that and bits per byte compare "
            "across vocabularies: they take the split's whole loss over its words (whitespace-separated, an "
            "<eos> per line included, as a word vocabulary counts them) or over the UTF-8 bytes of its text "
            "(words joined by single spaces, a newline ending each line). Writes nothing.",
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
    from sohsm.tasks.lm import evaluate_run
    from sohsm.train import format_signature

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
    if result.subwords:
        print(f"split           {args.split} ({result.split_tokens:,} subword tokens, {_count(result.words)} words, "
              f"{_count(result.text_bytes)} bytes)")
        print(f"ppl per token   {result.ppl:.2f}")
        print(f"ppl per word    {_fmt(result.ppl_word)}")
    else:
        print(f"split           {args.split} ({result.tokens:,} tokens)")
        print(f"ppl             {result.ppl:.2f}")
    print(f"bits per byte   {_fmt(result.bits_per_byte, '.4f')}")
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
            "Continue a prompt word by word (a subword run: token by token, written as text by its "
            "tokenizer): sampling from the head's distribution (default), or greedily taking the most "
            "probable word.",
        ),
        epilog="examples:\n  sohsm lm generate runs/ptb-sohsm --prompt \"the company said\" --length 20 --seed 1\n"
        "  sohsm lm generate runs/ptb-sohsm --prompt \"in new york\" --greedy",
    )
    _add_run_options(p)
    p.add_argument("--prompt", required=True, help="the words to continue (empty: start a new line)")
    p.add_argument("--length", type=int, default=30, metavar="N", help="words (subword run: tokens) to add (default "
                                                                       "30, at most 100000; a bar on stderr past 1000, "
                                                                       "or after 2 s)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="always take the most probable word")
    how.add_argument("--temperature", type=float, default=1.0, metavar="T",
                     help="sampling temperature (default 1.0; < 1 is more conservative)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: random)")
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from sohsm.tasks.lm import generate_text

    try:
        out = generate_text(args.run, args.prompt, args.length, greedy=args.greedy, temperature=args.temperature,
                            seed=args.seed, checkpoint=args.checkpoint, device=args.device, progress=True)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    if out.unknown:
        hint = "" if out.lower_case is None else \
            f"; the vocabulary has them in lower case: --prompt {shlex.quote(out.lower_case)}"
        print(f"note: not in the vocabulary (read as the unknown-word token): {' '.join(out.unknown)}{hint}",
              file=sys.stderr)
    print(out.text(include_prompt=True))
    return 0
