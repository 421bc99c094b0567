"""The whole model's cost as the vocabulary grows: a tied LSTM 256 language model, each head, N = 10k to 1M words.

Every cell is one ``sohsm lm train`` run in a fresh process (one thread), over a Zipf corpus whose vocabulary is
every one of its N words (:func:`gpu.write_zipf_corpus`, the generator the whole-model benchmarks share), with the
defaults of ``sohsm lm train`` but ``--emb-size 256 --hidden-size 256 --min-count 1`` (a batch: 128 columns x 20
steps = 2,560 tokens). What a cell measures:

* **tokens/s**: training tokens over the wall time of whole steps (forward, head, backward, clipping, optimizer),
  after two warm-up steps; at most ``--steps`` steps or ``--step-budget`` seconds of them, whichever ends first
  (the number of timed steps is in the table). A step in which the head re-clustered is left out (its K, steps
  between re-clusterings, follows from the corpus's length, so it would weigh differently at each size): the
  re-clustering is timed on its own;
* **peak RSS**: the process's peak resident memory once its steps are done (``getrusage``);
* **first step**: seconds from the process's start (the command) to the first step (imports, tokenising the
  corpus, the vocabulary, building model, head and optimizer);
* **s / re-clustering**: one ``head.reassign`` of the self-organized head after its steps (statistics as trained);
* **exact eval tokens/s**: model and ``head.log_prob`` over all N words (64 rows at a time), 640 tokens;
* **top-10 ms**: one token through the model and ``head.topk(hidden, 10)``, the median of 10.

Every time is the process's CPU time (one thread: what the cell would take on a core of its own; the machine these
numbers were measured on was shared), the steps' wall time kept beside it in the results. The process ends right
after its measurements (no evaluation, no checkpoint), so a cell costs its steps.
Each cell's result is kept in ``--results`` (JSON) as soon as it ends; a run skips the cells already there, so an
interrupted run resumes; ``--redo HEAD`` measures a head's cells again.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/scaling.py                   # every head at every size (resumable)
    python benchmarks/scaling.py --report                            # the page and plot from the results alone

Writes ``docs/benchmarks/scaling.md``, ``scaling.png`` and ``scaling.json``.
"""
from __future__ import annotations

import time

START = time.perf_counter()  # the command's start, before any import: "first step" counts from here
#: the clock of every number of a cell: this process's CPU time (one thread), so that other work on a shared machine
#: does not slow a cell down; the wall time of the steps is kept beside it
clock = time.process_time

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks"
SIZES = (10_000, 33_000, 100_000, 256_000, 1_000_000)
#: the heads in the order of the table: (key, description)
HEADS = (
    ("full", "full softmax"),
    ("adaptive", "adaptive softmax, stock cutoffs (N/22, N/4.4: torch's text8 setting scaled to N)"),
    ("adaptive_tuned", "adaptive softmax as the tuning protocol chose it (cutoffs 0.1N, 0.4N; div_value 2)"),
    ("adaptive_fairseq", "adaptive softmax with a 4k-word head (cutoffs 4k, 40k, 200k below N; div_value 4), "
                         "as fairseq's large-vocabulary language models"),
    ("two_level_frequency", "frequency binning (two-level, sqrt(N) clusters by frequency, fixed)"),
    ("self_organized", "self-organized (the default)"),
    ("importance_sampling", "sampled softmax (importance sampling, 1,024 unigram samples shared by the batch; untied: "
                            "a sampled head cannot be tied; exact evaluation)"),
    ("nce", "noise-contrastive estimation (1,024 unigram noise samples shared by the batch; untied; exact "
            "evaluation)"),
)
#: the sampled heads' flags: their samples, as large-vocabulary runs use them, and untied (they cannot be tied)
SAMPLED = {"importance_sampling": ["--head-option", "n_samples=1024", "--no-tie-weights"],
           "nce": ["--head-option", "n_samples=1024", "--no-tie-weights"]}
TOKENS_PER_STEP = 128 * 20
#: a full softmax's batch of logits beyond this many bytes is not run (it and its gradient would not fit beside
#: the other runs of a shared machine): 2.6 GB at 256k words
FULL_LOGITS_LIMIT = 2e9


