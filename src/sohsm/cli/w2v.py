"""`sohsm w2v`: word embeddings with any head (word2vec's CBOW and skip-gram): train, export, neighbours, eval."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from sohsm.cli.main import RAW, CommandError, add_command_group, wrap
from sohsm.cli.train_options import add_train_command, dev_line, stop_reason, training_time
from sohsm.data.errors import DataError

_TRAIN_EPILOG = """\
defaults are word2vec's (CBOW): dim 100, window 5 (each word draws its own in 1..5), min-count 5,
sub-sampling 1e-3, 5 epochs, rate 0.05 (skip-gram 0.025) falling linearly to 0, output weights
starting at 0. --head pmi is word2vec's negative sampling (k = 5 per word, unigram^0.75 noise).

examples:
  sohsm w2v train --corpus text8-small --model cbow --head tree_huffman --run-dir runs/w2v
  sohsm w2v train --corpus text8-small --model skipgram --head pmi --run-dir runs/w2v-sg-neg
  sohsm w2v train --corpus text8-small --head self_organized --run-dir runs/w2v-so   # learned word classes
  sohsm w2v train --corpus my_text.txt --text-mode running --dim 50 --run-dir runs/mine
  sohsm w2v train --run-dir runs/w2v --resume       # continue exactly where it stopped
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``w2v`` command and its ``train``, ``export``, ``neighbours`` and ``eval`` subcommands."""
    sub = add_command_group(
        subparsers, "w2v",
        description="Train word vectors as word2vec does, with any output head; export them in word2vec's "
        "formats, list a word's neighbours, score analogies and word similarity.",
        epilog="examples:\n  sohsm w2v train --corpus text8-small --head tree_huffman --run-dir runs/w2v\n"
        "  sohsm w2v export runs/w2v --format binary --out vectors.bin\n  sohsm w2v neighbours runs/w2v france\n"
        "  sohsm w2v eval runs/w2v --analogies questions-words.txt --similarity wordsim353.tsv",
    )
    from sohsm.tasks.w2v.config import W2VConfig

    add_train_command(
        sub, W2VConfig, _print_summary, help="train word vectors (or resume a run)",
        description="Train word vectors in RUN_DIR (config.json, vocab.json, metrics.jsonl, last.pt, best.pt), with "
        "a progress bar; Ctrl-C stops after a checkpoint and --resume continues exactly.",
        epilog=_TRAIN_EPILOG,
    )

    p = sub.add_parser("export", help="write a run's vectors in word2vec's text or binary format",
                       formatter_class=RAW, epilog="examples:\n  sohsm w2v export runs/w2v --format text\n"
                       "  sohsm w2v export runs/w2v --format binary --out vectors.bin")
    _run_arg(p)
    p.add_argument("--format", choices=("text", "binary"), default="text", help="word2vec's text (default) or binary")
    p.add_argument("--out", help="the file to write (default: RUN/vectors.txt or RUN/vectors.bin)")
    p.set_defaults(func=_export)

    p = sub.add_parser("neighbours", help="the nearest words of a word (cosine)", formatter_class=RAW,
                       epilog="examples:\n  sohsm w2v neighbours runs/w2v france --top 5")
    _run_arg(p)
    p.add_argument("word", metavar="WORD", nargs="+", help="one or more words")
    p.add_argument("--top", type=int, default=10, help="how many (default 10)")
    p.set_defaults(func=_neighbours)

    p = sub.add_parser("clusters", help="the word classes of a run's head (self_organized: the learned ones)",
                       formatter_class=RAW, epilog="examples:\n  sohsm w2v clusters runs/w2v-so --top 8 --show 20")
    _run_arg(p)
    p.add_argument("--top", type=int, default=10, help="words shown per cluster, most frequent first (default 10)")
    p.add_argument("--show", type=int, default=30, help="clusters shown, by frequency mass (default 30; 0: all)")
    p.set_defaults(func=_clusters)

    p = sub.add_parser("eval", help="analogy accuracy and word-similarity correlation", formatter_class=RAW,
                       description=wrap("Analogy accuracy by 3CosAdd on a questions-words file (questions with "
                                        "a word outside the vocabulary are left out; coverage says how many) and "
                                        "Spearman's rho on a WordSim-353-format file."),
                       epilog="examples:\n  sohsm w2v eval runs/w2v --analogies questions-words.txt "
                       "--similarity wordsim353.tsv")
    _run_arg(p)
    p.add_argument("--analogies", help="a questions-words.txt file (questions-words.txt with no such file here: "
                   "gensim's copy of word2vec's, with the w2v extra)")
    p.add_argument("--similarity", help="a WordSim-353-format file (word1 TAB word2 TAB score; wordsim353.tsv with no "
                   "such file here: gensim's copy, with the w2v extra)")
    p.add_argument("--sections", action="store_true", help="also the accuracy of each analogy section")
    p.set_defaults(func=_eval)


def _run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory (from `sohsm w2v train`)")
    p.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="last.pt (the final vectors, the default) or best.pt (best dev perplexity)")


def _print_summary(result) -> None:
    from sohsm.train import format_signature

    run = shlex.quote(str(result.run_dir))
    words_per_row = _corpus_words(result) / result.tokens if result.tokens else 0.0
    also = f", the progress bar's unit; {result.tokens_per_s * words_per_row:,.0f} corpus words/s"
    print(f"stopped     {stop_reason(result, 'row')}: step {result.step:,}, {result.tokens:,} rows, epoch "
          f"{result.epoch:.2f}, {training_time(result, 'rows', also)}")
    dev = dev_line(result, lambda e: f"ppl {e.ppl:.2f} of the centre word")
    if dev is not None:
        print(dev)
    print(f"signature   {format_signature(result.signature)}")
    print(f"vectors     sohsm w2v export {run} --format text")
    print(f"neighbours  sohsm w2v neighbours {run} WORD")
    print(f"evaluate    {_eval_hint(run)}")
    if result.signature.get("clusters") is not None:
        print(f"clusters    sohsm w2v clusters {run}")
    if result.stopped != "done":
        print(f"resume      sohsm w2v train --run-dir {run} --resume")


#: word2vec's evaluation files, by the flag of `w2v eval` that reads each; gensim ships them (pip install gensim)
EVAL_FILES = {"analogies": "questions-words.txt", "similarity": "wordsim353.tsv"}
#: where in an installed gensim they are
GENSIM_TEST_DATA = Path("gensim", "test", "test_data")


def eval_file(name: str) -> Path | None:
    """gensim's copy of word2vec's evaluation file ``name`` (:data:`EVAL_FILES`), found without importing
    gensim; ``None`` where gensim is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(GENSIM_TEST_DATA.parts[0])
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root).joinpath(*GENSIM_TEST_DATA.parts[1:], name)
        if path.is_file():
            return path
    return None


