"""A pretrained model keeps what it learned: a two-level head in place of its trained ``lm_head`` (issue 72).

For each seed: a small untied ``LlamaForCausalLM`` is pretrained here with its full head on PTB (the project's
byte-level BPE of ``--vocab`` tokens trained on PTB's training split), then

* **converted**: ``sohsm.hf.use_head(model, HEAD, counts=PTB counts, data=PTB training batches)`` for each two-level
  head, and for the naive baseline the same head with ``keep_weights=False`` (its own initialisation, what
  ``use_head`` gave every two-level head before). PTB test perplexity (per BPE token) of each against the full
  head's, and the conversion's wall time (clustering and fit included, one thread);
* **fine-tuned** on a domain shift, WikiText-2's training split read with PTB's tokenizer, for ``--steps`` steps
  (AdamW, the same batches in the same order for every model), the converted ``self_organized`` head (re-clustering
  as in training: ``head.attach(optimizer)``) against the original full head; WikiText-2 test perplexity of both
  after it (the first ``--eval-tokens`` of the test split) and their training tokens/s.

Perplexities are ``exp`` of the mean NLL per BPE token over windows of ``--context`` tokens (every token of a
window but the first scored). The machine was shared with other work: times are one thread's on a busy machine.

Usage::

    python benchmarks/pretrained.py --seeds 1,2,3      # writes docs/results/pretrained.md and pretrained.json
    python benchmarks/pretrained.py --rewrite          # the page again from pretrained.json
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
OUT_MD = ROOT / "docs" / "results" / "pretrained.md"
OUT_JSON = ROOT / "docs" / "results" / "pretrained.json"
HEADS = ("self_organized", "two_level_frequency", "two_level_random")
#: the self-organized head converted in other forms, each against the default conversion: what its cluster bias
#: does (without it, a cluster is scored by its vector alone), and what twice the clusters do (``C`` and the
#: shortlist each ``2 ceil(sqrt(N))`` in place of ``ceil(sqrt(N))``: smaller clusters, each one's log-sum-exp
#: nearer a linear function of ``h``)
VARIANTS = {
    "no cluster bias": {"cluster_bias": False},
    "twice the clusters": {"n_clusters": "2sqrt", "shortlist": "2sqrt"},
}


def corpora(vocab: int):
    """PTB with its BPE, and WikiText-2's splits read with the same tokenizer, in PTB's ids."""
    from sohsm.data.loading import load_corpus

    ptb = load_corpus("ptb", tokenizer=f"bpe:{vocab}")
    wiki = load_corpus("wikitext-2", tokenizer=ptb.tokenizer)
    to_ptb = torch.tensor([ptb.vocab.stoi[w] for w in wiki.vocab.itos])
    return ptb, {"train": to_ptb[wiki.train], "test": to_ptb[wiki.test]}


def windows(ids: torch.Tensor, context: int) -> torch.Tensor:
    """``[n, context]`` consecutive disjoint windows of ``ids``."""
    n = ids.numel() // context
    return ids[: n * context].view(n, context)


def build(vocab: int, width: int, layers: int, context: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=context,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config)


def train(model, rows: torch.Tensor, steps: int, batch: int, lr: float, seed: int, head=None,
          warmup: int = 0) -> float:
    """``steps`` AdamW steps on random windows (seeded: the same batches for every model); returns tokens/s."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    if head is not None and hasattr(head, "attach"):
        head.attach(optimizer)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(warmup, 1)) * (
        0.5 * (1 + math.cos(math.pi * s / steps)) if warmup else 1.0))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    started = time.perf_counter()
    for _ in range(steps):
        ids = rows[torch.randint(0, rows.size(0), (batch,), generator=generator)]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
    return steps * rows.size(1) * batch / (time.perf_counter() - started)


