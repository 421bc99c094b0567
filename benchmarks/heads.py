"""Speed and memory of the output layers, measured side by side in one run.

For each vocabulary size N, every head does forward + backward on the same
batch of hidden states (d = 512, 1024 tokens, targets drawn from a Zipf
distribution); the heads take turns, repetition after repetition, and the
median time of each is reported with its ratio to the full softmax, so the
ratios are not skewed by the machine's load changing over the run.

Peak activation memory is the peak of the bytes allocated during one
forward + backward beyond what is alive before it (parameters and their
gradients, which are kept between steps), read from the PyTorch profiler's
allocation events.

Every head is built by name with its defaults (``sohsm.build_head``), as
``sohsm lm train --head NAME`` builds it; ``+sparse`` rows are the same
head with ``sparse=True`` (row-sparse gradients, which need an optimizer that
takes them). The sampled heads (importance sampling, NCE, PMI-LM) time their
training objective with k = 100 noise words per batch; their exact evaluation
costs what the full softmax costs.

Exact top-1 decoding compares the full softmax's argmax with the best-first
searches of the self-organized head (over clusters) and the Huffman tree head
(over nodes). Best-first search pays off when the distribution is peaked, as in
a trained model; here each head is first trained for a few steps on a learnable
synthetic task (hidden state = a fixed random vector of the target word +
noise), and the mean number of clusters / nodes visited per token is reported
beside the time.

Usage::

    python benchmarks/heads.py                       # all sizes, writes docs/benchmarks/heads.md
    python benchmarks/heads.py --sizes 10000 44000 --repeats 3 --output /tmp/heads.md

A last section times the heads of ``--large-heads`` at ``--large-size`` (default:
the full softmax and the self-organized head at N = 1M); the full softmax is
run there only if its estimated peak memory fits in half the free memory, and
is otherwise listed as not run, with the estimate.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import sohsm
from _machine import machine, write_page
from sohsm import BinaryTreeSoftmax, FullSoftmax, Reclustering, SelfOrganizedSoftmax, build_head
from sohsm.heads import SelfOrganizingHead
from sohsm.heads.two_level.ops.topk import DEFAULT_CLUSTERS

#: (row name, registered head, options), in table order
HEADS = (
    ("full", "full", {}),
    ("adaptive", "adaptive", {}),
    ("two_level_random", "two_level_random", {}),
    ("two_level_frequency", "two_level_frequency", {}),
    ("self_organized", "self_organized", {"update_every": 0}),
    ("self_organized-no-shortlist", "self_organized", {"update_every": 0, "shortlist": 0}),  # the paper's head
    # rare words in fewer dimensions (div_value=4): the head a tied LSTM run over 20,000 words or more takes
    ("self_organized-banded", "self_organized", {"update_every": 0, "div_value": 4}),
    ("tree_huffman", "tree_huffman", {}),
    ("tree_huffman+sparse", "tree_huffman", {"sparse": True}),
    ("tree_random", "tree_random", {}),
    ("tree_depth3", "tree", {"depth": 3}),  # n-ary balanced tree, branching ceil(N^(1/3))
    ("importance_sampling", "importance_sampling", {}),
    ("nce", "nce", {}),
    ("nce+sparse", "nce", {"sparse": True}),
    ("pmi", "pmi", {}),
    ("dsoftmax", "dsoftmax", {}),
)


def zipf_probabilities(n: int) -> torch.Tensor:
    p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    return p / p.sum()


def build_heads(n: int, d: int, counts: torch.Tensor, names: list[str]) -> dict[str, nn.Module]:
    return {row: build_head(name, d, n, counts=counts, **options) for row, name, options in HEADS if row in names}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step_time(head: nn.Module, hidden: torch.Tensor, target: torch.Tensor, device) -> float:
    head.zero_grad(set_to_none=True)  # torch's default in training loops
    hidden.grad = None
    sync(device)
    start = time.perf_counter()
    head(hidden, target).loss.backward()
    sync(device)
    return time.perf_counter() - start


def optimizer_step_time(head: nn.Module, hidden: torch.Tensor, target: torch.Tensor, device, repeats: int) -> float:
    """Median time of one (fused) Adagrad step over the head's parameters, on the gradients of one forward + backward.

    The optimizer (and its state, one more tensor per parameter) lives only while this
    head is timed, so the heads of one size do not all hold optimizer state at once.
    """
    head.zero_grad(set_to_none=True)
    head(hidden, target).loss.backward()
    optimizer = adagrad(head)
    optimizer.step()  # warm-up: allocates the state
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        optimizer.step()
        sync(device)
        times.append(time.perf_counter() - start)
    del optimizer
    return statistics.median(times)


def adagrad(head: nn.Module) -> torch.optim.Optimizer:
    """Adagrad (lr 0.1) as `sohsm lm train` builds it: the fused step where torch has one for the device (the
    CPU, not CUDA), unless the head hands out row-sparse gradients, which only the default step takes."""
    from sohsm.train.builders import fused_step_supported

    device = next(head.parameters()).device.type
    fused = not getattr(head, "sparse", False) and fused_step_supported(torch.optim.Adagrad, device)
    return torch.optim.Adagrad(head.parameters(), lr=0.1, **({"fused": True} if fused else {}))


def full_softmax_bytes(n: int, d: int, tokens: int) -> int:
    """Estimated bytes a full-softmax training step holds at its peak: weight, gradient and Adagrad state
    (3 N d floats), and the logits, their log-softmax and its gradient (3 B N floats; 12 bytes a logit
    is what the profiler measured at the smaller sizes)."""
    return 4 * (3 * n * d + 3 * tokens * n)


def available_bytes() -> int | None:
    """Memory the system can still give (``MemAvailable``), or ``None`` where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def large_vocabulary(n: int, d: int, tokens: int, names: list[str], device, repeats: int, seed: int) -> dict:
    """The heads ``names`` at one large ``n`` (the full softmax only if it would fit in half the free memory)."""
    free = available_bytes() if device.type == "cpu" else torch.cuda.mem_get_info(device)[0]
    needed = full_softmax_bytes(n, d, tokens)
    out = {"n": n, "full_needed": needed, "free": free, "rows": []}
    names = [name for name in names if name != "full" or (free is not None and needed < free / 2)]
    out["full_skipped"] = "full" not in names
    generator = torch.Generator().manual_seed(seed)
    probs = zipf_probabilities(n)
    counts = (probs * 1e9).round().long()
    hidden = torch.randn(tokens, d, generator=generator).to(device).requires_grad_()
    target = torch.multinomial(probs, tokens, replacement=True, generator=generator).to(device)
    for name in names:
        torch.manual_seed(seed)
        head = build_heads(n, d, counts, [name])[name].to(device)
        train_step_time(head, hidden, target, device)
        fb = statistics.median(train_step_time(head, hidden, target, device) for _ in range(repeats))
        step = optimizer_step_time(head, hidden, target, device, repeats)
        memory = peak_activation_bytes(head, hidden, target, device)
        params = sum(p.numel() * p.element_size() for p in head.parameters())
        held = statistics_bytes(head)
        out["rows"].append((name, fb * 1e3, (fb + step) * 1e3, memory / 2**20, 3 * params / 2**30, held / 2**30))
        print(f"N={n:>7} {name:<20} {fb * 1e3:9.1f} ms  +step {(fb + step) * 1e3:9.1f} ms  "
              f"{memory / 2**20:8.1f} MiB activations, {3 * params / 2**30:.1f} GiB weights+gradients+Adagrad, "
              f"{held / 2**30:.2f} GiB statistics", flush=True)
        del head
    return out


