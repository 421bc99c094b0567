"""Inference against the full softmax: exact ``log_prob``, top-10, beam steps and generation, on a trained head.

For each vocabulary size N, a tied LSTM 256 language model with the default ``self_organized`` head (the defaults a
new ``sohsm lm train`` run takes there: ``div_value=4`` from 20,000 words, ``q_clusters=16`` on the CPU from about
190,000) is trained for ``--steps`` steps (batch 64 x bptt 20, Adagrad 0.1, clip 0.25, a re-clustering every
``--update-every`` steps) over a Zipf stream of its N words (exponent 1, word 0 the most frequent), so the head is a
*trained* one, not a young one. A ``full`` softmax of the same size, tied to an LSTM of its own, is measured beside
it in the same process (its speed does not depend on its weights, so it is not trained). Then, one thread, eval mode,
no autograd, each time the process's CPU time (the machine may be shared):

* **log_prob 32**: ``head.log_prob`` of 32 hidden states of the trained LSTM (median of ``--repeats``);
* **top-10**: ``head.topk(h, 10)`` of one state, the median over ``--repeats`` states;
* **beam step**: ``head.topk`` of 5 states, ``k = 6`` (one step of a beam of 5, ``s2s decode``'s default);
* **eval tok/s**: exact evaluation by ``log_prob`` over all N words, 64 rows at a time;
* **generate tok/s**: ``sohsm.models.generate`` from the trained LSTM, greedy (``head.predict``) and sampled
  (``softmax(log_prob)``), ``--gen-tokens`` words each.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/inference.py                       # 33k and 256k
    OMP_NUM_THREADS=1 python benchmarks/inference.py --sizes 33000 256000 1000000
    python benchmarks/inference.py --report --baseline docs/benchmarks/inference-before.json   # the page again

Writes ``docs/benchmarks/inference.md`` and ``inference.json``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _machine import command_line, machine, write_page  # noqa: E402
from sohsm.clustering import default_n_clusters  # noqa: E402
from sohsm.heads import build_head  # noqa: E402
from sohsm.models.generation import generate  # noqa: E402
from sohsm.models.lstm_lm import LSTMLanguageModel  # noqa: E402

DOCS = HERE.parent / "docs" / "benchmarks"
clock = time.process_time
D = 256


def commit() -> str:
    """The commit measured (``+`` when ``src`` differs from it)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=HERE.parent, capture_output=True,
                               text=True, check=True).stdout.strip()
        return sha + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def zipf_stream(n: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(stream [tokens], counts [N])``: i.i.d. Zipf words (exponent 1), each word's expected count at least 1."""
    probs = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    probs /= probs.sum()
    stream = torch.multinomial(probs.float(), tokens, replacement=True, generator=torch.Generator().manual_seed(seed))
    counts = (probs * max(tokens, 50 * n)).clamp(min=1.0)
    return stream, counts


def median_time(fn, repeats: int) -> float:
    """Median CPU seconds of ``fn(i)`` over ``repeats`` calls, after one warm-up."""
    fn(0)
    times = []
    for i in range(repeats):
        start = clock()
        fn(i)
        times.append(clock() - start)
    return statistics.median(times)


def train(model, head, stream: torch.Tensor, steps: int, batch: int = 64, bptt: int = 20) -> float:
    """``steps`` steps of LSTM language-model training over ``stream``; returns their CPU seconds."""
    params = list({id(p): p for p in [*model.parameters(), *head.parameters()]}.values())
    optimizer = torch.optim.Adagrad(params, lr=0.1)
    if hasattr(head, "attach"):
        head.attach(optimizer)
    data = stream[: (stream.numel() // batch) * batch].view(batch, -1).t()  # [T, B]
    start, state, t = clock(), None, 0
    model.train(), head.train()
    for _ in range(steps):
        if t + bptt + 1 > data.size(0):
            t, state = 0, None
        inputs, targets = data[t : t + bptt], data[t + 1 : t + bptt + 1]
        t += bptt
        hidden, state = model(inputs, state)
        state = tuple(s.detach() for s in state)
        loss = head(hidden.reshape(-1, D), targets.reshape(-1)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()
    return clock() - start


def measure(head, model, states: torch.Tensor, eval_states: torch.Tensor, repeats: int, gen_tokens: int) -> dict:
    """The timings of one head (see the module docstring)."""
    head.eval(), model.eval()
    row: dict = {}
    with torch.no_grad():
        batch = states[:32]
        row["log_prob_32_ms"] = 1e3 * median_time(lambda i: head.log_prob(batch), repeats)
        row["top10_ms"] = 1e3 * median_time(lambda i: head.topk(states[i % states.size(0)][None], 10), repeats)
        row["beam5_ms"] = 1e3 * median_time(lambda i: head.topk(states[(5 * i) % 60 : (5 * i) % 60 + 5], 6), repeats)
        if hasattr(head, "search_topk"):
            row["clusters_visited"] = float(head.search_topk(states, 10).clusters_visited.double().mean())
            row["clusters"] = int(head.n_clusters)
        start = clock()
        for lo in range(0, eval_states.size(0), 64):
            head.log_prob(eval_states[lo : lo + 64])
        row["eval_tok_s"] = eval_states.size(0) / (clock() - start)
    prompt = torch.tensor([1, 2, 3])
    for mode, greedy in (("greedy", True), ("sampled", False)):
        generate(model, head, prompt, 2, greedy=greedy)  # warm-up
        start = clock()
        generate(model, head, prompt, gen_tokens, greedy=greedy, generator=torch.Generator().manual_seed(0))
        row[f"generate_{mode}_tok_s"] = gen_tokens / (clock() - start)
    return row


def run_size(n: int, args) -> dict:
    torch.manual_seed(0)
    stream, counts = zipf_stream(n, args.steps * 64 * 20 + 64 * 21 + 2000, seed=n)
    options = {"div_value": 4} if n >= 20_000 else {}
    if n * default_n_clusters(n) * 4 > 256 * 2**20:  # the dense statistics q over 256 MiB: compact on the CPU
        options["q_clusters"] = 16
    so = build_head("self_organized", D, n, counts=counts, update_every=args.update_every, **options)
    so_model = LSTMLanguageModel(n, D, D)
    so_model.tie_weights(so)
    seconds = train(so_model, so, stream, args.steps)
    print(f"N={n:,}: self_organized {options} trained {args.steps} steps in {seconds:.1f} s CPU", flush=True)
    held_out = stream[-2000:]
    so_model.eval()
    with torch.no_grad():
        hidden, _ = so_model(held_out[:, None])
    hidden = hidden[:, 0]  # [2000, d]
    states, eval_states = hidden[:64].contiguous(), hidden[64 : 64 + args.eval_tokens].contiguous()
    result = {"n": n, "options": options, "train_cpu_s": seconds, "steps": args.steps}
    result["self_organized"] = measure(so, so_model, states, eval_states, args.repeats, args.gen_tokens)
    print(f"  self_organized: {result['self_organized']}", flush=True)
    del so_model, so
    full = build_head("full", D, n)
    full_model = LSTMLanguageModel(n, D, D)
    full_model.tie_weights(full)
    result["full"] = measure(full, full_model, states, eval_states, args.repeats, args.gen_tokens)
    print(f"  full: {result['full']}", flush=True)
    return result


def words_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{round(n / 1000)}k"


def targets(results: list[dict]) -> list[str]:
    """Issue 71's targets, each met or missed by the numbers above."""
    by_n = {r["n"]: r for r in results}
    lines = []

    def ratio(r, key):
        return r["self_organized"][key] / r["full"][key]

    for n, key, bound, what in ((33_000, "log_prob_32_ms", 1.0, "log_prob"),
                                (256_000, "log_prob_32_ms", 1.0, "log_prob"),
                                (33_000, "top10_ms", 1.0, "top-10"), (256_000, "top10_ms", 0.5, "top-10")):
        if n in by_n:
            value = ratio(by_n[n], key)
            lines.append(f"- {what} at {words_label(n)} <= {bound:.1f}x full: {value:.2f}x, "
                         f"{'met' if value <= bound else 'missed'}")
    if 1_000_000 in by_n:
        so = by_n[1_000_000]["self_organized"]
        lines.append(f"- top-10 at 1M under 50 ms: {so['top10_ms']:.1f} ms, "
                     f"{'met' if so['top10_ms'] < 50 else 'missed'}")
        lines.append(f"- exact evaluation at 1M >= 100 tokens/s: {so['eval_tok_s']:,.0f}, "
                     f"{'met' if so['eval_tok_s'] >= 100 else 'missed'}")
    for r in results:
        for key, what in (("generate_greedy_tok_s", "greedy generation"),
                          ("generate_sampled_tok_s", "sampled generation"), ("beam5_ms", "beam step")):
            value = ratio(r, key)
            met = value <= 1.0 if key == "beam5_ms" else value >= 1.0
            lines.append(f"- {what} at {words_label(r['n'])} at least the full softmax's speed: {value:.2f}x "
                         f"{'time' if key == 'beam5_ms' else 'tokens/s'}, {'met' if met else 'missed'}")
    return lines


def _at_a_million(results: list[dict]) -> list[str]:
    """What exact evaluation at 1M words costs, from this run (none where 1M was not measured)."""
    row = next((r for r in results if r["n"] == 1_000_000), None)
    if row is None:
        return []
    so, full = row["self_organized"]["eval_tok_s"], row["full"]["eval_tok_s"]
    return [f"- Exact evaluation at 1M: {so:,.0f} tokens/s against the full softmax's {full:,.0f}. 64 rows of "
            "`log_prob` are the bands' products, a seventh of the full softmax's multiply-adds (36M against 256M a "
            "row), and the passes over the `64 x 1M` scores (the row maximum, `exp`, the cluster sums, the shift, the "
            "gather into word order), each a pass over 256 MB where the full softmax's `log_softmax` fuses its own "
            "into about three: those passes are most of the time. Scoring a run of whole clusters at a time, so "
            "that the passes stay in cache, was tried and measured slower (the scattered writes into word order "
            "cost more than the passes saved). v0.5.0 measured 64 against 40 tokens/s on a busier machine: the "
            "load moves both, and the ratio is the figure to compare. `lm eval` does not use this path (it scores "
            "each target through its own cluster, as training does)."]


def report(results: list[dict], args, sha: str, baseline: dict | None, command: str, day: str) -> list[str]:
    """The page's lines."""
    lines = [
        "# Inference against the full softmax, on a trained head",
        "",
        "Exact `log_prob` over all N words, top-10, a beam step and generation of the default `self_organized` head "
        f"(trained {args.steps} steps: a tied LSTM {D} over a Zipf stream, see the script's docstring) against a "
        f"`full` softmax of the same size, d {D}, one thread, eval mode, no autograd. Every time is the process's CPU "
        "time (the machine was shared with other work); the ratio is self_organized / full, measured side by side in "
        "one process. `generate` is `sohsm.models.generate` with the trained LSTM (greedy: `head.predict`; sampled: "
        "`softmax(log_prob)`).",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Machine: {machine()}; commit {sha}; {day}.",
        "",
        "| N | measure | self_organized | full | ratio |",
        "|---:|---|---:|---:|---:|",
    ]
    measures = (("log_prob_32_ms", "log_prob of 32 states (ms)", False),
                ("top10_ms", "top-10 of one state (ms)", False),
                ("beam5_ms", "beam step: top-6 of 5 states (ms)", False),
                ("eval_tok_s", "exact eval by log_prob (tokens/s)", True),
                ("generate_greedy_tok_s", "generate, greedy (tokens/s)", True),
                ("generate_sampled_tok_s", "generate, sampled (tokens/s)", True))
    before = {r["n"]: r for r in (baseline or {}).get("results", [])}
    if before:
        lines[-2:] = ["| N | measure | self_organized | full | ratio | before: self_organized | before: ratio |",
                      "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for key, label, rate in measures:
            mine, theirs = r["self_organized"][key], r["full"][key]
            fmt = "{:,.0f}" if rate else "{:.2f}"
            ratio = mine / theirs
            line = (f"| {words_label(r['n'])} | {label} | {fmt.format(mine)} | {fmt.format(theirs)} | "
                    f"{ratio:.2f}x{' (faster)' if (ratio > 1) == rate and ratio != 1 else ''} |")
            if before:
                old = before.get(r["n"])
                line += (f" {fmt.format(old['self_organized'][key])} | "
                         f"{old['self_organized'][key] / old['full'][key]:.2f}x |" if old else " - | - |")
            lines.append(line)
    lines += ["", "Clusters the exact top-10 search scored per state (the rest of a state's words were bounded by its "
              "cluster's probability):", ""]
    for r in results:
        so = r["self_organized"]
        lines.append(f"- {words_label(r['n'])}: {so['clusters_visited']:.1f} of {so['clusters']:,} clusters "
                     f"(head options {r['options']}, trained {r['steps']} steps in {r['train_cpu_s']:.0f} s CPU)")
    if before:
        lines += ["", f"*before*: the same script over the code of commit {baseline['commit']} (the starting point of "
                  "this work, `inference-before.json`), on the same machine the same day; its full softmax was "
                  "measured beside it in its own process. (The issue's own starting table, 2.03x and 3.39x for "
                  "`log_prob`, 4.63x and 1.42x for top-10, was measured on another day's load and another head's "
                  "training; the direction is the same.)"]
    lines += ["", "## Targets", "", *targets(results), "", "## How", "",
              "- `log_prob` scores each band's weight where it is stored, into its own columns of one `B x N` buffer "
              "(no `N x (d + d/div + ...)` widening per call: 1.34 GB at 1M words before), sums each cluster by one "
              "`index_add` below the row's best score (a cluster too far below it is normalised again with its own "
              "maximum), shifts in place and gathers into word order: two `B x N` buffers a call. What it keeps "
              "between calls is derived from the cluster layout alone (the cluster of each row, the row of each word: "
              "three `N`-long index vectors, 24 bytes a word, 24 MB at 1M), derived again with every new layout; "
              "no copy of the weights, so nothing goes stale when they train.",
              "- `topk` searches the clusters best first, each band scored in place, in rounds of 1, 2, 4, ... "
              "clusters a row; a row whose clusters still open hold over a quarter of the words is finished by the "
              "dense path (`log_prob` of that row) instead. `predict` is `topk(h, 1)`; `sample` (what `generate` "
              "draws at temperature 1) draws a cluster, then a word of it.",
              "- The heads trained here are still young in one sense: their cluster distributions are flat, so the "
              "search went dense for nearly every state (clusters visited above): top-10's lead at 256k and 1M comes "
              "from the bands' cheaper products, not from the bound. A head whose clusters are sharper searches a "
              "few clusters.",
              *_at_a_million(results),
              "- Not measured here: the head without bands (`div_value=null`, the default under 20,000 words, in a "
              "transformer or untied), whose products cost what the full softmax's do, so that its `log_prob` and "
              "dense top-k carry the extra passes over `B x N` (the cluster sums, the gather into word order) above "
              "the full softmax's time."]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[33_000, 256_000])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--update-every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--eval-tokens", type=int, default=640)
    parser.add_argument("--gen-tokens", type=int, default=50)
    parser.add_argument("--output", type=Path, default=DOCS / "inference.md")
    parser.add_argument("--baseline", type=Path, help="this script's JSON from an earlier commit: shown as 'before'")
    parser.add_argument("--report", action="store_true", help="write the page again from the kept JSON alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sha = commit()
    if args.report:  # the page again from the kept results
        kept = json.loads(args.output.with_suffix(".json").read_text())
        results, sha, command, day = kept["results"], kept["commit"], kept["command"], kept["date"]
    else:
        command = f"OMP_NUM_THREADS=1 python benchmarks/inference.py {command_line(sys.argv[1:])}".rstrip()
        day = datetime.date.today().isoformat()
        results = [run_size(n, args) for n in args.sizes]
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    lines = report(results, args, sha, baseline, command, day)
    print("\n".join(lines))
    write_page(args.output, lines)
    if not args.report:
        args.output.with_suffix(".json").write_text(json.dumps(
            {"commit": sha, "command": command, "date": day, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