@torch.no_grad()
def perplexity(model, rows: torch.Tensor, batch: int = 64) -> float:
    """``exp`` mean NLL per token (each window's first token unscored); the logits of a sohsm head are its
    log-probabilities, a full head's are normalised here."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, rows.size(0), batch):
        ids = rows[start:start + batch]
        log_probs = F.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
        total -= float(log_probs.gather(2, ids[:, 1:, None]).sum())
        count += ids[:, 1:].numel()
    return math.exp(total / count)


def convert(model, name: str, counts, data, fit_seconds: float, keep: bool, options: dict | None = None):
    import sohsm.hf

    n = int(counts.numel())
    options = {k: 2 * math.ceil(math.sqrt(n)) if v == "2sqrt" else v for k, v in (options or {}).items()}
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = sohsm.hf.use_head(model, name, counts=counts, data=data if keep else None, keep_weights=keep,
                                 fit_seconds=fit_seconds, progress=False, **options)
    seconds = time.perf_counter() - started
    report = model.get_output_embeddings().fit_report
    return head, seconds, report


def run_seed(args, seed: int, ptb, wiki) -> dict:
    import copy

    counts = torch.as_tensor(ptb.vocab.counts, dtype=torch.long)
    ptb_train, ptb_test = windows(ptb.train, args.context), windows(ptb.test, args.context)
    wiki_train = windows(wiki["train"], args.context)
    wiki_test = windows(wiki["test"][: args.eval_tokens], args.context)
    model = build(len(ptb.vocab), args.width, args.layers, args.context, seed)
    saved = None if args.models is None else Path(args.models) / (
        f"llama-{args.layers}x{args.width}-bpe{args.vocab}-{args.pretrain_steps}steps-seed{seed}.pt")
    if saved is not None and saved.is_file():  # pretrained before with these settings: read back
        kept = torch.load(saved)
        model.load_state_dict(kept["state"])
        pretrain_seconds, pretrain_tps = kept["seconds"], kept["tokens_per_s"]
    else:
        started = time.perf_counter()
        pretrain_tps = train(model, ptb_train, args.pretrain_steps, args.batch, args.lr, seed, warmup=50)
        pretrain_seconds = time.perf_counter() - started
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"state": model.state_dict(), "seconds": pretrain_seconds, "tokens_per_s": pretrain_tps}, saved)
    result = {"seed": seed, "pretrain_seconds": pretrain_seconds, "pretrain_tokens_per_s": pretrain_tps,
              "full": {"ptb_test_ppl": perplexity(model, ptb_test)}}
    print(f"seed {seed}: pretrained in {result['pretrain_seconds']:.0f} s, PTB test ppl "
          f"{result['full']['ptb_test_ppl']:.2f}", flush=True)
    generator = torch.Generator().manual_seed(seed + 1000)
    fit_rows = ptb_train[torch.randperm(ptb_train.size(0), generator=generator)[: args.fit_rows]]
    fit_data = list(fit_rows.split(8))
    converted = {}
    for name in args.heads:
        for keep in (True, False):
            copy_ = copy.deepcopy(model)
            head, seconds, report = convert(copy_, name, counts, fit_data, args.fit_seconds, keep)
            entry = {"ptb_test_ppl": perplexity(copy_, ptb_test), "convert_seconds": seconds}
            if report is not None:
                entry.update(fit_kl=report.kl, fit_kl_start=report.kl_start, fit_steps=report.steps)
            result[f"{name}{'' if keep else '-naive'}"] = entry
            print(f"  {name}{'' if keep else ' (naive)'}: PTB test ppl {entry['ptb_test_ppl']:.2f} "
                  f"({entry['ptb_test_ppl'] / result['full']['ptb_test_ppl']:.4f}x) in {seconds:.1f} s", flush=True)
            if keep and name == "self_organized":
                converted = (copy_, head)
    for variant, options in VARIANTS.items():
        copy_ = copy.deepcopy(model)
        _, seconds, report = convert(copy_, "self_organized", counts, fit_data, args.fit_seconds, True, options)
        entry = {"ptb_test_ppl": perplexity(copy_, ptb_test), "convert_seconds": seconds, "fit_kl": report.kl}
        result[f"self_organized:{variant}"] = entry
        print(f"  self_organized, {variant}: PTB test ppl {entry['ptb_test_ppl']:.2f} "
              f"({entry['ptb_test_ppl'] / result['full']['ptb_test_ppl']:.4f}x)", flush=True)
    # the converted head fine-tuned without re-clustering: what its re-clusterings cost or give in fine-tuning
    still_model = copy.deepcopy(model)
    still_head, _, _ = convert(still_model, "self_organized", counts, fit_data, args.fit_seconds, True,
                               {"update_every": 0})
    still = (still_model, still_head)
    # fine-tuning on the domain shift, the same batches for every model
    result["full"]["wiki_test_ppl_before"] = perplexity(model, wiki_test)
    result["full"]["finetune_tokens_per_s"] = train(model, wiki_train, args.steps, args.batch, args.finetune_lr,
                                                    seed + 1)
    result["full"]["wiki_test_ppl"] = perplexity(model, wiki_test)
    so_model, so_head = converted
    entry = result["self_organized"]
    entry["wiki_test_ppl_before"] = perplexity(so_model, wiki_test)
    entry["finetune_tokens_per_s"] = train(so_model, wiki_train, args.steps, args.batch, args.finetune_lr, seed + 1,
                                           head=so_head)
    entry["wiki_test_ppl"] = perplexity(so_model, wiki_test)
    entry["reclusterings"] = len(getattr(so_head, "history", []))
    entry["moved_words"] = [round(r["change_rate"], 4) for r in getattr(so_head, "history", [])]
    still_model, still_head = still
    train(still_model, wiki_train, args.steps, args.batch, args.finetune_lr, seed + 1, head=still_head)
    result["self_organized:no re-clustering"] = {"wiki_test_ppl": perplexity(still_model, wiki_test)}
    print(f"  fine-tuned {args.steps} steps on WikiText-2: full {result['full']['wiki_test_ppl']:.2f} "
          f"({result['full']['finetune_tokens_per_s']:.0f} tok/s), self_organized {entry['wiki_test_ppl']:.2f} "
          f"({entry['finetune_tokens_per_s']:.0f} tok/s)", flush=True)
    return result


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def speed_at(vocab: int, args, steps: int = 6) -> dict:
    """Fine-tuning tokens/s at ``vocab`` rows (Llama 3's 128,256 by default): the same Llama with its full head and
    converted (``use_head(model, "self_organized", counts=Zipf counts)``, the conversion timed, no data: the speed of
    a step does not depend on the fit), random weights, batches of Zipf-drawn ids; the steps after a first untimed one,
    wall time, one thread."""
    import copy

    import sohsm.hf

    probs = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    counts = (probs / probs.sum() * 1e8).round().clamp(min=1).long()
    generator = torch.Generator().manual_seed(0)
    rows = torch.multinomial(probs, (steps + 1) * args.batch * args.context, replacement=True,
                             generator=generator).view(-1, args.context)
    model = build(vocab, args.width, args.layers, args.context, 0)
    out = {"vocab": vocab, "steps": steps}
    for name in ("full", "self_organized"):
        copy_ = copy.deepcopy(model)
        head = None
        if name != "full":
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                head = sohsm.hf.use_head(copy_, name, counts=counts, progress=False)
            out["convert_seconds"] = round(time.perf_counter() - started, 1)
        train(copy_, rows[: args.batch], 1, args.batch, args.finetune_lr, 0, head=head)  # the first step, untimed
        out[f"{name}_tokens_per_s"] = round(train(copy_, rows[args.batch:], steps, args.batch, args.finetune_lr, 0,
                                                  head=head), 1)
        print(f"  {vocab:,} rows, {name}: {out[f'{name}_tokens_per_s']:,.0f} fine-tuning tokens/s", flush=True)
    return out


def report(args, results: list[dict], commit: str, speed: dict | None = None) -> str:
    seeds = [r["seed"] for r in results]
    ratio = lambda key, field, base: _mean([r[key][field] / r["full"][base] for r in results])  # noqa: E731
    lines = [
        "# A pretrained model keeps what it learned: a two-level head in place of its trained lm_head",
        "",
        f"Measured at commit {commit} by:",
        "",
        "```",
        f"OMP_NUM_THREADS=1 python benchmarks/pretrained.py {' '.join(args.argv)}",
        "python benchmarks/pretrained.py --rewrite   # this page again from pretrained.json",
        "```",
        "",
        f"A {args.layers}-layer untied Llama (d {args.width}, {args.context}-token context) pretrained here with its "
        f"full head on PTB ({args.pretrain_steps} AdamW steps of {args.batch} x {args.context} tokens, the project's "
        f"BPE of {args.vocab} tokens), then converted with `sohsm.hf.use_head(model, HEAD, counts=counts, "
        f"data=batches)` ({args.fit_rows} PTB training windows, `fit_seconds={args.fit_seconds:g}`), and fine-tuned "
        f"{args.steps} steps on WikiText-2 (read with PTB's tokenizer: a domain shift) against the original full "
        f"head on the same batches. Perplexity is per BPE token (PTB test; WikiText-2: its first "
        f"{args.eval_tokens:,} test tokens). Seeds: {', '.join(map(str, seeds))} ({len(seeds)} ran). One CPU thread "
        "on a machine shared with other work: the times are a busy machine's. Raw numbers: "
        "[pretrained.json](pretrained.json).",
        "",
        "## Right after conversion (PTB test perplexity)",
        "",
        "| head | kept (use_head with data) | x full | naive (keep_weights=False) | x full | conversion s |",
        "|---|---|---|---|---|---|",
        f"| full (the pretrained head) | {_mean([r['full']['ptb_test_ppl'] for r in results]):.2f} | 1 | | | |",
    ]
    for name in args.heads:
        lines.append(
            f"| {name} | {_mean([r[name]['ptb_test_ppl'] for r in results]):.2f} | "
            f"{ratio(name, 'ptb_test_ppl', 'ptb_test_ppl'):.4f} | "
            f"{_mean([r[name + '-naive']['ptb_test_ppl'] for r in results]):.2f} | "
            f"{ratio(name + '-naive', 'ptb_test_ppl', 'ptb_test_ppl'):.2f} | "
            f"{_mean([r[name]['convert_seconds'] for r in results]):.1f} |")
    so, still = "self_organized", "self_organized:no re-clustering"
    lines += [
        "",
        "Means over the seeds; the ratio is the mean of each seed's ratio. Converted, `two_level_frequency` and "
        "`two_level_random` are one head: both start from the clusters of the rows the model scores alike, not from "
        "their own, and the fit is deterministic. Inside a cluster each converted head is the original head's "
        "softmax exactly (its rows are the word vectors); the gap left is the clusters' probabilities, each scored "
        "by one vector and a bias against the log-sum-exp of its words' scores.",
        "",
        *_variants(results),
        f"## Fine-tuned {args.steps} steps on WikiText-2",
        "",
        "| head | WikiText-2 test ppl before | after | x full | fine-tuning tokens/s |",
        "|---|---|---|---|---|",
        f"| full | {_mean([r['full']['wiki_test_ppl_before'] for r in results]):.2f} | "
        f"{_mean([r['full']['wiki_test_ppl'] for r in results]):.2f} | 1 | "
        f"{_mean([r['full']['finetune_tokens_per_s'] for r in results]):.0f} |",
        f"| self_organized (converted) | {_mean([r[so]['wiki_test_ppl_before'] for r in results]):.2f} | "
        f"{_mean([r[so]['wiki_test_ppl'] for r in results]):.2f} | {ratio(so, 'wiki_test_ppl', 'wiki_test_ppl'):.4f} | "
        f"{_mean([r[so]['finetune_tokens_per_s'] for r in results]):.0f} |",
        *([f"| self_organized (converted), no re-clustering (`update_every=0`) | | "
           f"{_mean([r[still]['wiki_test_ppl'] for r in results]):.2f} | "
           f"{ratio(still, 'wiki_test_ppl', 'wiki_test_ppl'):.4f} | |"]
          if all(still in r for r in results) else []),
        "",
        *([f"Re-clusterings of the converted head, a seed: "
           f"{_mean([r[so]['reclusterings'] for r in results]):g} on average; "
           "the share of its words each re-clustering moved, seed by seed: "
           + "; ".join(f"seed {r['seed']}: {', '.join(f'{m:.4f}' for m in r[so]['moved_words']) or 'none'}"
                       for r in results) + ".", ""] if all("moved_words" in r[so] for r in results) else []),
    ]
    return "\n".join(lines + targets(args, results, speed))


def _variants(results: list[dict]) -> list[str]:
    """The self-organized head converted in other forms (:data:`VARIANTS`), seed by seed, where measured."""
    measured = [v for v in VARIANTS if all(f"self_organized:{v}" in r for r in results)]
    if not measured:
        return []
    ratio = lambda key, r: r[key]["ptb_test_ppl"] / r["full"]["ptb_test_ppl"]  # noqa: E731
    lines = ["### The self-organized head converted in other forms", "",
             "| conversion | x full, each seed | mean | held-out KL (nats/token), mean |", "|---|---|---|---|"]
    for label, key in [("the default (`cluster_bias=True`, C and shortlist ceil(sqrt(N)))", "self_organized")] + [
            (f"{v} ({', '.join(f'{k}={o}' for k, o in VARIANTS[v].items())})", f"self_organized:{v}")
            for v in measured]:
        lines.append(f"| {label} | {', '.join(f'{ratio(key, r):.4f}' for r in results)} | "
                     f"{_mean([ratio(key, r) for r in results]):.4f} | "
                     f"{_mean([r[key]['fit_kl'] for r in results]):.4f} |")
    return lines + ["", "`2sqrt`: 2 ceil(sqrt(N)). Held-out KL: the fit's report, on the tenth of the fitting "
                    "positions it kept out.", ""]


def targets(args, results: list[dict], at_scale: dict | None = None) -> list[str]:
    """The issue's targets, each said met or not from the numbers above."""
    so = "self_organized"
    met = lambda ok: "**met**" if ok else "**not met**"  # noqa: E731
    ratios = {name: _mean([r[name]["ptb_test_ppl"] / r["full"]["ptb_test_ppl"] for r in results])
              for name in args.heads}
    worst = max(r[name]["convert_seconds"] for r in results for name in args.heads)
    tuned = _mean([r[so]["wiki_test_ppl"] / r["full"]["wiki_test_ppl"] for r in results])
    speed = _mean([r[so]["finetune_tokens_per_s"] / r["full"]["finetune_tokens_per_s"] for r in results])
    lines = ["## The targets", ""]
    for name, ratio in ratios.items():
        lines.append(f"- Right after conversion, perplexity <= 1.03x the original head's: {name} {ratio:.4f}x, "
                     f"{met(ratio <= 1.03)}.")
    lines += [
        f"- Conversion (hidden states, clustering and fit) <= 60 s on one thread: the slowest of every head and seed "
        f"took {worst:.1f} s, {met(worst <= 60)}.",
        f"- Fine-tuned {args.steps} steps, perplexity <= 1.01x the fine-tuned original head's: {tuned:.4f}x, "
        f"{met(tuned <= 1.01)}.",
        _scale_target(args, speed, at_scale),
        f"- Seeds: {len(results)} of the 3 asked for.",
        "",
    ]
    return lines


def _scale_target(args, speed: float, at_scale: dict | None) -> str:
    here = (f"at {args.vocab:,} tokens, where the full softmax is cheap, the converted head fine-tuned at {speed:.2f}x "
            "the full head's tokens/s")
    if at_scale is None:
        return f"- Tokens/s >= 1.5x the original head's at 128k tokens: not measured ({here})."
    ratio = at_scale["self_organized_tokens_per_s"] / at_scale["full_tokens_per_s"]
    return (f"- Tokens/s >= 1.5x the original head's at 128k tokens: at {at_scale['vocab']:,} rows "
            f"(`python benchmarks/pretrained.py --speed-only` at commit {at_scale['commit']}: the same Llama, random "
            f"weights, {at_scale['steps']} steps of Zipf-drawn ids after a first, one thread) "
            f"{at_scale['self_organized_tokens_per_s']:,.0f} against {at_scale['full_tokens_per_s']:,.0f} tokens/s, "
            f"{ratio:.2f}x, "
            f"{'**met**' if ratio >= 1.5 else '**not met**'} (conversion {at_scale['convert_seconds']:.1f} s); {here}.")


def _recorded(argv: list[str]) -> list[str]:
    """The arguments a page's command line shows: without ``--no-write``, ``--models`` and its folder (a place on
    the machine that ran it, not a setting of the measurement)."""
    shown, skip = [], False
    for arg in argv:
        if skip or arg == "--no-write" or arg.startswith("--models"):
            skip = arg == "--models"
            continue
        shown.append(arg)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--heads", default=",".join(HEADS))
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--pretrain-steps", type=int, default=400)
    parser.add_argument("--steps", type=int, default=100, help="fine-tuning steps")
    parser.add_argument("--finetune-lr", type=float, default=1e-3)
    parser.add_argument("--fit-rows", type=int, default=128, help="PTB training windows the conversion fits on")
    parser.add_argument("--fit-seconds", type=float, default=30.0)
    parser.add_argument("--eval-tokens", type=int, default=65536)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--models", default=None, help="a folder keeping the pretrained models, read back on a rerun")
    parser.add_argument("--rewrite", action="store_true", help="write the page again from pretrained.json alone")
    parser.add_argument("--speed-only", type=int, metavar="ROWS", nargs="?", const=128_256,
                        help="measure fine-tuning tokens/s at ROWS (default Llama 3's 128,256) into pretrained.json, "
                             "and write the page again")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.rewrite or args.speed_only:
        data = json.loads(OUT_JSON.read_text())
        kept = parser.parse_args(data["argv"])
        kept.argv, kept.heads = data["argv"], kept.heads.split(",")
        if args.speed_only:
            torch.set_num_threads(1)
            data["speed"] = {**speed_at(args.speed_only, kept), "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()}
            OUT_JSON.write_text(json.dumps(data, indent=1) + "\n")
        OUT_MD.write_text(report(kept, data["results"], data["commit"], data.get("speed")))
        return 0
    args.argv = _recorded(argv)
    args.heads = args.heads.split(",")
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()  # the code that runs: read before it does
    ptb, wiki = corpora(args.vocab)
    results = []
    for seed in args.seeds.split(","):  # the page and its data after each seed: the seeds done so far
        results.append(run_seed(args, int(seed), ptb, wiki))
        text = report(args, results, commit)
        if not args.no_write:
            OUT_MD.write_text(text)
            OUT_JSON.write_text(json.dumps({"commit": commit, "argv": args.argv, "machine": platform.processor(),
                                            "threads": torch.get_num_threads(), "results": results}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
