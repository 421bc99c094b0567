"""`sohsm clusters`: what a trained head's clusters hold (the paper's Table 3), and exporting them to files."""
from __future__ import annotations

import argparse
import sys

from sohsm.cli.main import RAW as _RAW, CommandError, add_command_group, wrap as _wrap


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``clusters`` command and its ``show`` and ``export`` subcommands."""
    sub = add_command_group(
        subparsers, "clusters",
        description="Inspect the word clusters of a run trained with a two-level head.",
        epilog="examples:\n  sohsm clusters show runs/ptb-sohsm\n  sohsm clusters show runs/ptb-sohsm --word actor",
    )
    p = sub.add_parser(
        "show", help="the heaviest clusters and their most frequent words", formatter_class=_RAW,
        description=_wrap(
            "List the clusters of a run's head, heaviest (by share of training tokens) first, with "
            "their sizes, token mass and most frequent words, like the paper's Table 3; or the cluster of one word. "
            "One-word clusters (a self-organized head's shortlist: each of its most frequent words alone) are "
            "counted and named in the first line, not listed, unless --one-word; the ranks number the clusters "
            "listed (the one-word ones rank after the others unless --one-word). A subword run's tokens are "
            "written as the text they stand for, quoted (\"Ġthe\" as \" the\").",
        ),
        epilog="examples:\n  sohsm clusters show runs/ptb-sohsm --top 8 --words 10\n"
        "  sohsm clusters show runs/ptb-sohsm --word company --words 30\n"
        "  sohsm clusters show runs/ptb-sohsm --checkpoint last",
    )
    p.add_argument("run", metavar="RUN", help="a run directory (from `sohsm lm train`)")
    p.add_argument("--top", type=int, default=8, metavar="N", help="clusters to show (default 8; 0 = all)")
    p.add_argument("--words", type=int, default=10, metavar="N", help="words per cluster (default 10; 0 = all)")
    p.add_argument("--word", metavar="WORD", help="show the cluster of WORD instead (a subword run: a token, as the "
                   "tokenizer writes it or as text; 'the' finds ' the' when the vocabulary lacks 'the')")
    p.add_argument("--one-word", action="store_true", help="list one-word clusters too, among the others by mass")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="best.pt (best dev perplexity, the default) or last.pt")
    p.set_defaults(func=_show)
    p = sub.add_parser(
        "export", help="write a run's clusters or tree as a hierarchy file", formatter_class=_RAW,
        description=_wrap(
            "Write the clusters (two-level heads) or the tree (tree heads) of a run as nested JSON lists of "
            "words, a Brown paths file (bits<TAB>word<TAB>count; a two-level clustering reads back with "
            "--clusters-cut = the bits of its cluster ids) or word<TAB>class lines (two-level only). "
            "Any of them is read back by --clusters-from.",
        ),
        epilog="examples:\n  sohsm clusters export runs/ptb-sohsm --format json --out ptb-clusters.json\n"
        "  sohsm clusters export runs/ptb-sohsm --format tsv > classes.txt\n"
        "  sohsm lm train --corpus ptb --head two_level_random --clusters-from ptb-clusters.json \\\n"
        "      --run-dir runs/x",
    )
    p.add_argument("run", metavar="RUN", help="a run directory (`sohsm lm train` or `sohsm s2s train`)")
    p.add_argument("--format", required=True, choices=("json", "brown", "tsv"), help="the file format")
    p.add_argument("--out", metavar="FILE", help="where to write (atomically; default: standard output)")
    p.set_defaults(func=_export)


def _show(args: argparse.Namespace) -> int:
    from sohsm.heads import ClusteredHead
    from sohsm.runs.clusters import (
        cluster_of_word,
        cluster_table,
        learned_first,
        one_word_note,
        shown,
        token_named,
        token_text,
    )
    from sohsm.train.loading import load_run  # a run of any task: a language model's or a summariser's

    for flag, value in (("--top", args.top), ("--words", args.words)):
        if value < 0:
            raise CommandError(f"{flag} must be >= 0, got {value}")
    words = args.words or None
    one_word: list = []
    try:
        run = load_run(args.run, args.checkpoint)
        if not isinstance(run.head, ClusteredHead):
            raise CommandError(f"{args.run} was trained with the {run.config.head.name!r} head, which has no "
                               "word clusters; clusters exist for two-level heads only")
        show = token_text(run)
        table = cluster_table(run.head, run.vocab, words=0 if args.word is not None else words)
        learned, one_word = learned_first(table)
        # ranks as the listing numbers its rows: by mass, the one-word clusters after the others unless --one-word
        ranked = table if args.one_word else learned + one_word
        rank = {s.cluster: i + 1 for i, s in enumerate(ranked)}
        if args.word is not None:
            rows, one_word = [cluster_of_word(run.head, run.vocab, token_named(args.word, run.vocab, show), words)], []
        else:
            listed, one_word = (table, []) if args.one_word else (learned, one_word)
            rows = listed[: args.top] if args.top else listed
    except ValueError as error:
        raise CommandError(str(error)) from None
    table, rows, one_word = shown(table, show), shown(rows, show), shown(one_word, show)
    sizes = [s.size for s in table]
    empty = sum(1 for n in sizes if n == 0)
    skipped = f"; {one_word_note(one_word)}, --one-word lists them" if args.word is None and one_word else ""
    print(f"{run.path} (step {run.step:,}): {run.config.head.name} head, {len(table)} clusters "
          f"({empty} empty), {len(run.vocab):,} {'words' if show is None else 'subwords'}{skipped}")
    entries = "words" if show is None else "subwords"
    print(f"{'rank':>4}  {'cluster':>7}  {entries:>{max(5, len(entries))}}  {'tf-mass':>7}  most frequent {entries}")
    for s in rows:
        print(f"{rank[s.cluster]:>4}  {s.cluster:>7}  {s.size:>{max(5, len(entries))}}  {s.tf_mass:>7.4f}  "
              f"{' '.join(s.words)}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from sohsm.atomic_writes import write_atomic_text
    from sohsm.clustering.hierarchy_files import brown_cut_width, format_hierarchy, ids_to_words
    from sohsm.tasks.hierarchies import head_hierarchy, read_run_head

    try:
        head, vocab, _ = read_run_head(args.run)
        tree = head_hierarchy(head)
        words = ids_to_words(tree, vocab.itos)
        text = format_hierarchy(words, args.format, dict(zip(vocab.itos, vocab.counts.tolist())))
        if args.out:
            write_atomic_text(args.out, text)
    except (ValueError, OSError) as error:
        raise CommandError(str(error)) from None
    if not args.out:
        sys.stdout.write(text)
        return 0
    two_level = all(not isinstance(w, list) for item in tree if isinstance(item, list) for w in item)
    note = (f"; read back as the same clusters with --clusters-cut {brown_cut_width(tree)}"
            if args.format == "brown" and two_level else "")
    print(f"{args.out}: {len(tree):,} top-level nodes over {len(vocab):,} words ({args.format}){note}", file=sys.stderr)
    return 0
