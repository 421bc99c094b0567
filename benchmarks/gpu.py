"""Output layers on a CUDA GPU: the two-level heads against fused cross-entropy and the other peers.

For each vocabulary size N, hidden size d and token count B, every method takes
the same bf16 hidden states and Zipf-distributed targets (word id = frequency
rank) and runs, under ``torch.autocast(bfloat16)`` with float32 master weights:

* forward + backward of the mean NLL (median of ``--repeats`` timed steps, CUDA events);
* forward + backward + a fused AdamW step (``fused=True``);
* the peak memory of one forward + backward beyond what was alive before it
  (parameters and optimizer state; the gradients are set to None between steps,
  torch's default, so the weight gradient counts in the peak).

Methods: ``nn.Linear`` + ``F.cross_entropy`` (the full softmax as users write it),
Liger Kernel's ``LigerFusedLinearCrossEntropyLoss``, Cut Cross-Entropy's
``linear_cross_entropy`` (both never materialise the logits), torch's adaptive
softmax (through ``sohsm``'s ``adaptive`` head, which wraps
``nn.AdaptiveLogSoftmaxWithLoss``), and sohsm's ``two_level_frequency`` and
``self_organized`` heads on their sync-free path (``sohsm.heads.grouped``, the
Triton kernels when Triton is installed), with the per-cluster kernel beside
them. A peer whose package is not installed is listed as skipped, with the reason.

For each sohsm head one training step also runs under
``torch.cuda.set_sync_debug_mode("error")``: the ``sync-free`` column says whether
it passed (no host synchronisation in forward, backward and optimizer step).

``--lm`` adds a whole-model comparison: ``sohsm lm train`` on WikiText-2 (LSTM
512, cuDNN, bf16 autocast, batch 128, BPTT 20) for ``--lm-tokens`` tokens per head,
and reports training tokens/s (evaluation excluded).

Usage::

    python benchmarks/gpu.py                                  # all sizes, writes docs/benchmarks/gpu.md
    python benchmarks/gpu.py --sizes 50000 --dims 1024 --tokens 8192 --output /tmp/gpu.md
    python benchmarks/gpu.py --lm --lm-tokens 2000000         # adds the WikiText-2 tokens/s table

It needs a CUDA device; without one it says so in one line and exits with status 1.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import platform
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import sohsm
from sohsm import build_head

SIZES = (50_000, 128_000, 256_000)
DIMS = (1024, 4096)
TOKENS = (8192, 32768)
LM_HEADS = ("full", "adaptive", "two_level_frequency", "self_organized")


class Skipped(Exception):
    """A method that cannot run here (its package is missing, or it ran out of memory)."""


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def zipf_probabilities(n: int, device) -> torch.Tensor:
    p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64, device=device)
    return p / p.sum()


# -- the methods: each returns (modules holding its parameters, loss function of (hidden, target)) ----


def make_linear(n, d, counts, device):
    linear = torch.nn.Linear(d, n, bias=False, device=device)
    return [linear], lambda h, t: F.cross_entropy(linear(h), t)


def make_liger(n, d, counts, device):
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise Skipped(f"liger-kernel not installed ({error.name})") from None
    linear = torch.nn.Linear(d, n, bias=False, device=device)
    loss = LigerFusedLinearCrossEntropyLoss()
    # Liger takes the weight in the hidden states' dtype (bf16): the cast is part of its step, as autocast's is
    return [linear], lambda h, t: loss(linear.weight.to(h.dtype), h, t)


def make_cce(n, d, counts, device):
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as error:
        raise Skipped(f"cut-cross-entropy not installed ({error.name})") from None
    linear = torch.nn.Linear(d, n, bias=False, device=device)
    return [linear], lambda h, t: linear_cross_entropy(h, linear.weight.to(h.dtype), t)


def make_head(name, sync_free, **options):
    def make(n, d, counts, device):
        head = build_head(name, d, n, counts=counts, **options).to(device)
        head.check_targets = False  # the range check reads a bool back; the targets here are in range
        if hasattr(head, "sync_free"):
            head.sync_free = sync_free
        return [head], lambda h, t: head(h, t).loss
    return make


#: (key, row name, builder, whether the step is checked for host synchronisation)
METHODS = (
    ("linear", "linear + F.cross_entropy", make_linear, False),
    ("liger", "Liger fused linear CE", make_liger, False),
    ("cce", "Cut Cross-Entropy", make_cce, False),
    ("adaptive", "torch adaptive softmax", make_head("adaptive", None), False),
    ("two_level", "two_level_frequency (sync-free)", make_head("two_level_frequency", None), True),
    ("self_organized", "self_organized (sync-free)", make_head("self_organized", None, update_every=0), True),
    ("two_level_per_cluster", "two_level_frequency (per-cluster kernel)", make_head("two_level_frequency", False),
     False),
)


def cuda_time_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def measure(builder, check_sync: bool, n: int, d: int, tokens: int, args, device) -> dict:
    probs = zipf_probabilities(n, device)
    counts = (probs * 1e9).round().long().cpu()
    generator = torch.Generator(device=device).manual_seed(args.seed)
    target = torch.multinomial(probs, tokens, replacement=True, generator=generator)
    hidden = torch.randn(tokens, d, device=device, generator=generator, dtype=torch.bfloat16)
    modules, loss_fn = builder(n, d, counts, device)
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    for m in modules:
        if hasattr(m, "attach"):
            m.attach(optimizer)

    def forward_backward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(hidden, target)
        loss.backward()

    def train_step():
        forward_backward()
        optimizer.step()
        optimizer.zero_grad()

    if args.compile:
        forward_backward = torch.compile(forward_backward)
    row = {}
    train_step()  # the optimizer state exists from here on; gradients are set to None between steps (torch's default)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    forward_backward()
    torch.cuda.synchronize()
    row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    optimizer.zero_grad()
    row["fwd_bwd_ms"] = cuda_time_ms(forward_backward, args.warmup, args.repeats)
    row["step_ms"] = cuda_time_ms(train_step, args.warmup, args.repeats)
    if check_sync:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            train_step()
            row["sync_free"] = "yes"
        except RuntimeError as error:
            row["sync_free"] = f"no: {str(error).splitlines()[0][:80]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return row


def run_heads(args, device) -> list[dict]:
    rows = []
    for n in args.sizes:
        for d in args.dims:
            for tokens in args.tokens:
                for key, name, builder, check_sync in METHODS:
                    if args.methods and key not in args.methods:
                        continue
                    row = {"N": n, "d": d, "tokens": tokens, "method": name}
                    try:
                        row.update(measure(builder, check_sync, n, d, tokens, args, device))
                    except Skipped as reason:
                        row["note"] = f"skipped: {reason}"
                    except torch.cuda.OutOfMemoryError:
                        row["note"] = "out of memory"
                    except Exception as error:  # a peer that fails here is reported, not fatal
                        row["note"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:100]}"
                        if args.verbose:
                            traceback.print_exc()
                    torch.cuda.empty_cache()
                    rows.append(row)
                    print(format_row(row, None), flush=True)
    return rows


def format_row(row: dict, liger: dict | None) -> str:
    def num(key, fmt="{:.2f}"):
        return fmt.format(row[key]) if key in row else "-"

    ratio = "-"
    if liger and "step_ms" in row and "step_ms" in liger:
        ratio = f"{liger['step_ms'] / row['step_ms']:.2f}x"
    return (f"| {row['N']:,} | {row['d']} | {row['tokens']:,} | {row['method']} | {num('fwd_bwd_ms')} | "
            f"{num('step_ms')} | {ratio} | {num('peak_mib', '{:,.0f}')} | {row.get('sync_free', '-')} | "
            f"{row.get('note', '')} |")


def run_lm(args, device) -> list[dict]:
    """``sohsm lm train`` on WikiText-2 for each head, on the GPU; tokens/s of training."""
    from sohsm.cli.main import main as sohsm_main
    from sohsm.runs.report import summarise_run

    rows = []
    for head in args.lm_heads:
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["lm", "train", "--corpus", "wikitext-2", "--head", head, "--run-dir", str(Path(tmp) / head),
                    "--device", "cuda", "--amp", "bf16", "--batch-size", "128", "--bptt", "20",
                    "--emb-size", "512", "--hidden-size", "512", "--max-tokens", str(args.lm_tokens),
                    "--eval-every", "0", "--checkpoint-every", "0", "--quiet"]
            if args.compile:
                argv.append("--compile")
            code = sohsm_main(argv)
            row = {"head": head, "command": "sohsm " + " ".join(a for a in argv if not a.startswith(tmp))}
            if code == 0:
                summary = summarise_run(Path(tmp) / head)
                row.update(tokens=summary.tokens, train_s=summary.train_s, tokens_per_s=summary.tokens_per_s)
            else:
                row["note"] = f"sohsm lm train exited with status {code}"
            rows.append(row)
            print(row, flush=True)
    return rows


def write_report(path: Path, args, device, rows: list[dict], lm_rows: list[dict]) -> None:
    props = torch.cuda.get_device_properties(device)
    versions = ", ".join(f"{p} {package_version(p)}" for p in ("triton", "liger-kernel", "cut-cross-entropy")
                         if package_version(p))
    lines = [
        "# Output layers on a GPU",
        "",
        f"Device: {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, "
        f"torch {torch.__version__}, {versions or 'no Triton'}, Python {platform.python_version()}, "
        f"sohsm {sohsm.__version__}; {datetime.date.today().isoformat()}.",
        "",
        "Command: `python benchmarks/gpu.py " + " ".join(sys.argv[1:]) + "`",
        "",
        "bf16 autocast, float32 master weights, Zipf targets (word id = frequency rank). Times are medians of "
        f"{args.repeats} steps after {args.warmup} warm-up steps; *step* adds a fused AdamW step to forward + "
        "backward; *vs Liger* is Liger's step time over the row's; *peak* is the memory of one forward + backward "
        "beyond the parameters and optimizer state (the gradients, set to None between steps, count in it). "
        "*sync-free*: the step ran under "
        "`torch.cuda.set_sync_debug_mode(\"error\")`.",
        "",
        "| N | d | tokens | method | fwd+bwd ms | step ms | vs Liger | peak MiB | sync-free | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        liger = next((r for r in rows if r["method"] == "Liger fused linear CE" and
                      (r["N"], r["d"], r["tokens"]) == (row["N"], row["d"], row["tokens"])), None)
        lines.append(format_row(row, liger))
    if lm_rows:
        lines += ["", "## Whole LM on WikiText-2 (LSTM 512, cuDNN, bf16, batch 128, BPTT 20)", "",
                  "| head | tokens | train s | tokens/s | note |", "|---|---|---|---|---|"]
        for row in lm_rows:
            lines.append(f"| {row['head']} | {row.get('tokens', '-')} | "
                         f"{row['train_s']:.1f} | {row['tokens_per_s']:,.0f} | |" if "tokens_per_s" in row else
                         f"| {row['head']} | - | - | - | {row.get('note', '')} |")
        lines += ["", "Each row: `" + lm_rows[0]["command"].replace(f"--head {lm_rows[0]['head']}", "--head HEAD")
                  + "` (in a temporary run directory)."]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="vocabulary sizes N")
    parser.add_argument("--dims", type=int, nargs="+", default=list(DIMS), help="hidden sizes d")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="tokens per step B")
    parser.add_argument("--methods", nargs="+", choices=[m[0] for m in METHODS], metavar="METHOD",
                        help="only these rows (default: all): " + ", ".join(f"{m[0]} ({m[1]})" for m in METHODS))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile the forward + backward")
    parser.add_argument("--lm", action="store_true", help="add the WikiText-2 whole-LM tokens/s comparison")
    parser.add_argument("--lm-tokens", type=int, default=2_000_000, help="training tokens per head (--lm)")
    parser.add_argument("--lm-heads", nargs="+", default=list(LM_HEADS), help="heads of the --lm comparison")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
                        / "gpu.md")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of a method that fails")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device and torch.cuda.is_available() is False: nothing measured, "
              "nothing written", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
    rows = run_heads(args, device)
    lm_rows = run_lm(args, device) if args.lm else []
    write_report(args.output, args, device, rows, lm_rows)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