#: what installs word2vec's evaluation files (gensim, with the compiled loop)
EVAL_INSTALL_HINT = "pip install 'sohsm[w2v]'"


def _where_eval_files_are(name: str) -> str:
    """Where word2vec's file ``name`` is to be found, in words."""
    found = eval_file(name)
    return (f"word2vec's {name} is {found}" if found else
            f"word2vec's {name} comes with the w2v extra ({EVAL_INSTALL_HINT}: its gensim ships it, in "
            f"{GENSIM_TEST_DATA.as_posix()}/)")


def eval_path(flag: str, path: str) -> str:
    """The file ``--FLAG PATH`` of `w2v eval` reads: ``PATH``, or gensim's copy of word2vec's file where ``PATH``
    is that file's bare name and no such file is here (``--analogies questions-words.txt``).

    Raises:
        CommandError: no such file, saying where word2vec's comes from.
    """
    if Path(path).is_file():
        return path
    found = eval_file(EVAL_FILES[flag]) if path == EVAL_FILES[flag] else None
    if found is None:
        raise CommandError(f"--{flag}: no file {path} ({_where_eval_files_are(EVAL_FILES[flag])})")
    return str(found)


def _eval_hint(run: str) -> str:
    """`w2v eval` on word2vec's own evaluation files by name (it reads gensim's copies): as printed it runs where
    the w2v extra is installed, and says that it needs it where it is not."""
    command = f"sohsm w2v eval {run} " + " ".join(f"--{flag} {name}" for flag, name in EVAL_FILES.items())
    if all(eval_file(name) for name in EVAL_FILES.values()):
        return command + "   # word2vec's files, gensim's copies"
    return command + f"   # needs the w2v extra: {EVAL_INSTALL_HINT} (its gensim ships word2vec's files)"


