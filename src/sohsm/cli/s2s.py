"""`sohsm s2s`: train a headline generator with any head, write headlines, score them with ROUGE."""
from __future__ import annotations

import argparse
import shlex
import sys

from sohsm.cli.main import RAW as _RAW, CommandError, add_command_group, wrap as _wrap
from sohsm.cli.train_options import add_train_command, dev_line, stop_reason, training_time
from sohsm.data.errors import DataError

_EPILOG = """\
defaults are the paper's Gigaword setting: embedding and LSTMs 512, attention, Adam lr 1e-3, weight
decay 1e-6, no clipping, batch 128; training pairs: Gigaword's 10k plus the extra validation subsets
(less pairs whose article is in the test or dev set), about 35k.

examples:
  sohsm s2s pairs GIGAWORD_DIR --out runs/pairs       # the paper's training pairs from your own LDC Gigaword
  sohsm s2s train --pairs runs/pairs --head full --run-dir runs/s2s-giga
  sohsm s2s titles --out runs/titles                    # the training titles, for a language model
  sohsm lm train --corpus runs/titles --head self_organized --run-dir runs/titles-lm --epochs 5
  sohsm s2s train --head self_organized --clusters-from runs/titles-lm --run-dir runs/s2s-sohsm
  sohsm s2s train --head full --run-dir runs/s2s-full --time-budget 1800
  sohsm s2s decode runs/s2s-sohsm --input gigaword --out runs/s2s-sohsm/giga.txt
  sohsm s2s decode runs/s2s-sohsm --input duc2004 --duc --out runs/s2s-sohsm/duc2004.txt
  sohsm s2s score runs/s2s-sohsm/duc2004.txt --references duc2004 --duc
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``s2s`` command and its ``pairs``, ``titles``, ``train``, ``decode`` and ``score`` subcommands."""
    sub = add_command_group(
        subparsers, "s2s",
        description="Make training pairs from your own Gigaword; train an attention encoder-decoder that writes a "
        "headline for a news sentence, with any head as its output layer (the paper's second experiment); decode "
        "with beam search; score with ROUGE.",
        epilog=_EPILOG,
    )
    _register_pairs(sub)
    _register_titles(sub)
    _register_train(sub)
    _register_decode(sub)
    _register_score(sub)