def statistics_bytes(head: nn.Module) -> int:
    """Bytes a head holds besides its parameters: its buffers and, for a self-organizing head, its
    statistics ``q`` (N x learned clusters floats, kept out of the buffers so that DDP does not broadcast it;
    N (2M + 1) 4-byte numbers when the head keeps it compact, ``q_clusters=M``)."""
    held = sum(b.numel() * b.element_size() for b in head.buffers())
    if isinstance(head, SelfOrganizingHead):
        held += head.statistics_bytes()
    return held


def peak_activation_bytes(head: nn.Module, hidden: torch.Tensor, target: torch.Tensor, device) -> int:
    """Peak bytes allocated during forward + backward beyond what was alive before (grads kept)."""
    head.zero_grad(set_to_none=False)
    hidden.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        head(hidden, target).loss.backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        head(hidden, target).loss.backward()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def quiet_stderr():
    """Drop what is written to file descriptor 2 meanwhile: the profiler's C++ side logs
    two lines ("profiler_start", "profiler_stop") per use, dozens in a run, and no setting turns them off."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def decoding(n: int, d: int, counts, device, generator, train_steps: int, tokens: int) -> dict:
    """Train a self-organized and a Huffman tree head briefly on a learnable task, then time their
    exact top-1 against the full softmax's argmax."""
    probs = zipf_probabilities(n)
    prototypes = torch.randn(n, d, generator=generator).to(device)

    def batch():
        target = torch.multinomial(probs, tokens, replacement=True, generator=generator).to(device)
        noise = torch.randn(tokens, d, generator=generator).to(device)
        return prototypes[target] + 0.5 * noise, target

    heads = {"so": SelfOrganizedSoftmax(d, n, counts=counts, reclustering=Reclustering(update_every=0)).to(device),
             "tree": BinaryTreeSoftmax(d, n, tree="huffman", counts=counts).to(device)}
    full = FullSoftmax(d, n).to(device)
    for head in heads.values():
        optimizer = adagrad(head)
        head.attach(optimizer)
        for _ in range(train_steps):
            hidden, target = batch()
            optimizer.zero_grad()
            head(hidden, target).loss.backward()
            optimizer.step()
        head.eval()
    hidden, target = batch()
    predictors = {"full": full.predict, **{name: head.predict for name, head in heads.items()},
                  "so_device": lambda h: heads["so"].exact_topk(h, 1)}
    times = {name: [] for name in predictors}
    with torch.no_grad():
        for _ in range(3):
            for name, fn in predictors.items():
                sync(device)
                start = time.perf_counter()
                fn(hidden)
                sync(device)
                times[name].append(time.perf_counter() - start)
        so, tree = heads["so"].search_topk(hidden, 1), heads["tree"].search_topk(hidden, 1)
        certified = heads["so"].device_topk(hidden, 1).certified
    best = {name: min(t) for name, t in times.items()}
    return {
        "full_ms": best["full"] * 1e3,
        "so_ms": best["so"] * 1e3,
        "speedup": best["full"] / best["so"],
        "visited": float(so.clusters_visited.double().mean()),
        "device_ms": best["so_device"] * 1e3,
        "certified": float(certified.double().mean()),
        "n_clusters": heads["so"].n_clusters,
        "accuracy": float((so.indices[:, 0] == target).double().mean()),
        "tree_ms": best["tree"] * 1e3,
        "tree_speedup": best["full"] / best["tree"],
        "tree_visited": float(tree.nodes_visited.double().mean()),
        "tree_path": float(heads["tree"].path_lengths()[target].double().mean()),
        "tree_accuracy": float((tree.indices[:, 0] == target).double().mean()),
    }


