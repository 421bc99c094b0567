"""`sohsm data`: fetch, list and inspect the corpora in your data directory."""
from __future__ import annotations

import argparse

from sohsm.cli.main import RAW as _RAW, CommandError, add_command_group
from sohsm.data import corpora, corpus_files
from sohsm.data.errors import DataError
from sohsm.data.files import data_dir_origin, resolve_cache_dir, resolve_data_dir
from sohsm.data.headlines import headline_status

_STATE_TEXT = {
    "ok": "ok",
    "unverified": "present (no checksum known)",
    "missing": "missing",
    "partial": "incomplete",
    "corrupt": "CHECKSUM MISMATCH",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` command and its ``fetch``, ``list`` and ``info`` subcommands."""
    names = ", ".join(corpora.corpus_names())
    sub = add_command_group(
        subparsers, "data",
        description="Fetch, list and inspect the corpora in your data directory "
        "(--data-dir, else $SOHSM_DATA, else ~/.cache/sohsm).",
        epilog="examples:\n  sohsm data list\n  sohsm data fetch ptb\n  sohsm data info ptb",
    )

    p = sub.add_parser(
        "fetch", help="download a corpus and verify its checksums", formatter_class=_RAW,
        description=f"Download corpus NAME ({names}) into your data directory and verify "
        "every file; files already present and intact are kept.",
        epilog="examples:\n  sohsm data fetch ptb\n  sohsm data fetch wikitext-2 --data-dir ~/corpora\n"
        "  sohsm data fetch ptb --base-url http://127.0.0.1:8000   # a server mirroring a data directory",
    )
    p.add_argument("name", metavar="NAME", help="corpus name")
    _add_dirs(p)
    p.add_argument("--base-url", metavar="URL",
                   help="download from URL/<corpus folder>/<file> instead of the usual locations")
    p.add_argument("--force", action="store_true", help="download even files that are present and intact")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_fetch)

    p = sub.add_parser(
        "list", help="known corpora and whether they are present and verified", formatter_class=_RAW,
        description="List the known corpora and whether each is present and verified in your data directory.",
        epilog="examples:\n  sohsm data list\n  sohsm data list --data-dir ~/corpora",
    )
    _add_dirs(p)
    p.set_defaults(func=_list)

    p = sub.add_parser(
        "info", help="token counts and vocabulary size of a corpus", formatter_class=_RAW,
        description=f"Load corpus NAME ({names}, or the path of your own text file or folder) "
        "and print its token counts and vocabulary size.",
        epilog="examples:\n  sohsm data info ptb\n  sohsm data info text8-small --min-count 10\n"
        "  sohsm data info my_text.txt --text-mode running",
    )
    p.add_argument("name", metavar="NAME", help="corpus name, or a text file or folder")
    _add_dirs(p)
    p.add_argument("--min-count", type=int, metavar="N", help="words seen fewer times become <unk>")
    p.add_argument("--max-size", type=int, metavar="N", help="at most N vocabulary entries")
    p.add_argument("--text-mode", choices=("lines", "running"),
                   help="your own text: <eos> per line (default) or running text")
    p.add_argument("--valid-fraction", type=float, default=0.1, metavar="F",
                   help="your own text without a valid file: share that goes to valid (default 0.1)")
    p.set_defaults(func=_info)


def _add_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR", help="data directory (default: $SOHSM_DATA, else ~/.cache/sohsm)")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="cache directory (default: $SOHSM_CACHE, else ~/.cache/sohsm/cache)")


def _fetch(args: argparse.Namespace) -> int:
    try:
        paths = corpus_files.fetch(args.name, args.data_dir, base_url=args.base_url, force=args.force,
                              progress=not args.no_progress, cache_dir=args.cache_dir)
    except DataError as error:
        raise CommandError(str(error)) from None
    for path in paths:
        print(f"{path}  ok")
    return 0


def _list(args: argparse.Namespace) -> int:
    root = resolve_data_dir(args.data_dir)
    print(f"data directory: {root} ({data_dir_origin(args.data_dir)})")
    rows = []
    for name in corpora.corpus_names():
        status = corpus_files.corpus_status(name, args.data_dir, args.cache_dir)
        rows.append((name, _STATE_TEXT.get(status.state, status.state), corpora.get_spec(name).description))
        for f in status.files:
            if f.state in ("mismatch", "wrong-size"):
                rows.append(("", "", f"  {f.spec.path}: {f.state}"))
    width = max(len(r[0]) for r in rows)
    state_width = max(len(r[1]) for r in rows)
    for name, state, text in rows:
        print(f"{name:<{width}}  {state:<{state_width}}  {text}")
    print("\nheadline generation (`sohsm s2s`): not downloadable, their terms ask for a copy of your own")
    pieces = headline_status(args.data_dir)
    width = max(len(piece.name) for piece, _ in pieces)
    for piece, absent in pieces:
        state = "ok" if not absent else "missing" if len(absent) == len(piece.files) else "partial"
        print(f"{piece.name:<{width}}  {state:<7}  {piece.description}{' (optional)' if piece.optional else ''}")
        if absent:
            print(f"{'':<{width}}           get: {piece.source}")
            print(f"{'':<{width}}           put: {', '.join(str(root / f) for f in absent)}")
    return 0


def _info(args: argparse.Namespace) -> int:
    try:
        from sohsm.data.loading import load_corpus  # torch: only where a corpus is read

        corpus = load_corpus(args.name, args.data_dir, min_count=args.min_count, max_size=args.max_size,
                                     cache_dir=args.cache_dir, text_mode=args.text_mode,
                                     valid_fraction=args.valid_fraction)
    except (DataError, ValueError) as error:
        raise CommandError(str(error)) from None
    vocab = corpus.vocab
    print(f"corpus      {corpus.name}")
    print(f"signature   {corpus.signature}")
    print(f"vocabulary  {len(vocab):,} entries (min_count={corpus.config.min_count}, "
          f"max_size={corpus.config.max_size}; {'<eos> per line' if corpus.lines else 'running text, no <eos>'})")
    for split, ids in corpus.splits().items():
        unk = float((ids == vocab.unk_id).float().mean()) if ids.numel() else 0.0
        print(f"{split:<11} {ids.numel():,} tokens, {100 * unk:.2f}% <unk>")
    where = corpus.cache_path if corpus.cache_path is not None else resolve_cache_dir(args.cache_dir)
    print(f"cache       {where} ({'read' if corpus.from_cache else 'written'})")
    return 0