def _data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", metavar="DIR", help="data directory (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    p.add_argument("--extra", action=argparse.BooleanOptionalAction, default=None,
                   help="add the extra validation subsets to the training pairs (default: yes)")


# -- pairs ------------------------------------------------------------------------------------------
_PAIRS_DESCRIPTION = """\
Make the headline-generation training set of Rush et al. (2015) from your own LDC English Gigaword
(gzipped SGML, one file per agency and month; give files or folders of them): each story's headline
and first sentence, lower-cased, in PTB-style tokens, digits as #, its byline and dateline removed,
filtered as Rush et al.'s released pipeline (NAMAS) filters them, and without any pair whose article is
an input of a test set in the data directory (Gigaword's test set, DUC-2003, DUC-2004). Streams the
files; prints what each filter dropped. Writes into OUT (atomically: a failed run leaves OUT as it was)
train.article.txt, train.title.txt, valid.article.txt, valid.title.txt and pairs.json, the folder
`sohsm s2s train --pairs OUT` trains on. The rules, exactly: docs/s2s.md."""


def _register_pairs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pairs", help="make the paper's training pairs from your own English Gigaword",
                       formatter_class=_RAW, description=_PAIRS_DESCRIPTION,
                       epilog="examples:\n  sohsm s2s pairs /data/LDC2011T07/data --out runs/pairs\n"
                       "  sohsm s2s pairs cna_eng_199710.gz cna_eng_200403.gz --out runs/pairs-cna\n"
                       "  sohsm s2s train --pairs runs/pairs --head self_organized --run-dir runs/s2s")
    p.add_argument("gigaword", nargs="+", metavar="GIGAWORD",
                   help="English Gigaword .gz files, or folders holding them")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the pairs into")
    p.add_argument("--valid-share", type=float, default=0.05, metavar="P",
                   help="share of the documents that go to the dev pairs, chosen by their id (default 0.05)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="data directory whose test sets are left out (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_pairs)


def _pairs(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sohsm.data.gigaword import REPORT_FILE, gigaword_files, load_test_articles, make_pairs

    if not 0 < args.valid_share < 1:
        raise CommandError(f"--valid-share must be between 0 and 1 (both excluded), got {args.valid_share}")
    try:
        files = gigaword_files(args.gigaword)
        tests = load_test_articles(args.data_dir)
        total = sum(f.stat().st_size for f in files)
        with tqdm(total=total, unit="B", unit_scale=True, desc="gigaword", disable=args.quiet,
                  file=sys.stderr) as bar:
            report = make_pairs(files, args.out, valid_share=args.valid_share, tests=tests, on_bytes=bar.update)
    except DataError as error:
        raise CommandError(str(error)) from None
    print(report.table())
    checked = ", ".join(f"{name} ({n:,} articles)" for name, n in report.test_sets.items())
    print(f"test sets   {checked or 'none found in the data directory: no pair was checked against a test set'}")
    out = shlex.quote(str(args.out))
    print(f"wrote       {out}/ ({len(files)} file(s) read; {out}/{REPORT_FILE} holds these counts)")
    print(f"train       sohsm s2s train --pairs {out} --run-dir RUN_DIR")
    return 0


# -- titles -----------------------------------------------------------------------------------------
def _register_titles(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("titles", help="write the training titles as a corpus for `sohsm lm train`",
                       formatter_class=_RAW,
                       description=_wrap("Write OUT/train.txt (the summariser's training titles) and OUT/valid.txt "
                                         "(its dev titles): `sohsm lm train --corpus OUT` then builds the "
                                         "summariser's vocabulary, so its clusters fit `s2s train --clusters-from`."),
                       epilog="example:\n  sohsm s2s titles --out runs/titles")
    _data_options(p)
    p.add_argument("--pairs", metavar="DIR", help="the titles of a folder `sohsm s2s pairs` wrote (default: the "
                   "data directory's Gigaword pairs)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write train.txt and valid.txt into")
    p.set_defaults(func=_titles)


def _titles(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sohsm.data.headlines import load_pairs_folder, load_training_pairs
    from sohsm.data.pairs import write_lines

    try:
        if args.pairs is not None:
            pairs = load_pairs_folder(args.pairs)
        else:
            pairs = load_training_pairs(args.data_dir, True if args.extra is None else args.extra)
    except DataError as error:
        raise CommandError(str(error)) from None
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        assert pairs.train.targets is not None and pairs.valid.targets is not None  # training pairs have titles
        write_lines(out / "train.txt", pairs.train.targets)
        write_lines(out / "valid.txt", pairs.valid.targets)
    except OSError as error:
        raise CommandError(f"cannot write to {out}: {error.strerror or error}") from None
    print(f"wrote {out / 'train.txt'} ({len(pairs.train):,} titles) and {out / 'valid.txt'} ({len(pairs.valid):,})")
    return 0


# -- train --------------------------------------------------------------------------------------------
def _register_train(sub: argparse._SubParsersAction) -> None:
    from sohsm.tasks.s2s import S2SConfig

    add_train_command(
        sub, S2SConfig, _print_summary, help="train a summariser (or resume a run)",
        description="Train the attention encoder-decoder with the chosen head in RUN_DIR (config.json, vocab.json, "
        "metrics.jsonl, last.pt, best.pt by dev perplexity). Budgets, resume and stop signals work as in "
        "`sohsm lm train`.",
        epilog=_EPILOG,
    )


def _print_summary(result) -> None:
    from sohsm.train import format_signature

    run = shlex.quote(str(result.run_dir))
    print(f"stopped     {stop_reason(result)}: step {result.step:,}, {result.tokens:,} target tokens, epoch "
          f"{result.epoch:.2f}, {training_time(result)}")
    dev = dev_line(result, lambda e: f"ppl {e.ppl:.2f}")
    if dev is not None:
        print(dev)
    reverse = _print_reverse_accuracy(result.run_dir)
    print(f"signature   {format_signature(result.signature)}")
    if not reverse:
        print(f"decode      sohsm s2s decode {run} --input gigaword --out "
              f"{shlex.quote(str(result.run_dir / 'giga.txt'))}")
    if result.stopped != "done":
        print(f"resume      sohsm s2s train --run-dir {run} --resume")


def _print_reverse_accuracy(run_dir) -> bool:
    """For a reverse-task run, print the share of held-out strings that greedy decoding reverses exactly;
    whether the run is one."""
    import json

    from sohsm.tasks.s2s import held_out_pairs, sequence_accuracy
    from sohsm.train.loading import load_run

    if json.loads((run_dir / "config.json").read_text())["data"].get("dataset") != "reverse":
        return False
    checkpoint = "best" if (run_dir / "best.pt").exists() else "last"  # the best dev ppl's, as `lm eval` takes
    run = load_run(run_dir, checkpoint, task="s2s")
    held_out = held_out_pairs(run.config)
    print(f"accuracy    {100 * sequence_accuracy(run, held_out):.1f}% of {len(held_out):,} held-out strings "
          f"reversed exactly (greedy decoding, {checkpoint}.pt)")
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

    from sohsm.atomic_writes import write_atomic_text
    from sohsm.data.headlines import read_inputs, resolve_eval_set
    from sohsm.models.beam import plan_beam
    from sohsm.models.seq2seq import AttentionSeq2Seq
    from sohsm.tasks.s2s import decode
    from sohsm.train.loading import load_run

    for flag, value in (("--beam", args.beam), ("--max-len", args.max_len), ("--batch-size", args.batch_size)):
        if value < 1:
            raise CommandError(f"{flag} must be >= 1, got {value}")
    try:
        source, _ = resolve_eval_set(args.input, args.data_dir)
        inputs = read_inputs(source)
        run = load_run(args.run, args.checkpoint, args.device, task="s2s")
        assert isinstance(run.model, AttentionSeq2Seq)  # a summariser's run
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
