"""sohsm's word2vec (``sohsm w2v train``) beside gensim's ``Word2Vec``, same data, same settings, one thread each.

Both train on the same stream: the training split of the corpus with the words under
``min_count`` dropped, cut in pieces of 1000 words (word2vec's "sentences"; sohsm's steps),
dim 100, window 5, min-count 5, sub-sampling 1e-3, 5 epochs, CBOW with the mean of the
context. gensim keeps its defaults otherwise (rate 0.025 falling to 0.0001); sohsm uses
word2vec.c's CBOW rate 0.05. Rows:

* sohsm ``tree_huffman`` beside gensim ``hs=1, negative=0`` (word2vec's hierarchical softmax);
* sohsm ``pmi`` (word2vec's negative sampling: k = 5 per word, unigram^0.75) beside gensim ``negative=5``;
* sohsm ``self_organized``: the same CBOW with the two-level head whose clusters are learned.

Speed is corpus words read per second of training (words x epochs / seconds; gensim's
``train()`` wall time, sohsm's training clock, which leaves out its dev evaluations and
checkpoints), one thread each (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``, gensim
``workers=1``), the runs one after the other. Quality: analogy accuracy (3CosAdd on
questions-words.txt, questions within the vocabulary) and Spearman's rho on WordSim-353,
both by :mod:`sohsm.tasks.w2v.vectors` for every row (gensim's own evaluators are run on
gensim's vectors as a check). The test files are those gensim ships in ``gensim/test/test_data``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/word2vec.py                      # writes docs/results/word2vec.md
    python benchmarks/word2vec.py --rows gensim-hs,sohsm-hs --epochs 1 --out w2v-one-epoch.md
    python benchmarks/word2vec.py --rows gensim-hs,sohsm-hs --seeds 1,2,3 --out w2v-three-seeds.md  # + their means
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

#: name -> (library, architecture, head or gensim settings)
ROWS = {
    "gensim-hs": ("gensim", "cbow", {"hs": 1, "negative": 0}),
    "sohsm-hs": ("sohsm", "cbow", "tree_huffman"),
    "gensim-neg": ("gensim", "cbow", {"hs": 0, "negative": 5}),
    "sohsm-neg": ("sohsm", "cbow", "pmi"),
    "sohsm-so": ("sohsm", "cbow", "self_organized"),
    "gensim-sg-hs": ("gensim", "skipgram", {"hs": 1, "negative": 0}),
    "sohsm-sg-hs": ("sohsm", "skipgram", "tree_huffman"),
    # gensim with one of its settings moved, to measure what a difference between the loops is worth
    "gensim-hs-init0.5": ("gensim", "cbow", {"hs": 1, "negative": 0, "init_range": 0.5}),  # word2vec.c's start
    "gensim-hs-jobs1000": ("gensim", "cbow", {"hs": 1, "negative": 0, "batch_words": 1000}),  # rate, draws per job
}
DEFAULT_ROWS = "gensim-hs,sohsm-hs,gensim-neg,sohsm-neg,sohsm-so"


def gensim_data() -> Path:
    from gensim.test.utils import datapath

    return Path(datapath("questions-words.txt")).parent


def config_for(args, architecture: str, head: str):
    from sohsm.tasks.w2v.config import W2VConfig, W2VDataConfig, W2VModelConfig
    from sohsm.train.config import HeadConfig, OptimConfig

    text_mode = "running" if Path(args.corpus).is_file() else None  # your own text: one running text
    return W2VConfig(data=W2VDataConfig(corpus=args.corpus, min_count=5, sample=1e-3, text_mode=text_mode,
                                        eval_rows=2000),
                     model=W2VModelConfig(architecture=architecture, dim=100, window=5, init_range=args.init_range),
                     head=HeadConfig(name=head), epochs=args.epochs, batch_words=args.batch_words,
                     row_cap=None if args.row_cap <= 0 else args.row_cap, fast_path=not args.generic,
                     kernel=args.kernel,
                     update_rows=args.update_rows,
                     update_row_cap=None if args.update_row_cap <= 0 else args.update_row_cap,
                     optim=OptimConfig(optimizer="sgd", lr=args.lr, clip=None, weight_decay=0.0), seed=args.seed)


def run_sohsm(args, name: str, architecture: str, head: str) -> dict:
    from sohsm.tasks.w2v.vectors import load_vectors
    from sohsm.train.loop import train

    config = config_for(args, architecture, head)
    run_dir = Path(args.runs) / name
    shutil.rmtree(run_dir, ignore_errors=True)
    words = words_per_epoch(args) * args.epochs
    cpu = time.process_time()
    result = train(config, run_dir, progress=False)
    cpu = time.process_time() - cpu
    out = {"seconds": result.elapsed_s, "cpu_seconds": cpu, "words": words,
           "dev_ppl": result.last_eval.ppl if result.last_eval else None,
           "vectors": load_vectors(run_dir), "run_dir": str(run_dir)}
    if head == "self_organized":
        out["clusters"] = so_clusters(run_dir)
    return out


_STREAM: dict = {}


def stream_words(args) -> list[list[str]]:
    """The training stream as sohsm reads it, in pieces of 1000 words (gensim's sentences)."""
    if "pieces" not in _STREAM:
        from sohsm.tasks.w2v.task import W2VTask

        task = W2VTask.load(config_for(args, "cbow", "tree_huffman"), torch.device("cpu"))
        words = [task.vocab.itos[i] for i in task.stream.stream.tolist()]
        _STREAM["pieces"] = [words[i: i + 1000] for i in range(0, len(words), 1000)]
        _STREAM["words"] = len(words)
    return _STREAM["pieces"]


def words_per_epoch(args) -> int:
    stream_words(args)
    return _STREAM["words"]


def run_gensim(args, name: str, architecture: str, settings: dict) -> dict:
    from gensim.models import Word2Vec

    from sohsm.tasks.w2v.vectors import WordVectors

    sentences = stream_words(args)
    settings = dict(settings)
    init_range = settings.pop("init_range", None)
    model = Word2Vec(vector_size=100, window=5, min_count=5, sample=1e-3, sg=int(architecture == "skipgram"),
                     workers=1, epochs=args.epochs, seed=args.seed, cbow_mean=1, **settings)
    model.build_vocab(sentences)
    if init_range is not None:  # gensim starts its vectors in +-1/dim: the same draws, scaled
        model.wv.vectors *= init_range
    start, cpu = time.perf_counter(), time.process_time()
    model.train(sentences, total_examples=len(sentences), epochs=args.epochs)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    wv = model.wv
    vectors = WordVectors(list(wv.index_to_key), torch.from_numpy(wv.vectors.copy()),
                          np.array([wv.get_vecattr(w, "count") for w in wv.index_to_key]))
    qw, ws = gensim_data() / "questions-words.txt", gensim_data() / "wordsim353.tsv"
    own_analogy = wv.evaluate_word_analogies(str(qw))[0]
    own_rho = wv.evaluate_word_pairs(str(ws))[1][0]
    return {"seconds": seconds, "cpu_seconds": cpu, "words": words_per_epoch(args) * args.epochs, "dev_ppl": None,
            "vectors": vectors,
            "gensim_own": (own_analogy, own_rho)}


def so_clusters(run_dir: Path, show: int = 12, words: int = 10) -> list[list[str]]:
    """The self-organized head's clusters of the run (most frequent words first), the largest by tf-mass."""
    from sohsm.tasks.w2v.vectors import load_w2v_run

    run = load_w2v_run(run_dir, "last")  # the one run loader
    head, vocab = run.head, run.vocab
    counts = torch.from_numpy(vocab.counts.copy()).double()
    clusters = [c for c in head.clusters() if c.numel()]
    clusters.sort(key=lambda c: -float(counts[c].sum()))
    picked = clusters[:: max(1, len(clusters) // show)][:show]
    return [[vocab.itos[int(i)] for i in c[counts[c].argsort(descending=True)][:words]] for c in picked]


def _kernel(args) -> str:
    """The hand-written path's loop the sohsm rows take (``--kernel``; auto: numba where it can be imported)."""
    from sohsm.tasks.w2v.kernel import numba_available

    return ("numba" if numba_available() else "torch") if args.kernel == "auto" else args.kernel


def _numba_version() -> str:
    import numba

    return numba.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="text8-small")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="both libraries' seed (default 1)")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds: every row with each, and a table of the means (instead of --seed)")
    parser.add_argument("--lr", type=float, default=None,
                        help="sohsm: the starting rate (default: word2vec.c's, 0.05 CBOW, 0.025 skip-gram)")
    parser.add_argument("--init-range", type=float, default=1.0,
                        help="sohsm: --init-range, the vectors' start +-X/dim (default 1, gensim's; word2vec.c: 0.5)")
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--runs", default="runs/word2vec-benchmark", help="where sohsm's run directories go")
    parser.add_argument("--batch-words", type=int, default=1000, help="sohsm: corpus words per step (default 1000)")
    parser.add_argument("--row-cap", type=float, default=4.0, help="sohsm: --row-cap (default 4; 0: none)")
    parser.add_argument("--generic", action="store_true",
                        help="sohsm: train every head through autograd (--no-fast-path), as before the hand-written "
                             "path")
    parser.add_argument("--kernel", default="auto", choices=("auto", "numba", "torch"),
                        help="sohsm: --kernel, the hand-written path's loop (default auto: numba where installed)")
    parser.add_argument("--update-rows", type=int, default=64, help="sohsm: --update-rows, torch loop (default 64)")
    parser.add_argument("--update-row-cap", type=float, default=32.0,
                        help="sohsm: --update-row-cap (default 32; 0: none)")
    parser.add_argument("--out", default="docs/results/word2vec.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from sohsm.tasks.w2v.vectors import analogy_accuracy, similarity_correlation

    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; known: {', '.join(ROWS)}")
    qw, ws = gensim_data() / "questions-words.txt", gensim_data() / "wordsim353.tsv"
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    results = {}
    for seed, name in [(seed, name) for seed in seeds for name in names]:
        library, architecture, what = ROWS[name]
        print(f"{name} seed {seed} ...", file=sys.stderr, flush=True)
        args.seed = seed
        r = (run_gensim if library == "gensim" else run_sohsm)(args, name, architecture, what)
        r["name"], r["seed"] = name, seed
        name = f"{name}@{seed}" if args.seeds else name
        a, s = analogy_accuracy(r["vectors"], qw), similarity_correlation(r["vectors"], ws)
        r.update(analogy=a, similarity=s, words_per_s=r["words"] / r["cpu_seconds"])
        results[name] = r
        write_report(args, results, argv if argv is not None else sys.argv[1:],
                     done=len(results) == len(names) * len(seeds))
        print(f"{name}: {r['words_per_s']:,.0f} words/s ({r['cpu_seconds']:.0f} CPU s, {r['seconds']:.0f} s), "
              f"analogies {a.accuracy:.2%} ({a.answered} asked), "
              f"rho {s.spearman:.3f}" + (f", gensim's own evaluators {r['gensim_own'][0]:.2%} / "
                                         f"{r['gensim_own'][1]:.3f}" if "gensim_own" in r else ""),
              file=sys.stderr, flush=True)
    return 0


def means_table(results: dict) -> list[str]:
    """Each row's means over its seeds, with every seed's analogies and rho (the page's lines)."""
    by_row: dict[str, list[dict]] = {}
    for r in results.values():
        by_row.setdefault(r["name"], []).append(r)
    lines = ["", "Means over the seeds (each seed's value in seed order):", "",
             "| row | seeds | analogy accuracy | per seed | WordSim-353 rho | per seed | words/s (CPU) |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in by_row.items():
        acc = [100 * r["analogy"].accuracy for r in runs]
        rho = [r["similarity"].spearman for r in runs]
        speed = [r["words_per_s"] for r in runs]
        lines.append(f"| {name} | {len(runs)} | {np.mean(acc):.2f}% | {' / '.join(f'{x:.2f}' for x in acc)} | "
                     f"{np.mean(rho):.3f} | {' / '.join(f'{x:.3f}' for x in rho)} | {np.mean(speed):,.0f} |")
    return lines


def write_report(args, results: dict, argv: list[str], done: bool = True) -> None:
    import gensim

    command = "OMP_NUM_THREADS=1 nice -n 15 python benchmarks/word2vec.py" + "".join(f" {a}" for a in argv)
    first = next(iter(results.values()))
    lines = [
        "# Word vectors: sohsm's word2vec beside gensim's",
        "",
        f"Written by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"{machine()}, gensim {gensim.__version__}. Every number below comes from that one command."
        + ("" if done else " (Written after each row: the command had not finished all its rows.)"),
        "",
        f"Data: `{args.corpus}` training split with the words seen fewer than 5 times dropped: "
        f"{first['words'] // args.epochs:,} words a pass, {len(first['vectors']):,} words in the vocabulary; "
        "CBOW or skip-gram (the model column), dim 100, window 5 (each word draws its own in 1..5), sub-sampling "
        f"1e-3, {args.epochs} epochs, pieces of 1000 words (windows stop at their borders, as at word2vec's "
        "sentences). gensim: `Word2Vec(vector_size=100, window=5, min_count=5, sample=1e-3, workers=1, "
        f"epochs={args.epochs}, "
        + ("seed=S, " if args.seeds else f"seed={args.seed}, ")
        + "sg=0|1, cbow_mean=1, hs=..., negative=...)`"
        + (f" with S each of the seeds {args.seeds} (sohsm's `--seed S`)" if args.seeds else "")
        + ", its default rate 0.025; sohsm: "
        "`sohsm w2v train --model cbow|skipgram --head ...` defaults ("
        + ("rate 0.05 for CBOW, 0.025 for skip-gram, word2vec.c's" if args.lr is None else f"rate {args.lr:g} (`--lr`)")
        + ", falling linearly "
        f"to 0; input vectors starting uniform in +-{args.init_range:g}/dim"
        + (" (gensim's start)" if args.init_range == 1 else " (`--init-range`)" if args.init_range != 0.5
           else " (word2vec.c's start, `--init-range 0.5`)")
        + "; output weights starting at 0; "
        + (f"{args.batch_words} words a step, a vector moving by at most {args.row_cap:g} rows' worth of update a "
           "step, "
           "through autograd (`--no-fast-path`))." if args.generic else
           "the binary tree and `pmi` trained by word2vec's own loop compiled by Numba (`--kernel numba`: one row "
           f"at a time, in place, no row cap, numba {_numba_version()}); the self-organized head through autograd, "
           f"{args.batch_words} words a step, at most {args.row_cap:g} rows' worth a step)." if _kernel(args) == "numba"
           else "the binary tree and `pmi` trained by the hand-written path in torch (`--kernel torch`): pieces of "
                f"{args.batch_words} words, updated "
           f"in place {args.update_rows} rows at a time, a vector moving by at most {args.update_row_cap:g} rows' "
           "worth of update at once; the self-organized head through autograd, "
           f"{args.batch_words} words a step, at most {args.row_cap:g} rows' worth a step)."),
        "",
        "Speed: corpus words x epochs / CPU seconds of the training call (`time.process_time()`: gensim's "
        "`train()`; sohsm's whole `train()`, which also loads the cached corpus, evaluates 2,000 dev rows at each "
        "epoch's end and writes checkpoints), one thread each, the runs one after the other. CPU time, not wall "
        "time: the machine was shared with other jobs and these ran under `nice`, so wall time measured the "
        "queue (the wall seconds of training are in the last column). Analogies: 3CosAdd "
        "on gensim's `questions-words.txt`, the questions whose four words are in the vocabulary (coverage in "
        "brackets); WordSim-353: Spearman's rho on gensim's `wordsim353.tsv`, pairs in the vocabulary. The dev "
        "perplexity is sohsm's held-out check (the centre word of the first 2,000 dev rows).",
        "",
        "| row | model | output layer | words/s (CPU) | analogy accuracy | WordSim-353 rho | dev ppl | CPU s "
        "| wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        library, architecture, what = ROWS[r["name"]]
        layer = (", ".join(f"{k}={v}" for k, v in what.items()) if isinstance(what, dict) else f"--head {what}")
        a, s = r["analogy"], r["similarity"]
        lines.append(f"| {name} | {library} {architecture} | {layer} | {r['words_per_s']:,.0f} | {a.accuracy:.2%} "
                     f"({a.answered:,} of {a.total:,}) | {s.spearman:.3f} ({s.pairs} of {s.total}) | "
                     + (f"{r['dev_ppl']:.1f}" if r["dev_ppl"] is not None else "-")
                     + f" | {r['cpu_seconds']:.0f} | {r['seconds']:.0f} |")
    if args.seeds:
        lines += means_table(results)
    checks = [f"{n}: {r['gensim_own'][0]:.2%} analogies, rho {r['gensim_own'][1]:.3f}"
              for n, r in results.items() if "gensim_own" in r]
    if checks:
        lines += ["", "gensim's own evaluators on gensim's vectors (`evaluate_word_analogies`, "
                  "`evaluate_word_pairs`), a check of sohsm's: " + "; ".join(checks) + "."]
    for name, r in results.items():
        if "clusters" in r:
            lines += ["", f"## The self-organized head's clusters ({name})", "",
                      "The learned word classes (the paper's Table 3), clusters picked evenly from the list sorted "
                      "by tf-mass, each with its most frequent words:", "", "| # | words |", "|---|---|"]
            lines += [f"| {i + 1} | {' '.join(words)} |" for i, words in enumerate(r["clusters"])]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    json_out = Path(args.out).with_suffix(".json")
    json_out.write_text(json.dumps({n: {"row": r["name"], "seed": r["seed"], "words_per_s": r["words_per_s"],
                                        "analogy": r["analogy"].accuracy, "analogy_asked": r["analogy"].answered,
                                        "rho": r["similarity"].spearman, "dev_ppl": r["dev_ppl"],
                                        "seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"]}
                                    for n, r in results.items()}, indent=1) + "\n")
    print(f"wrote {args.out} and {json_out}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
