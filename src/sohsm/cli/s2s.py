"""`sohsm s2s`: train a headline generator with any head, write headlines, score them with ROUGE."""
from __future__ import annotations

import argparse
import shlex
import sys

from sohsm.cli.flags import name_flags
from sohsm.cli.main import RAW as _RAW, CommandError, wrap as _wrap
from sohsm.cli.train_options import add_clusters_options, head_overrides, requested_head_options
from sohsm.data.errors import DataError
from sohsm.heads import head_names

#: option dest -> config field of `s2s train` (left out: the config default, or the run's on --resume)
S2S_FIELDS = {
    "data_dir": "data.data_dir", "extra": "data.extra", "min_count": "data.min_count", "max_size": "data.max_size",
    "clusters_from": "data.clusters_from", "clusters_format": "data.clusters_format",
    "clusters_cut": "data.clusters_cut", "dataset": "data.dataset", "symbols": "data.symbols",
    "train_pairs": "data.train_pairs", "valid_pairs": "data.valid_pairs", "pairs_seed": "data.pairs_seed", "emb_size": "model.emb_size", "hidden_size": "model.hidden_size",
    "lr": "optim.lr", "weight_decay": "optim.weight_decay", "clip": "optim.clip", "batch_size": "batch_size",
    "eval_batch_size": "eval_batch_size", "epochs": "epochs", "max_tokens": "max_tokens",
    "time_budget": "time_budget", "eval_every": "eval_every", "checkpoint_every": "checkpoint_every",
    "log_every": "log_every", "seed": "seed", "device": "device",
}

_EPILOG = """\
defaults are the paper's Gigaword setting: embedding and LSTMs 512, attention, Adam lr 1e-3, weight
decay 1e-6, no clipping, batch 128; training pairs: Gigaword's 10k plus the extra validation subsets
(less pairs whose article is in the test or dev set), about 35k.

examples:
  sohsm s2s titles --out runs/titles                    # the training titles, for a language model
  sohsm lm train --corpus runs/titles --head self_organized --run-dir runs/titles-lm --epochs 5
  sohsm s2s train --head self_organized --clusters-from runs/titles-lm --run-dir runs/s2s-sohsm
  sohsm s2s train --head full --run-dir runs/s2s-full --time-budget 1800
  sohsm s2s decode runs/s2s-sohsm --input gigaword --out runs/s2s-sohsm/giga.txt
  sohsm s2s decode runs/s2s-sohsm --input duc2004 --duc --out runs/s2s-sohsm/duc2004.txt
  sohsm s2s score runs/s2s-sohsm/duc2004.txt --references duc2004 --duc
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``s2s`` command and its ``titles``, ``train``, ``decode`` and ``score`` subcommands."""
    parser = subparsers.add_parser(
        "s2s", help="headline generation: train, decode, score", formatter_class=_RAW,
        description=_wrap("Train an attention encoder-decoder that writes a headline for a news sentence, with "
                          "any head as its output layer (the paper's second experiment); decode with beam search; "
                          "score with ROUGE."),
        epilog=_EPILOG,
    )
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), 2)[1])
    sub = parser.add_subparsers(dest="s2s_command", metavar="SUBCOMMAND")
    _register_titles(sub)
    _register_train(sub)
    _register_decode(sub)
    _register_score(sub)