def _corpus_words(result) -> int:
    """Corpus words the run has read: steps x words per step (the last piece of an epoch may be shorter)."""
    import json

    try:
        config = json.loads((Path(result.run_dir) / "config.json").read_text())
        return int(result.step) * int(config.get("batch_words", 0))
    except (OSError, ValueError):
        return 0


def _load(args: argparse.Namespace):
    from sohsm.tasks.w2v.vectors import load_vectors

    try:
        return load_vectors(args.run, args.checkpoint)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None


def _export(args: argparse.Namespace) -> int:
    from sohsm.tasks.w2v.vectors import save_word2vec

    vectors = _load(args)
    out = Path(args.out) if args.out else Path(args.run) / ("vectors.bin" if args.format == "binary" else "vectors.txt")
    if not out.parent.is_dir():
        raise CommandError(f"cannot write {out}: folder {out.parent} does not exist")
    try:
        save_word2vec(vectors, out, args.format)
    except ValueError as error:
        raise CommandError(str(error)) from None
    print(f"wrote {out}: {len(vectors):,} words x {vectors.vectors.size(1)} ({args.format})")
    return 0


def _neighbours(args: argparse.Namespace) -> int:
    from sohsm.tasks.w2v.vectors import neighbours

    if args.top < 1:
        raise CommandError(f"--top must be >= 1, got {args.top}")
    vectors = _load(args)
    for word in args.word:
        try:
            found = neighbours(vectors, word, args.top)
        except ValueError as error:
            raise CommandError(str(error)) from None
        print(f"{word}: " + ", ".join(f"{w} {c:.3f}" for w, c in found))
    return 0


def _clusters(args: argparse.Namespace) -> int:
    from sohsm.tasks.w2v.vectors import word_clusters

    for name in ("top", "show"):
        if getattr(args, name) < (1 if name == "top" else 0):
            raise CommandError(f"--{name} must be >= {1 if name == 'top' else 0}, got {getattr(args, name)}")
    try:
        clusters = word_clusters(args.run, args.checkpoint)
    except (ValueError, DataError) as error:
        raise CommandError(str(error)) from None
    shown = clusters if args.show == 0 else clusters[: args.show]
    print(f"{len(clusters)} non-empty clusters; {len(shown)} shown, by frequency mass")
    for i, words in enumerate(shown):
        more = f" (+{len(words) - args.top})" if len(words) > args.top else ""
        print(f"{i + 1:>4}  {' '.join(words[: args.top])}{more}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from sohsm.tasks.w2v.vectors import analogy_accuracy, similarity_correlation

    if not args.analogies and not args.similarity:
        raise CommandError("give --analogies FILE, --similarity FILE or both")
    for name in ("analogies", "similarity"):
        if getattr(args, name):
            setattr(args, name, eval_path(name, getattr(args, name)))
    vectors = _load(args)
    try:
        if args.analogies:
            a = analogy_accuracy(vectors, args.analogies)
            print(f"analogies   {a.accuracy:.2%} ({a.correct:,} of {a.answered:,} questions in the vocabulary; "
                  f"coverage {a.coverage:.1%} of {a.total:,}) [3CosAdd]")
            if args.sections:
                for section, (right, asked) in a.sections.items():
                    print(f"  {section:<30} {right / asked if asked else 0:.2%} of {asked:,}")
        if args.similarity:
            s = similarity_correlation(vectors, args.similarity)
            print(f"similarity  Spearman rho {s.spearman:.3f} ({s.pairs} of {s.total} pairs in the vocabulary)")
    except ValueError as error:
        raise CommandError(str(error)) from None
    return 0