def large_vocabulary_lines(large: dict, d: int, tokens: int) -> list[str]:
    """The section of the page on the large vocabulary."""
    n, free = large["n"], large["free"]
    free_text = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
    lines = ["", f"## N = {n:,}", "",
             f"d = {d}, {tokens} tokens, as above. The full softmax would hold about "
             f"{large['full_needed'] / 2**30:.1f} GiB at its peak (weight, gradient and Adagrad state, "
             f"3 x N x d floats; logits, log-softmax and gradient, 3 x {tokens} x N floats); the machine had "
             f"{free_text} free. "
             + ("It was not run: a head is run here only if its estimate fits in half the free memory."
                if large["full_skipped"] else "It fitted in half the free memory and was run."),
             "",
             "| N | head | fwd+bwd ms | fwd+bwd + Adagrad step ms | peak activations MiB "
             "| weights + gradients + Adagrad state GiB | statistics GiB |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    if large["full_skipped"]:
        lines.append(f"| {n:,} | full | not run | not run | ~{3 * tokens * n * 4 / 2**20:,.0f} (estimate) "
                     f"| {3 * n * d * 4 / 2**30:.1f} (estimate) | 0.00 |")
    for name, ms, step_ms, mib, gib, held in large["rows"]:
        lines.append(f"| {n:,} | {name} | {ms:.1f} | {step_ms:.1f} | {mib:.1f} | {gib:.1f} | {held:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 44000, 100000, 300000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per head (after one warm-up)")
    parser.add_argument("--decode-train-steps", type=int, default=100)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heads", nargs="+", default=[row for row, _, _ in HEADS],
                        choices=[row for row, _, _ in HEADS],
                        help="rows to time (default: all; 'full' is always timed, the ratios need it)")
    parser.add_argument("--large-size", type=int, default=1_000_000,
                        help="one more vocabulary size, for --large-heads only (0: none)")
    parser.add_argument("--large-heads", nargs="+", default=["full", "self_organized"],
                        help="heads at --large-size; the full softmax only where its estimate fits in half the "
                        "free memory")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parents[1] / "docs/benchmarks/heads.md")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    d, tokens = args.dim, args.tokens

    rows, decode_rows = [], []
    for n in args.sizes:
        generator = torch.Generator().manual_seed(args.seed)
        probs = zipf_probabilities(n)
        counts = (probs * 1e9).round().long()  # a large corpus with Zipf frequencies
        torch.manual_seed(args.seed)
        names = ["full"] + [row for row in args.heads if row != "full"]
        heads = {name: head.to(device) for name, head in build_heads(n, d, counts, names).items()}
        hidden = torch.randn(tokens, d, generator=generator).to(device).requires_grad_()
        target = torch.multinomial(probs, tokens, replacement=True, generator=generator).to(device)
        times = {name: [] for name in heads}
        for head in heads.values():  # warm-up: first-touch of buffers and kernels
            train_step_time(head, hidden, target, device)
        for _ in range(args.repeats):
            for name, head in heads.items():
                times[name].append(train_step_time(head, hidden, target, device))
        memory = {name: peak_activation_bytes(head, hidden, target, device) for name, head in heads.items()}
        held = {name: statistics_bytes(head) for name, head in heads.items()}
        steps = {name: optimizer_step_time(head, hidden, target, device, args.repeats) for name, head in heads.items()}
        full_time, full_memory = statistics.median(times["full"]), memory["full"]
        full_with_step = full_time + steps["full"]
        for name in heads:
            t = statistics.median(times[name])
            with_step = t + steps[name]
            rows.append((n, name, t * 1e3, full_time / t, with_step * 1e3, full_with_step / with_step,
                         memory[name] / 2**20, full_memory / max(memory[name], 1), held[name] / 2**20))
            print(f"N={n:>7} {name:<20} {t * 1e3:9.1f} ms  {full_time / t:6.1f}x  +step {with_step * 1e3:9.1f} ms "
                  f"{full_with_step / with_step:6.1f}x  {memory[name] / 2**20:8.1f} MiB  "
                  f"1/{full_memory / max(memory[name], 1):.1f}", flush=True)
        del heads
        dec = decoding(n, d, counts, device, generator, args.decode_train_steps, tokens)
        decode_rows.append((n, dec))
        print(f"N={n:>7} top-1: full argmax {dec['full_ms']:.1f} ms, self-organized {dec['so_ms']:.1f} ms "
              f"({dec['speedup']:.1f}x), {dec['visited']:.2f} of {dec['n_clusters']} clusters visited; "
              f"on the device {dec['device_ms']:.1f} ms ({100 * dec['certified']:.1f}% certified); "
              f"Huffman tree {dec['tree_ms']:.1f} ms ({dec['tree_speedup']:.1f}x), {dec['tree_visited']:.1f} "
              f"nodes visited (path {dec['tree_path']:.1f})", flush=True)

    large = (large_vocabulary(args.large_size, d, tokens, args.large_heads, device, args.repeats, args.seed)
             if args.large_size else None)

    command = "python benchmarks/heads.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        "# Output layers: speed and memory",
        "",
        f"Produced by `{command.strip()}` on {datetime.date.today().isoformat()}",
        f"({machine()}, device `{device}`, sohsm {sohsm.__version__}).",
        "",
        f"Forward + backward of the output layer alone for {tokens} tokens, d = {d}, Zipf targets; "
        f"median of {args.repeats} interleaved repetitions after a warm-up; ratios are to the full softmax "
        "of the same run. Every head is built by name with its defaults, as `sohsm lm train --head NAME` "
        "builds it. The two-level heads' clusters: ceil(sqrt(N)), random / frequency binning / the "
        "self-organized head's random start (clusters do not change during the timing). Peak activation "
        "memory: bytes allocated during one forward + backward beyond parameters and gradients kept from the "
        "previous step. `adaptive` wraps `nn.AdaptiveLogSoftmaxWithLoss` (cutoffs: 2k/10k of 44k scaled to "
        "N, div_value 4). The sampled heads (importance_sampling, nce, pmi) time their training objective "
        "with k = 100 noise words per batch; `+sparse` rows give the word / node vectors row-sparse "
        "gradients (an optimizer that takes them is needed). `dsoftmax` (differentiated softmax): the "
        "adaptive head's cutoffs as frequency bands of d/2, d/4, d/4 dimensions. `self_organized` keeps "
        "its ceil(sqrt(N)) most frequent words in clusters of their own (its default `shortlist`); "
        "`self_organized-no-shortlist` is the paper's head (`shortlist=0`); `self_organized-banded` scores "
        "rare words in fewer dimensions (`div_value=4`: the head a tied LSTM run over 20,000 words or more "
        "takes; timed here alone, untied). '+ Adagrad step': "
        "forward + backward plus the median time of an Adagrad step over the head's parameters (timed on "
        "its own, on the gradients of one forward + backward), as in a training step; the step is torch's "
        "fused one (`fused=True`, as `sohsm lm train` uses it), except for the `+sparse` rows, whose "
        "row-sparse gradients only the default step takes. *Statistics*: what a head holds besides its "
        "parameters, alive between steps: its buffers and, for the self-organized head, its statistics q "
        "(N x learned clusters, float32), which the re-clustering reads.",
        "",
        "| N | head | fwd+bwd ms | speed-up vs full | fwd+bwd + Adagrad step ms | speed-up vs full "
        "| peak activations MiB | memory vs full | statistics MiB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, name, ms, speedup, step_ms, step_speedup, mib, mem_ratio, held_mib in rows:
        lines.append(f"| {n:,} | {name} | {ms:.1f} | {speedup:.1f}x | {step_ms:.1f} | {step_speedup:.1f}x | "
                     f"{mib:.1f} | 1/{mem_ratio:.1f} | {held_mib:.1f} |")
    if large is not None:
        lines += large_vocabulary_lines(large, d, tokens)
    lines += [
        "",
        "## Exact top-1 decoding",
        "",
        f"{tokens} hidden states; the self-organized head and the Huffman tree head were each trained for "
        f"{args.decode_train_steps} Adagrad steps on a learnable synthetic task (hidden = fixed random vector "
        "of the target word + noise), so their distributions are peaked as in a trained model. Best-first "
        "search over clusters / nodes is exact: it returns the same word as the argmax of `log_prob`. Best "
        "of 3 timings. Nodes visited: internal nodes whose branches were scored; the target's path length "
        "is beside it. *Device top-1*: `SelfOrganizedSoftmax.exact_topk` (each row scores its "
        f"{DEFAULT_CLUSTERS} most probable clusters with static shapes, no host read; the rows whose answer it "
        "cannot certify are searched): the way for a GPU, where each host read stalls the device; on a CPU "
        "the search is the faster.",
        "",
        "| N | full argmax ms | self-organized top-1 ms | speed-up | clusters visited / token | of clusters "
        "| device top-1 ms | certified rows | tree top-1 ms | speed-up | nodes visited / token | target path |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, dec in decode_rows:
        lines.append(
            f"| {n:,} | {dec['full_ms']:.1f} | {dec['so_ms']:.1f} | {dec['speedup']:.1f}x | "
            f"{dec['visited']:.2f} | {dec['n_clusters']} | {dec['device_ms']:.1f} | {100 * dec['certified']:.1f}% | "
            f"{dec['tree_ms']:.1f} | {dec['tree_speedup']:.1f}x | "
            f"{dec['tree_visited']:.1f} | {dec['tree_path']:.1f} |"
        )
    write_page(args.output, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