def _data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", metavar="DIR", help="data directory (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    p.add_argument("--extra", action=argparse.BooleanOptionalAction, default=None,
                   help="add the extra validation subsets to the training pairs (default: yes)")


# -- titles -----------------------------------------------------------------------------------------
def _register_titles(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("titles", help="write the training titles as a corpus for `sohsm lm train`",
                       formatter_class=_RAW,
                       description=_wrap("Write OUT/train.txt (the summariser's training titles) and OUT/valid.txt "
                                         "(its dev titles): `sohsm lm train --corpus OUT` then builds the "
                                         "summariser's vocabulary, so its clusters fit `s2s train --clusters-from`."),
                       epilog="example:\n  sohsm s2s titles --out runs/titles")
    _data_options(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write train.txt and valid.txt into")
    p.set_defaults(func=_titles)


def _titles(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sohsm.data.headlines import load_training_pairs
    from sohsm.data.pairs import write_lines

    try:
        pairs = load_training_pairs(args.data_dir, True if args.extra is None else args.extra)
    except DataError as error:
        raise CommandError(str(error)) from None
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_lines(out / "train.txt", pairs.train.targets)
        write_lines(out / "valid.txt", pairs.valid.targets)
    except OSError as error:
        raise CommandError(f"cannot write to {out}: {error.strerror or error}") from None
    print(f"wrote {out / 'train.txt'} ({len(pairs.train):,} titles) and {out / 'valid.txt'} ({len(pairs.valid):,})")
    return 0


# -- train --------------------------------------------------------------------------------------------
def _register_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a summariser (or resume a run)", formatter_class=_RAW,
                       description=_wrap("Train the attention encoder-decoder with the chosen head in RUN_DIR "
                                         "(config.json, vocab.json, metrics.jsonl, last.pt, best.pt by dev "
                                         "perplexity). Budgets, resume and stop signals work as in `sohsm lm train`."),
                       epilog=_EPILOG)
    g = p.add_argument_group("data")
    _data_options(g)
    g.add_argument("--dataset", choices=("gigaword", "reverse"),
                   help="gigaword headlines (default) or the synthetic reverse task (target = source reversed)")
    g.add_argument("--symbols", type=int, metavar="V", help="reverse task: alphabet size (default 1000)")
    g.add_argument("--train-pairs", type=int, metavar="N", help="reverse task: training pairs (default 3000)")
    g.add_argument("--valid-pairs", type=int, metavar="N", help="reverse task: held-out pairs (default 200)")
    g.add_argument("--pairs-seed", type=int, metavar="S", help="reverse task: seed of the pairs (default 0)")
    g.add_argument("--min-count", type=int, metavar="N", help="title words seen fewer times become <unk> (default 1)")
    g.add_argument("--max-size", type=int, metavar="N", help="at most N output words (default 69000, the paper's)")
    g = p.add_argument_group("model and head")
    g.add_argument("--head", choices=head_names(), help="the decoder's output layer (required for a new run)")
    g.add_argument("--head-option", action="append", default=[], metavar="KEY=VALUE", help="an option of the head")
    g.add_argument("--update-every", type=int, metavar="K", help="self-organized head: re-cluster every K steps")
    add_clusters_options(g)
    g.add_argument("--emb-size", type=int, metavar="N", help="embedding size (default 512)")
    g.add_argument("--hidden-size", type=int, metavar="N", help="LSTM size = head input size (default 512)")
    g = p.add_argument_group("optimization, budgets and files")
    g.add_argument("--lr", type=float, metavar="LR", help="Adam's learning rate (default 1e-3)")
    g.add_argument("--weight-decay", type=float, metavar="W", help="on the LSTMs (default 1e-6)")
    g.add_argument("--clip", type=float, metavar="NORM", help="clip the gradient norm (default: none)")
    g.add_argument("--batch-size", type=int, metavar="B", help="pairs per batch (default 128)")
    g.add_argument("--eval-batch-size", type=int, metavar="B", help="pairs per dev batch (default 128)")
    g.add_argument("--seed", type=int, help="seed of initialisation, batch order and random clusters (default 1)")
    g.add_argument("--run-dir", required=True, metavar="DIR", help="where the run's files go")
    g.add_argument("--resume", action="store_true", help="continue the run in --run-dir from last.pt")
    g.add_argument("--epochs", type=int, metavar="N", help="passes over the training pairs (default 10)")
    g.add_argument("--max-tokens", type=int, metavar="N", help="stop after N target tokens (all sessions)")
    g.add_argument("--time-budget", type=float, metavar="SECONDS", help="stop after this much training time")
    g.add_argument("--eval-every", type=int, metavar="STEPS", help="dev evaluation every STEPS steps (default 500)")
    g.add_argument("--checkpoint-every", type=int, metavar="STEPS", help="save last.pt every STEPS steps (default 500)")
    g.add_argument("--log-every", type=int, metavar="STEPS", help="a train record every STEPS steps (default 50)")
    g.add_argument("--device", metavar="DEVICE", help="cpu (default), cuda, ...")
    g.add_argument("--quiet", action="store_true", help="no start-up lines, progress bar or evaluation lines")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from sohsm.train import apply_overrides, resume_training, train
    from sohsm.train.s2s_config import S2SConfig

    overrides = {field: getattr(args, dest) for dest, field in S2S_FIELDS.items() if getattr(args, dest) is not None}
    if overrides.get("optim.clip") == 0:
        overrides["optim.clip"] = None
    options, update_every = requested_head_options(args)
    try:
        if args.head is not None:
            overrides.update(head_overrides(args.head, options, update_every))
        if args.resume:
            result = resume_training(args.run_dir, overrides, progress=not args.quiet)
        else:
            if args.head is None:
                raise CommandError("a new run needs --head (or --resume to continue a run)")
            result = train(apply_overrides(S2SConfig(), overrides), args.run_dir, progress=not args.quiet)
    except (ValueError, DataError) as error:
        fields = {**S2S_FIELDS, "head": "head.name", "update_every": "head.update_every"}
        typed = [dest for dest in fields if getattr(args, dest, None) is not None]
        raise CommandError(name_flags(str(error), fields, typed)) from None
    from sohsm.train import format_signature

    run = shlex.quote(str(result.run_dir))
    print(f"stopped     {result.stopped}: step {result.step:,}, {result.tokens:,} target tokens, epoch "
          f"{result.epoch:.2f}, {result.elapsed_s:.1f} s of training "
          f"({result.tokens / max(result.elapsed_s, 1e-9):,.0f} tokens/s)")
    if result.last_eval is not None:
        print(f"dev         ppl {result.last_eval.ppl:.2f} (best {result.best_ppl:.2f})")
    reverse = _print_reverse_accuracy(result.run_dir)
    print(f"signature   {format_signature(result.signature)}")
    if not reverse:
        print(f"decode      sohsm s2s decode {run} --input gigaword --out {shlex.quote(str(result.run_dir / 'giga.txt'))}")
    if result.stopped != "done":
        print(f"resume      sohsm s2s train --run-dir {run} --resume")
    return 128 + (result.stop_signal or 2) if result.stopped == "interrupted" else 0


def _print_reverse_accuracy(run_dir) -> bool:
    """For a reverse-task run, print the share of held-out strings that greedy decoding reverses exactly;
    whether the run is one."""
    import json

    from sohsm.train.s2s_run import held_out_pairs, load_summariser, sequence_accuracy

    if json.loads((run_dir / "config.json").read_text())["data"].get("dataset") != "reverse":
        return False
    run = load_summariser(run_dir, "last")
    held_out = held_out_pairs(run.config)
    print(f"accuracy    {100 * sequence_accuracy(run, held_out):.1f}% of {len(held_out):,} held-out strings "
          "reversed exactly (greedy decoding, last.pt)")
    return True


# -- decode -------------------------------------------------------------------------------------------
def _register_decode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="write a headline for each input line", formatter_class=_RAW,
                       description=_wrap("Beam search on the head's exact top-k (beam 5, at most 30 words, the "
                                         "paper's). --duc: no end tag, exactly 30 words (the scorer cuts to 75 "
                                         "bytes). Writes one headline per line to --out (atomically) or stdout."),
                       epilog="examples:\n  sohsm s2s decode runs/s2s --input gigaword --out giga.txt\n"
                       "  sohsm s2s decode runs/s2s --input duc2004 --duc --out duc.txt\n"
                       "  sohsm s2s decode runs/s2s --input my_articles.txt > headlines.txt")
    p.add_argument("run", metavar="RUN", help="a run directory of `sohsm s2s train`")
    p.add_argument("--input", required=True, metavar="SET_OR_FILE",
                   help="gigaword (the test set), duc2004, duc2003, or a file of articles, one per line")
    p.add_argument("--out", metavar="FILE", help="where the headlines go (default: standard output)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory of the named sets")
    p.add_argument("--duc", action="store_true", help="DUC setting: no end tag, exactly --max-len words")
    p.add_argument("--beam", type=int, default=5, metavar="K", help="beam size (default 5)")
    p.add_argument("--max-len", type=int, default=30, metavar="N", help="most words per headline (default 30)")
    p.add_argument("--batch-size", type=int, default=64, metavar="B", help="articles decoded together (default 64)")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best", help="best.pt (default) or last.pt")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=_decode)


def _decode(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sohsm.data.files import write_atomic_text
    from sohsm.data.headlines import read_inputs, resolve_eval_set
    from sohsm.models.beam import plan_beam
    from sohsm.train.s2s_run import decode, load_summariser

    for flag, value in (("--beam", args.beam), ("--max-len", args.max_len), ("--batch-size", args.batch_size)):
        if value < 1:
            raise CommandError(f"{flag} must be >= 1, got {value}")
    try:
        source, _ = resolve_eval_set(args.input, args.data_dir)
        inputs = read_inputs(source)
        run = load_summariser(args.run, args.checkpoint, args.device)
        plan_beam(args.beam, run.head.n_classes, max(map(len, inputs.sources), default=1) + 1,
                  run.model.hidden_size, args.max_len, allow_eos=not args.duc, device=args.device)
        with tqdm(total=len(inputs), unit="sent", desc="decode", disable=args.quiet, file=sys.stderr) as bar:
            out = decode(run, inputs, beam=args.beam, max_len=args.max_len, duc=args.duc,
                         batch_size=args.batch_size, on_batch=bar.update)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    text = "".join(line + "\n" for line in out.headlines)
    if args.out:
        write_atomic_text(args.out, text)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        print(f"decoded {len(out.headlines):,} headlines in {out.seconds:.1f} s ({out.sentences_per_s:.1f} "
              f"sentences/s); beam {args.beam}, max {args.max_len} words{', DUC: no end tag' if args.duc else ''}"
              + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    return 0


# -- score --------------------------------------------------------------------------------------------
def _register_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="ROUGE-1/2/L of headlines against references", formatter_class=_RAW,
                       description=_wrap("ROUGE as ROUGE-1.5.5 computes it with the papers' options: stemming, "
                                         "several references pooled; Gigaword: full-length F1; --duc: recall "
                                         "of headlines cut to 75 bytes. See docs/s2s.md."),
                       epilog="examples:\n  sohsm s2s score giga.txt --references gigaword\n"
                       "  sohsm s2s score duc.txt --references duc2004 --duc\n"
                       "  sohsm s2s score mine.txt --references ref0.txt ref1.txt")
    p.add_argument("hypotheses", metavar="HYPOTHESES", help="one headline per line")
    p.add_argument("--references", nargs="+", required=True, metavar="SET_OR_FILE",
                   help="gigaword, duc2004, duc2003, or reference files (one headline per line each)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory of the named sets")
    p.add_argument("--duc", action="store_true", help="cut every headline to 75 bytes and report recall")
    p.add_argument("--bytes", type=int, metavar="N", help="cut to N bytes (default: 75 with --duc, else none)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_score)


def _score(args: argparse.Namespace) -> int:
    import json

    from sohsm.data.headlines import EVAL_SETS, read_references, resolve_eval_set
    from sohsm.data.pairs import read_lines
    from sohsm.rouge import corpus_rouge

    limit = args.bytes if args.bytes is not None else (75 if args.duc else None)
    if limit is not None and limit < 1:
        raise CommandError(f"--bytes must be >= 1, got {limit}")
    try:
        hypotheses = [" ".join(words) for words in read_lines(args.hypotheses, allow_empty=True)]
        if len(args.references) == 1 and args.references[0] in EVAL_SETS:
            _, paths = resolve_eval_set(args.references[0], args.data_dir)
        else:
            paths = args.references
        references = read_references(paths, len(hypotheses), args.hypotheses)
        result = corpus_rouge(hypotheses, references, limit)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    which = "recall" if args.duc else "fmeasure"
    if args.json:
        print(json.dumps({"measure": which, **result.reported(which), "count": result.count,
                          "options": result.options}))
        return 0
    name = "recall" if args.duc else "F1"
    print("  ".join(f"{m.replace('rouge', 'ROUGE-')} {v:.2f}" for m, v in result.reported(which).items())
          + f"   ({name}, {result.count:,} headlines)")
    print(f"options  {result.options}")
    return 0