def head_args(key: str, n: int) -> list[str]:
    """The ``sohsm lm train`` flags of a head at ``n`` words."""
    if key == "adaptive_tuned":
        return ["--head", "adaptive", "--head-option", f"cutoffs=[{round(0.1 * n)},{round(0.4 * n)}]",
                "--head-option", "div_value=2"]
    if key == "adaptive_fairseq":
        cutoffs = [c for c in (4000, 40_000, 200_000) if c < n]
        return ["--head", "adaptive", "--head-option", f"cutoffs={json.dumps(cutoffs).replace(' ', '')}",
                "--head-option", "div_value=4"]
    return ["--head", key, *SAMPLED.get(key, [])]


def not_run(key: str, n: int) -> str | None:
    """Why a cell is not run, or ``None``."""
    logits = TOKENS_PER_STEP * n * 4
    if key == "full" and logits > FULL_LOGITS_LIMIT:
        return f"not run: one batch's logits alone are {logits / 1e9:.1f} GB, and their gradient as much again"
    return None


# -- one cell, in its own process -------------------------------------------------------------------------------


def run_cell(key: str, n: int, corpus: Path, out: Path, steps: int, budget: float) -> None:
    """Train ``key`` at ``n`` words until its steps are timed, measure the rest, write ``out`` and exit."""
    import resource

    import torch

    torch.set_num_threads(1)
    import sohsm.train.step as step_module
    from sohsm.cli.main import main
    from sohsm.heads import SelfOrganizingHead

    original = step_module.TrainStep.__call__
    times: list[float] = []  # CPU seconds of each step
    walls: list[float] = []
    tokens: list[int] = []
    first: list[float] = []
    skipped: list[float] = []  # steps that re-clustered

    def timed_step(self, batch, step):
        began, wall = clock(), time.perf_counter()
        if not first:
            first.extend([began, wall - START])  # CPU seconds since the process started, and wall seconds
        reclusterings = len(getattr(self.head, "history", ()))
        result = original(self, batch, step)
        if len(getattr(self.head, "history", ())) != reclusterings:  # timed on its own, after the steps
            skipped.append(clock() - began)
            return result
        times.append(clock() - began)
        walls.append(time.perf_counter() - wall)
        tokens.append(int(result.tokens))
        timed = times[2:]
        if len(timed) >= steps or (len(timed) >= 2 and sum(timed) >= budget):
            finish(self)
        return result

    def finish(train_step) -> None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        head, optimizer = train_step.head, train_step.optimizer
        forward = train_step.forward
        model = getattr(forward, "module", forward).model
        row = {"head": key, "words": n, "steps": len(times) - 2,
               "tokens_per_s": sum(tokens[2:]) / sum(times[2:]), "step_s": sum(times[2:]) / len(times[2:]),
               "wall_tokens_per_s": sum(tokens[2:]) / sum(walls[2:]), "first_step_s": first[0],
               "first_step_wall_s": first[1], "peak_rss_bytes": rss, "reclustering_steps_left_out": len(skipped)}
        if isinstance(head, SelfOrganizingHead):
            began = clock()
            head.reassign(optimizer)
            row["recluster_s"] = clock() - began
            row["update_every"] = head.update_every
        model.eval()
        head.eval()
        generator = torch.Generator().manual_seed(0)
        probs = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
        ids = torch.multinomial(probs / probs.sum(), 21 * 32, replacement=True, generator=generator).view(21, 32)
        with torch.no_grad():
            hidden, _ = model(ids[:1, :2])
            head.log_prob(hidden.reshape(-1, hidden.size(-1)))  # warm-up
            began = clock()
            hidden, _ = model(ids[:-1])
            hidden, targets = hidden.reshape(-1, hidden.size(-1)), ids[1:].reshape(-1)
            total = 0.0
            for start in range(0, hidden.size(0), 64):
                log_probs = head.log_prob(hidden[start:start + 64])
                total += float(log_probs.gather(1, targets[start:start + 64, None]).sum())
            row["eval_tokens_per_s"] = hidden.size(0) / (clock() - began)
            row["eval_mean_log_prob"] = total / hidden.size(0)
            latencies = []
            for i in range(12):
                began = clock()
                h, _ = model(ids[i:i + 1, :1])
                head.topk(h.reshape(1, -1), 10)
                latencies.append(clock() - began)
            row["top10_ms"] = 1000 * sorted(latencies[2:])[len(latencies[2:]) // 2]
        out.write_text(json.dumps(row), encoding="utf-8")
        sys.stdout.flush()
        os._exit(0)  # no evaluation, no checkpoint: the cell costs its steps

    step_module.TrainStep.__call__ = timed_step
    work = out.parent
    main(["lm", "train", "--corpus", str(corpus), *head_args(key, n), "--emb-size", "256", "--hidden-size", "256",
          "--min-count", "1", "--run-dir", str(work / "run"), "--cache-dir", str(work / "cache"), "--quiet",
          "--eval-every", "0", "--log-every", "1000", "--checkpoint-every", "0"])
    raise SystemExit(f"{key} at {n} words: the run ended before its steps were timed ({len(times)} steps)")


def run_parts(n: int, out: Path) -> None:
    """CPU seconds of each part of the self-organized head's step at ``n`` words (the head as a new tied LSTM 256
    run on the CPU builds it, its defaults for that vocabulary settled), over Zipf batches of 128 x 20 tokens: the
    LSTM forward, the head's forward, the backward of both, the gradient norm, the optimizer step (fused Adagrad, as
    ``sohsm lm train`` takes it; the head's statistics are folded in its hook). Two warm-up steps, then four."""
    import torch

    torch.set_num_threads(1)
    from sohsm.heads import build_head
    from sohsm.models.lstm_lm import LSTMLanguageModel
    from sohsm.tasks.lm import LMConfig
    from sohsm.tasks.lm.config import with_vocabulary_options
    from sohsm.train import apply_overrides
    from sohsm.train.guard import clip_gradients

    config = apply_overrides(LMConfig(), {"head.name": "self_organized", "model.emb_size": 256,
                                          "model.hidden_size": 256, "model.tie_weights": True})
    options = dict(with_vocabulary_options(config, n)[0].head.options)
    torch.manual_seed(0)
    probs = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    probs /= probs.sum()
    model = LSTMLanguageModel(n, 256, 256)
    head = build_head("self_organized", 256, n, counts=(probs * 1e8).round().clamp(min=1), **options)
    model.tie_weights(head)
    params = list({id(p): p for p in [*model.parameters(), *head.parameters()]}.values())
    optimizer = torch.optim.Adagrad(params, lr=0.1, fused=True)
    head.attach(optimizer)
    head.check_targets = False
    ids = torch.multinomial(probs, 6 * 21 * 128, replacement=True).view(6, 21, 128)
    parts = dict.fromkeys(("LSTM forward", "head forward", "backward", "gradient norm and clipping",
                           "optimizer step"), 0.0)
    for step in range(6):
        marks = [clock()]
        hidden, _ = model(ids[step, :-1])
        marks.append(clock())
        loss = head(hidden, ids[step, 1:]).loss
        marks.append(clock())
        optimizer.zero_grad()
        loss.backward()
        marks.append(clock())
        clip_gradients(params, 0.25)
        marks.append(clock())
        optimizer.step()
        marks.append(clock())
        if step >= 2:
            for key, begin, end in zip(parts, marks, marks[1:]):
                parts[key] += (end - begin) / 4
    lstm_marks = [clock()]
    for _ in range(4):
        output, _ = model.lstm(torch.randn(20, 128, 256, requires_grad=True))
        output.sum().backward()
    lstm = (clock() - lstm_marks[0]) / 4
    # the cluster layer alone, its forward product and its two backward ones: every token against every cluster
    # (the shortlist words' own and the learned ones) in d dimensions, whatever the in-cluster part costs
    hidden, cluster_weight = torch.randn(TOKENS_PER_STEP, 256), head.cluster_weight.detach()
    began = clock()
    for _ in range(4):
        grad = hidden @ cluster_weight.t()
        hidden.t() @ grad, grad @ cluster_weight
    cluster_layer = (clock() - began) / 4
    head.eval()
    with torch.no_grad():  # what a top-k or an exact evaluation pays before it scores: the vectors as one matrix
        began = clock()
        matrix = head.words.matrix(head._layout)
        widen = clock() - began
        visited = int(head.search_topk(torch.randn(1, 256), 10).clusters_visited[0])
    out.write_text(json.dumps({"words": n, "options": options, "parts": parts, "lstm_alone": lstm,
                               "clusters": head.n_clusters, "statistics_bytes": head.statistics_bytes(),
                               "widen_s": widen, "cluster_layer_s": cluster_layer,
                               "widened_bytes": matrix.numel() * matrix.element_size(),
                               "topk_clusters_visited": visited,
                               "head_parameters": sum(p.numel() for p in head.parameters())}), encoding="utf-8")


# -- the driver ---------------------------------------------------------------------------------------------------


def commit() -> str:
    """The commit the cells measure (``+`` when the working tree differs from it)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=HERE, capture_output=True,
                               text=True, check=True).stdout.strip()
        return sha + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(args) -> dict:
    """Every cell not in the results yet, one process at a time; the results after each."""
    sys.path.insert(0, str(HERE))
    from gpu import write_zipf_corpus

    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    for key in args.redo or ():
        results = {k: v for k, v in results.items() if v.get("head") != key}
    heads = [k for k, _ in HEADS if not args.head or k in args.head]
    sizes = args.words or SIZES
    base = Path(args.work or tempfile.mkdtemp(prefix="sohsm-scaling-"))
    for n in sizes:
        corpus = None
        for key in heads:
            cell = f"{key}@{n}"
            if cell in results:
                continue
            reason = not_run(key, n)
            if reason:
                results[cell] = {"head": key, "words": n, "not_run": reason}
            else:
                if corpus is None:
                    corpus = write_zipf_corpus(base / f"zipf-{n}", n, args.tokens, seed=0)
                work = base / f"cell-{key}-{n}"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                out = work / "result.json"
                command = [sys.executable, str(Path(__file__).resolve()), "--cell", key, str(n), str(corpus),
                           str(out), "--steps", str(args.steps), "--step-budget", str(args.step_budget)]
                print(f"{cell} ...", flush=True)
                began = time.perf_counter()
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                try:
                    done = subprocess.run(command, env=env, timeout=args.cell_timeout, capture_output=True, text=True)
                    error = None if out.exists() else (done.stderr.strip().splitlines() or ["no result"])[-1]
                except subprocess.TimeoutExpired:
                    error = f"not run to the end: over {args.cell_timeout} s"
                row = json.loads(out.read_text()) if out.exists() else {"head": key, "words": n, "error": error}
                row["commit"], row["cell_s"] = commit(), time.perf_counter() - began
                results[cell] = row
                shutil.rmtree(work, ignore_errors=True)
                print(f"{cell}: {row}", flush=True)
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        if corpus is not None:
            shutil.rmtree(corpus, ignore_errors=True)
    for n in (SIZES[0], SIZES[-1]) if not args.head or "self_organized" in args.head else ():
        cell = f"parts@{n}"
        if cell in results:
            continue
        out = base / f"parts-{n}.json"
        print(f"{cell} ...", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--parts", str(n), str(out)],
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=args.cell_timeout, check=False)
        if out.exists():
            results[cell] = {**json.loads(out.read_text()), "commit": commit()}
            args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return results


def words_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def at_the_largest(results: dict, n: int) -> list[str]:
    """Which head to train at ``n`` words and why, from the table: training speed first, then exact evaluation and
    top-10, and what the stream cannot say (quality: the sampled heads' on real text is large-vocab.md's)."""
    cells = {key: results.get(f"{key}@{n}") for key, _ in HEADS}
    cells = {key: c for key, c in cells.items() if c and "tokens_per_s" in c}
    if len(cells) < 2:
        return []
    order = sorted(cells, key=lambda k: -cells[k]["tokens_per_s"])
    fastest, so = order[0], cells.get("self_organized")
    lines = ["", f"At {words_label(n)} words, by this table: training tokens/s, fastest first: "
             + ", ".join(f"`{k}` {cells[k]['tokens_per_s']:,.0f}" for k in order)
             + "; exact evaluation tokens/s: "
             + ", ".join(f"`{k}` {cells[k]['eval_tokens_per_s']:,.0f}"
                         for k in sorted(cells, key=lambda k: -cells[k]["eval_tokens_per_s"]))
             + "; top-10 ms: "
             + ", ".join(f"`{k}` {cells[k]['top10_ms']:.1f}" for k in sorted(cells, key=lambda k: cells[k]["top10_ms"]))
             + "."]
    commits = sorted({c.get("commit", "-") for c in cells.values()})
    if len(commits) > 1:
        lines[-1] += (f" The cells were measured at {len(commits)} commits ({', '.join(commits)}), on different days: "
                      "CPU time, but on a machine shared with other work: a ratio between cells of different commits "
                      "carries the machine's noise as well as the heads'.")
    if so is None:
        return lines
    sampled = [k for k in ("importance_sampling", "nce") if k in cells]
    if fastest == "self_organized":
        lead = so["tokens_per_s"] / cells[order[1]]["tokens_per_s"]
        why = f"Train the self-organized head: it trains fastest here ({lead:.2f}x `{order[1]}`, the next)"
    else:
        why = (f"`{fastest}` trains {cells[fastest]['tokens_per_s'] / so['tokens_per_s']:.2f}x the self-organized "
               "head's tokens/s here")
    quality = _sampled_quality()
    lines += ["", why + ". A Zipf stream says nothing of quality"
              + (f": on real text with Llama 3's 128,256 tokens ([large-vocab.md](../results/large-vocab.md), "
                 f"{quality['budget']} training tokens) the self-organized head's test bits per byte were "
                 f"{quality['gap_pct']:+.2f}% the sampled softmax's (lower on {quality['k']} of {quality['n']} "
                 "seeds): the quality a sampled head's speed is bought with." if sampled and quality else
                 ": see [large-vocab.md](../results/large-vocab.md) for quality at 128k tokens.")]
    return lines


def _sampled_quality() -> dict | None:
    """The self-organized head against the sampled softmax on large-vocab.md's largest budget, from its JSON."""
    path = HERE.parent / "docs" / "results" / "large-vocab.json"
    if not path.exists():
        return None
    budgets = {k: v for k, v in json.loads(path.read_text()).get("llama3", {}).items() if k.startswith("tokens-")}
    for key in sorted(budgets, key=lambda k: -int(k.split("-")[1])):
        c = budgets[key].get("comparisons", {}).get("importance_sampling-untied")
        if c and c.get("n"):
            return {**c, "budget": f"{int(key.split('-')[1]):,}"}
    return None


def report(results: dict, output: Path, command: str) -> None:
    """The page (table, command, plot) from ``results`` alone."""
    from _machine import machine, write_page

    cells = [results.get(f"{key}@{n}") for n in SIZES for key, _ in HEADS]
    commits = sorted({c["commit"] for c in cells if c and "commit" in c})
    lines = ["# The whole model as the vocabulary grows", "",
             "A tied LSTM 256 language model (`sohsm lm train` defaults otherwise: batch 128 x bptt 20, Adagrad 0.1, "
             "clip 0.25) over a Zipf corpus of N words (exponent 1, every word in the vocabulary), on the CPU, one "
             "thread, one process per cell, every time the process's CPU time (the machine was shared with other "
             "work: CPU time is what a cell takes on a core of its own; the steps' wall time is in `scaling.json`). "
             "*tokens/s*: whole training steps (forward, head, backward, clipping, "
             "optimizer), after two warm-up steps, over *steps* steps (a step that re-clustered is left out: "
             "its cost is the *s/recluster* column, once per K steps); *peak RSS* once the steps are done; "
             "*first step*: CPU seconds from the command to the first step; "
             "*s/recluster*: one re-clustering of the trained head; *eval tok/s*: exact log-probabilities over all "
             "N words; *top-10 ms*: one token through the model and the head's top 10. A head whose steps take "
             "longer than the budget (30 CPU s of timed steps) is timed over two steps (the *steps* column).", "",
             "Command (resumable; each cell's numbers are kept in `scaling.json` as it ends):", "", "```bash",
             command, "```", "",
             f"Machine: {machine(threads=False)}; measured at commit(s) {', '.join(commits) or '-'}; "
             f"{datetime.date.today().isoformat()}.", "",
             "The heads:", ""]
    lines += [f"- `{key}`: {text}" for key, text in HEADS]
    lines += ["", "| N | head | tokens/s | steps | peak RSS | first step | s/recluster | eval tok/s | top-10 ms |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in SIZES:
        for key, _ in HEADS:
            c = results.get(f"{key}@{n}")
            if c is None:
                lines.append(f"| {words_label(n)} | `{key}` | not measured yet | | | | | | |")
            elif "not_run" in c or "error" in c:
                lines.append(f"| {words_label(n)} | `{key}` | {c.get('not_run') or c.get('error')} | | | | | | |")
            else:
                recluster = f"{c['recluster_s']:.2f}" if "recluster_s" in c else "-"
                lines.append(f"| {words_label(n)} | `{key}` | {c['tokens_per_s']:,.0f} | {c['steps']} | "
                             f"{c['peak_rss_bytes'] / 1e9:.2f} GB | {c['first_step_s']:.1f} s | {recluster} | "
                             f"{c['eval_tokens_per_s']:,.0f} | {c['top10_ms']:.1f} |")
    so = {n: results.get(f"self_organized@{n}") for n in SIZES}
    lines += ["", "The self-organized head against the fastest adaptive softmax at each size, and against itself at "
              "10k words:", "", "| N | self-organized tokens/s | best adaptive (cutoffs) | lead | vs its own at 10k |",
              "|---:|---:|---|---:|---:|"]
    base = so[SIZES[0]]
    for n in SIZES:
        s = so[n]
        adaptive = [results.get(f"{k}@{n}") for k in ("adaptive", "adaptive_tuned", "adaptive_fairseq")]
        adaptive = [a for a in adaptive if a and "tokens_per_s" in a]
        if not s or "tokens_per_s" not in s or not adaptive:
            continue
        best = max(adaptive, key=lambda a: a["tokens_per_s"])
        own = f"{s['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base and "tokens_per_s" in base else "-"
        lines.append(f"| {words_label(n)} | {s['tokens_per_s']:,.0f} | {best['tokens_per_s']:,.0f} "
                     f"(`{best['head']}`) | {s['tokens_per_s'] / best['tokens_per_s']:.1f}x | {own} |")
    lines += at_the_largest(results, SIZES[-1])
    lines += targets(results)
    lines += why_adaptive_is_slow(SIZES[-1])
    parts = [results.get(f"parts@{n}") for n in (SIZES[0], SIZES[-1])]
    if all(parts):
        lines += ["", "Where the self-organized step's time goes (CPU seconds a step, 2,560 tokens; the head as a new "
                  "tied LSTM 256 run on the CPU builds it; `python benchmarks/scaling.py` measures it beside the "
                  "table):", "", "| part | " + " | ".join(f"{words_label(p['words'])} words" for p in parts) + " |",
                  "|---|" + "---:|" * len(parts)]
        for key in parts[0]["parts"]:
            lines.append(f"| {key} | " + " | ".join(f"{p['parts'][key]:.3f}" for p in parts) + " |")
        lines.append("| **step** | " + " | ".join(f"**{sum(p['parts'].values()):.3f}**" for p in parts) + " |")
        lines.append("| the LSTM's forward and backward alone | "
                     + " | ".join(f"{p['lstm_alone']:.3f}" for p in parts) + " |")
        lines.append("| head options settled for the vocabulary | "
                     + " | ".join(", ".join(f"{k}={v}" for k, v in p["options"].items()) or "-" for p in parts)
                     + " |")
        lines.append("| clusters (shortlist words' own and learned) | "
                     + " | ".join(f"{p['clusters']:,}" for p in parts) + " |")
        lines.append("| the head's parameters (tied: the embedding too) | "
                     + " | ".join(f"{p['head_parameters'] / 1e6:.1f}M" for p in parts) + " |")
        lines.append("| statistics q | "
                     + " | ".join(f"{p['statistics_bytes'] / 2**20:,.0f} MiB" for p in parts) + " |")
        small, large = parts
        grown = {key: large["parts"][key] - small["parts"][key] for key in small["parts"]}
        total = sum(grown.values())
        lines += [] if total <= 0 else ["", f"Of the {total:.3f} s a step gains from {words_label(small['words'])} to "
                  f"{words_label(large['words'])} words, "
                  + ", ".join(f"{key} {value:.3f} s ({value / total:.0%})" for key, value in grown.items())
                  + f". The LSTM alone takes about the same at both sizes ({small['lstm_alone']:.3f} and "
                  f"{large['lstm_alone']:.3f} s): what grows is the head's forward and backward. Every token scores "
                  f"all {large['clusters']:,} clusters (the shortlist words' own and the learned ones) in d "
                  f"dimensions against {small['clusters']:,} at {words_label(small['words'])}, and the in-cluster "
                  "scores take one product per (cluster, band) the batch holds, forward, and two backward: at a "
                  "large vocabulary most clusters a batch holds have a row or two, so those calls cost more than "
                  "their arithmetic. The optimizer's update of the tied word vectors is not what grows: in bands "
                  f"(`div_value=4`) the head holds {large['head_parameters'] / 1e6:.0f}M numbers at "
                  f"{words_label(large['words'])} words, not N x d = {large['words'] * 256 / 1e6:.0f}M."]
        if "cluster_layer_s" in large:
            floor = large["lstm_alone"] + large["cluster_layer_s"]
            lines += ["", f"A floor: the LSTM alone and the cluster layer's three products alone (every token against "
                      f"all {large['clusters']:,} clusters, forward and backward: {large['cluster_layer_s']:.3f} s) "
                      f"take {floor:.3f} s a step at {words_label(large['words'])} words, "
                      f"{sum(small['parts'].values()) / floor:.2f}x the whole step's rate at "
                      f"{words_label(small['words'])}, before any in-cluster score, statistics or update. The 0.7x "
                      f"target allows a step of {sum(small['parts'].values()) / 0.7:.3f} s there: these two alone take "
                      f"{floor / (sum(small['parts'].values()) / 0.7):.0%} of it (the shortlist's words are scored as "
                      "clusters of their own: half of the clusters at a million words)."]
        if "widen_s" in large:
            lines += ["", "The self-organized head's *eval tok/s* and *top-10 ms* fall with N for two reasons, both "
                      "measured here: its banded word vectors are widened into one matrix before they are scored "
                      f"(`words.matrix`: {large['widened_bytes'] / 1e9:.2f} GB and {large['widen_s']:.2f} CPU s at "
                      f"{words_label(large['words'])} words, at every call), and a head after a few steps has a flat "
                      "cluster distribution, so the exact best-first search visits "
                      f"{large['topk_clusters_visited']:,} of its {large['clusters']:,} clusters for one token (a "
                      "trained head visits a few). Neither is a training cost."]
    lines += ["", "![tokens/s against N](scaling.png)", ""]
    plot(results, output.with_suffix(".png"))
    write_page(output, lines)


def targets(results: dict) -> list[str]:
    """The targets of the self-organized default at a million words, each against what was measured."""
    small, large = results.get(f"self_organized@{SIZES[0]}", {}), results.get(f"self_organized@{SIZES[-1]}", {})
    if "tokens_per_s" not in small or "tokens_per_s" not in large:
        return []
    adaptive = [results.get(f"{k}@{SIZES[-1]}", {}) for k in ("adaptive", "adaptive_tuned", "adaptive_fairseq")]
    adaptive = [a for a in adaptive if "tokens_per_s" in a]
    rows = [("tokens/s at 1M against its own at 10k", large["tokens_per_s"] / small["tokens_per_s"], 0.7, ">=", "x"),
            ("peak RSS at 1M (GB)", large["peak_rss_bytes"] / 1e9, 3.0, "<", ""),
            ("one re-clustering at 1M (CPU s)", large.get("recluster_s", float("nan")), 5.0, "<", "")]
    if adaptive:
        best = max(adaptive, key=lambda a: a["tokens_per_s"])
        rows.append((f"lead over the fastest adaptive softmax at 1M (`{best['head']}`)",
                     large["tokens_per_s"] / best["tokens_per_s"], 5.0, ">=", "x"))
    lines = ["", "The targets of the self-organized default at a million words (issue 66):", "",
             "| target | measured | wanted | |", "|---|---:|---:|---|"]
    for what, value, wanted, sense, unit in rows:
        met = value >= wanted if sense == ">=" else value < wanted
        lines.append(f"| {what} | {value:.2f}{unit} | {sense} {wanted:g}{unit} | {'met' if met else 'missed'} |")
    return lines


def why_adaptive_is_slow(n: int) -> list[str]:
    """What each adaptive softmax scores per token at ``n`` words, from its cutoffs (torch's head and tails)."""
    from sohsm.heads.adaptive import default_cutoffs

    forms = [("adaptive", default_cutoffs(n), 4), ("adaptive_tuned", [round(0.1 * n), round(0.4 * n)], 2),
             ("adaptive_fairseq", [c for c in (4000, 40_000, 200_000) if c < n], 4)]
    lines = ["", f"Why adaptive softmax is slow at {words_label(n)} words: every token scores its whole head (the "
             "shortlist and one entry per tail cluster) in d dimensions, and each token of a tail scores every word "
             "of that tail. The head is what the cutoffs trade: a small head leaves a huge last tail, which its "
             "tokens score in full; a large head is a large softmax for every token:", ""]
    for key, cutoffs, div in forms:
        edges = [*cutoffs, n]
        tails = ", ".join(f"{stop - start:,} words at d/{div ** (i + 1)}"
                          for i, (start, stop) in enumerate(zip(edges, edges[1:])))
        lines.append(f"- `{key}`: a head of {cutoffs[0] + len(cutoffs):,} entries at d; tails of {tails}")
    lines.append("")
    lines.append(f"The self-organized head scores ceil(sqrt(N)) clusters and its shortlist's "
                 f"{math.ceil(math.sqrt(n)):,} words in d dimensions, then only the words of the target's cluster "
                 "(at most 1.5 sqrt(N)).")
    return lines


def plot(results: dict, path: Path) -> None:
    """tokens/s against N, log-log, one line per head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for key, _ in HEADS:
        points = [(n, results[f"{key}@{n}"]["tokens_per_s"]) for n in SIZES
                  if "tokens_per_s" in results.get(f"{key}@{n}", {})]
        if points:
            axes.plot(*zip(*points), marker="o", label=key)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("vocabulary N (words)")
    axes.set_ylabel("training tokens/s (one thread)")
    axes.set_title("Tied LSTM 256, whole training step")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", action="append", help="only this head (repeatable; default: all)")
    parser.add_argument("--words", type=int, action="append", help="only this N (repeatable; default: all)")
    parser.add_argument("--redo", action="append", help="measure this head's cells again (repeatable)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps of a cell at most (default: 6)")
    parser.add_argument("--step-budget", type=float, default=30.0,
                        help="CPU seconds of timed steps of a cell at most, two steps at least (default: 30)")
    parser.add_argument("--tokens", type=int, default=100_000,
                        help="training tokens of each Zipf corpus, besides every word once (default: 100000)")
    parser.add_argument("--cell-timeout", type=int, default=900, help="seconds a cell may take (default: 900)")
    parser.add_argument("--work", type=Path, help="where corpora and runs go (default: a temporary folder)")
    parser.add_argument("--results", type=Path, default=DOCS / "scaling.json", help="the cells' results (JSON)")
    parser.add_argument("--output", type=Path, default=DOCS / "scaling.md", help="the page (the plot beside it)")
    parser.add_argument("--report", action="store_true", help="only write the page and plot from the results")
    parser.add_argument("--cell", nargs=4, metavar=("HEAD", "N", "CORPUS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs=2, metavar=("N", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parts:
        run_parts(int(args.parts[0]), Path(args.parts[1]))
        return 0
    if args.cell:
        key, n, corpus, out = args.cell
        run_cell(key, int(n), Path(corpus), Path(out), args.steps, args.step_budget)
        return 0
    sys.path.insert(0, str(HERE))
    results = json.loads(args.results.read_text()) if args.report and args.results.exists() else None
    if results is None:
        results = measure(args)
    report(results, args.output, "OMP_NUM_THREADS=1 python benchmarks/scaling.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
