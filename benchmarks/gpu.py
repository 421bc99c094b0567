"""Output layers on a CUDA GPU: the two-level heads against fused cross-entropy and the other peers.

For each vocabulary size N, hidden size d and token count B, every method takes
the same bf16 hidden states, which require a gradient as a model's do (a method
that skipped the gradient of its input would be timing half a step), and
Zipf-distributed targets (word id = frequency rank) and runs, under
``torch.autocast(bfloat16)`` with float32 master weights:

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
``self_organized`` heads with their defaults (``backend="auto"``: the sync-free
Triton kernels on CUDA), with the per-cluster kernel (``backend="per_cluster"``)
beside them. A peer whose package is not installed is listed as skipped, with the
reason. *best peer* is the fastest step of the four peers at that size, and each
row's step time is compared with it.

For each sohsm head one training step also runs under
``torch.cuda.set_sync_debug_mode("error")``: the ``sync-free`` column says whether
it passed (no host synchronisation in forward, backward and optimizer step).

``--lm`` adds the whole-model comparison: ``sohsm lm train --device cuda --amp bf16``
with every head's defaults (batch 128, BPTT 20) for ``--lm-tokens`` tokens per head,
each run alone on the GPU, on WikiText-2 (LSTM 512) and on a synthetic Zipf corpus
of ``--zipf-words`` words (256k, LSTM 1024; written into a temporary folder), and
reports training tokens/s after the first logged interval (warm-up and evaluation excluded;
re-clusterings included) and which in-cluster backend each head ran. The report is written
again after every row, so a run that fails, or a benchmark that stops, keeps every figure
measured before it.

Before measuring, the GPU tests of the sync-free path run (``pytest`` on
``tests/heads/two_level/test_grouped_kernels.py``, ``test_grouped.py``, ``test_device_topk.py``,
``test_word_bands.py`` and ``test_two_level.py``) and their result heads the report, so a
GPU run also proves the kernels correct on that GPU (``--no-tests`` skips them).

Usage::

    python benchmarks/gpu.py                                  # all sizes, writes docs/benchmarks/gpu.md
    python benchmarks/gpu.py --sizes 50000 --dims 1024 --tokens 8192 --output /tmp/gpu.md
    python benchmarks/gpu.py --lm --lm-tokens 2000000         # adds the whole-model tokens/s tables

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
from sohsm.heads import TwoLevelSoftmax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import command_line  # noqa: E402

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


def make_head(name, **options):
    def make(n, d, counts, device):
        head = build_head(name, d, n, counts=counts, **options).to(device)  # the target check on, as a user has it
        return [head], lambda h, t: head(h, t).loss
    return make


def backend_that_runs(head, device, compute=torch.bfloat16) -> str:
    """The in-cluster backend a two-level head runs on ``device`` under ``compute`` autocast ("-" for other heads):
    what ``backend="auto"`` chose, fallbacks included."""
    if not isinstance(head, TwoLevelSoftmax):
        return "-"
    return head.backend_for(device, compute).name


#: (key, row name, builder, whether the step is checked for host synchronisation)
METHODS = (
    ("linear", "linear + F.cross_entropy", make_linear, False),
    ("liger", "Liger fused linear CE", make_liger, False),
    ("cce", "Cut Cross-Entropy", make_cce, False),
    ("adaptive", "torch adaptive softmax", make_head("adaptive"), False),
    ("two_level", "two_level_frequency (default backend)", make_head("two_level_frequency"), True),
    ("self_organized", "self_organized (default backend)", make_head("self_organized", update_every=0), True),
    ("two_level_per_cluster", "two_level_frequency (per-cluster kernel)",
     make_head("two_level_frequency", backend="per_cluster"), False),
)
#: the peers a sohsm head is compared with at each size (the best of them is the *best peer*)
PEERS = ("linear", "liger", "cce", "adaptive")


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
    # a model's hidden states require a gradient: without it Liger computes none and autograd skips grad_h
    hidden = torch.randn(tokens, d, device=device, generator=generator, dtype=torch.bfloat16).requires_grad_(True)
    modules, loss_fn = builder(n, d, counts, device)
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    for m in modules:
        if hasattr(m, "attach"):
            m.attach(optimizer)

    def forward_backward():
        hidden.grad = None
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
    row["backend"] = next((backend_that_runs(m, device) for m in modules if isinstance(m, TwoLevelSoftmax)), "-")
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


def run_heads(args, device, report) -> list[dict]:
    """One row per size and method, each added to the report as soon as it is measured."""
    rows = report.rows
    for n in args.sizes:
        for d in args.dims:
            for tokens in args.tokens:
                for key, name, builder, check_sync in METHODS:
                    if args.methods and key not in args.methods:
                        continue
                    row = {"N": n, "d": d, "tokens": tokens, "method": name, "key": key}
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
                    report.write()
                    print(format_row(row, best_peer(rows, row)), flush=True)
    return rows


def best_peer(rows: list[dict], row: dict) -> dict | None:
    """The peer with the fastest step at ``row``'s size (``None`` before any peer ran there)."""
    same = [r for r in rows if r["key"] in PEERS and "step_ms" in r
            and (r["N"], r["d"], r["tokens"]) == (row["N"], row["d"], row["tokens"])]
    return min(same, key=lambda r: r["step_ms"], default=None)


def format_row(row: dict, best: dict | None) -> str:
    def num(key, fmt="{:.2f}"):
        return fmt.format(row[key]) if key in row else "-"

    best_name = best_ms = ratio = "-"
    if best is not None:
        best_name, best_ms = best["method"], f"{best['step_ms']:.2f}"
        if "step_ms" in row:
            ratio = f"{best['step_ms'] / row['step_ms']:.2f}x"
    return (f"| {row['N']:,} | {row['d']} | {row['tokens']:,} | {row['method']} | {row.get('backend', '-')} | "
            f"{num('fwd_bwd_ms')} | {num('step_ms')} | {best_name} | {best_ms} | {ratio} | "
            f"{num('peak_mib', '{:,.0f}')} | {row.get('sync_free', '-')} | {row.get('note', '')} |")


#: the whole-model settings: (name, corpus, LSTM size, extra `lm train` arguments)
LM_SETTINGS = (
    ("WikiText-2", "wikitext-2", 512, ()),
    ("Zipf", None, 1024, ("--min-count", "1")),  # the synthetic corpus, written by write_zipf_corpus
)


def write_zipf_corpus(folder: Path, n_words: int, n_tokens: int, seed: int) -> Path:
    """A folder with train/valid/test text of Zipf-distributed words ``w0 .. w{n_words-1}``, every word at least once.

    The whole-model benchmark at a vocabulary no public corpus of this size gives in minutes.
    """
    generator = torch.Generator().manual_seed(seed)
    probs = zipf_probabilities(n_words, "cpu")
    folder.mkdir(parents=True, exist_ok=True)
    for split, tokens in (("train", n_tokens), ("valid", n_tokens // 50), ("test", n_tokens // 50)):
        ids = torch.multinomial(probs, tokens, replacement=True, generator=generator)
        if split == "train":  # every word once, so the vocabulary has all n_words
            ids = torch.cat([ids, torch.arange(n_words)])[torch.randperm(tokens + n_words, generator=generator)]
        words = [f"w{i}" for i in ids.tolist()]
        lines = (" ".join(words[i : i + 50]) for i in range(0, len(words), 50))
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def rate_after_warmup(run_dir: Path) -> dict:
    """Training tokens/s between the first and the last logged interval of a run (``metrics.jsonl``), so the first
    steps' warm-up (kernel compilation, autotuning, allocator growth) is left out; re-clusterings stay in."""
    from sohsm.train.metrics import read_metrics

    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    if len(train) < 2 or train[-1]["elapsed_s"] <= train[0]["elapsed_s"]:
        raise ValueError(f"too few training records to leave the warm-up out ({len(train)}; lower --log-every)")
    first, last = train[0], train[-1]
    return {"tokens": int(last["tokens"]), "train_s": float(last["elapsed_s"]),
            "timed_tokens": int(last["tokens"] - first["tokens"]),
            "tokens_per_s": (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])}


def lm_backend(head_name: str, device) -> str:
    """The in-cluster backend ``head_name`` ran in a bf16 run on ``device`` (what ``auto`` chose in this process)."""
    try:
        head = build_head(head_name, 16, 100, counts=torch.ones(100))
    except (TypeError, ValueError):
        return "-"
    return backend_that_runs(head.to(device), device)


def run_lm(args, device, report) -> list[dict]:
    """``sohsm lm train`` for each head and setting, one run at a time on the GPU; tokens/s of training after the
    first logged interval. Each row joins the report as soon as its run ends; a run that fails is a row saying so."""
    from sohsm.cli.main import main as sohsm_main

    rows = report.lm_rows
    with tempfile.TemporaryDirectory() as tmp:
        for setting, corpus, size, extra in LM_SETTINGS:
            if corpus is None:
                corpus = str(write_zipf_corpus(Path(tmp) / f"zipf-{args.zipf_words}", args.zipf_words,
                                               args.zipf_tokens, args.seed))
            for head in args.lm_heads:
                run_dir = Path(tmp) / f"{setting}-{head}"
                argv = ["lm", "train", "--corpus", corpus, "--head", head, "--run-dir", str(run_dir),
                        "--device", "cuda", "--amp", "bf16", "--batch-size", "128", "--bptt", "20",
                        "--emb-size", str(size), "--hidden-size", str(size), "--max-tokens", str(args.lm_tokens),
                        "--eval-every", "0", "--checkpoint-every", "0", "--log-every", str(args.lm_log_every),
                        "--quiet", *extra]
                if args.compile:
                    argv.append("--compile")
                command = "sohsm " + " ".join("ZIPF_FOLDER" if a == corpus and setting == "Zipf" else a
                                              for a in argv if not a.startswith(str(run_dir)))
                row = {"setting": setting, "size": size, "head": head, "command": command}
                try:
                    code = sohsm_main(argv)
                    if code != 0:
                        raise RuntimeError(f"sohsm lm train exited with status {code}")
                    row.update(rate_after_warmup(run_dir))
                    row["backend"] = lm_backend(head, device)
                except Exception as error:  # one failing run is a row; the others still run
                    row["note"] = f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:100]}"
                    if args.verbose:
                        traceback.print_exc()
                torch.cuda.empty_cache()
                rows.append(row)
                report.write()
                print(row, flush=True)
    return rows


#: the GPU tests of the sync-free path, run before measuring (``--no-tests`` skips them)
GPU_TESTS = tuple(f"tests/heads/two_level/test_{name}.py"
                  for name in ("grouped_kernels", "grouped", "device_topk", "word_bands", "two_level"))


def run_gpu_tests() -> str:
    """The last line of ``pytest`` on :data:`GPU_TESTS` (on this machine's GPU), and whether it passed."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS], cwd=root,
                          capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    verdict = "passed" if done.returncode == 0 else f"FAILED (exit status {done.returncode})"
    print(f"GPU tests: {verdict}: {last}", flush=True)
    return f"{verdict}: {last}"


class Report:
    """The report file, written again whole after every row, so a run that stops keeps every figure measured."""

    def __init__(self, path: Path, args, device, tests: str | None = None):
        self.path = path / "gpu.md" if path.is_dir() else path  # --output DIR writes DIR/gpu.md
        self.args, self.device, self.tests = args, device, tests
        self.rows: list[dict] = []
        self.lm_rows: list[dict] = []

    def write(self) -> None:
        write_report(self.path, self.args, self.device, self.rows, self.lm_rows, self.tests)


def write_report(path: Path, args, device, rows: list[dict], lm_rows: list[dict], tests: str | None) -> None:
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
        "Command: `python benchmarks/gpu.py " + command_line(sys.argv[1:]) + "`",
        "",
        f"GPU tests of the sync-free path ({', '.join(GPU_TESTS)}): {tests or 'not run (--no-tests)'}.",
        "",
        "bf16 autocast, float32 master weights, hidden states that require a gradient, Zipf targets (word id = "
        f"frequency rank). Times are medians of {args.repeats} steps after {args.warmup} warm-up steps; *step* adds "
        "a fused AdamW step to forward + backward; *best peer* is the fastest step among the full softmax, Liger, "
        "Cut Cross-Entropy and adaptive softmax at that size, and *vs best* its step time over the row's; *peak* is "
        "the memory of one forward + backward beyond the parameters and optimizer state (the gradients, set to "
        "None between steps, count in it). *sync-free*: the step ran under "
        "`torch.cuda.set_sync_debug_mode(\"error\")`. *backend*: the in-cluster backend a sohsm head ran "
        "(`backend=\"auto\"` falls back from Triton with a warning where its kernels cannot run).",
        "",
        "| N | d | tokens | method | backend | fwd+bwd ms | step ms | best peer | its step ms | vs best | peak MiB "
        "| sync-free | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(format_row(row, best_peer(rows, row)))
    if lm_rows:
        lines += ["", "## Whole language model, training tokens/s (each run alone on the GPU)", "",
                  f"`sohsm lm train` with every head's defaults, bf16, batch 128, BPTT 20, {args.lm_tokens:,} tokens "
                  "per run, no evaluation; re-clusterings included. *tokens/s* is timed from the first logged "
                  f"interval (every {args.lm_log_every} steps) to the last, so the warm-up (compilation, autotuning) "
                  "is left out. Zipf: a synthetic corpus of "
                  f"{args.zipf_words:,} words ({args.zipf_tokens:,} training tokens, every word at least once).", "",
                  "| corpus | LSTM | head | backend | tokens | train s | tokens/s | vs full | note |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in lm_rows:
            full = next((r for r in lm_rows if r["setting"] == row["setting"] and r["head"] == "full"
                         and "tokens_per_s" in r), None)
            if "tokens_per_s" in row:
                ratio = f"{row['tokens_per_s'] / full['tokens_per_s']:.2f}x" if full else "-"
                lines.append(f"| {row['setting']} | {row['size']} | {row['head']} | {row.get('backend', '-')} | "
                             f"{row['tokens']:,} | {row['train_s']:.1f} | {row['tokens_per_s']:,.0f} | {ratio} | |")
            else:
                lines.append(f"| {row['setting']} | {row['size']} | {row['head']} | - | - | - | - | - | "
                             f"{row.get('note', '')} |")
        lines += ["", "Commands (`--head HEAD` each; ZIPF_FOLDER is the synthetic corpus' folder):", ""]
        for setting in dict.fromkeys(r["setting"] for r in lm_rows):
            first = next(r for r in lm_rows if r["setting"] == setting)
            lines.append("- `" + first["command"].replace(f"--head {first['head']}", "--head HEAD") + "`")
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
    parser.add_argument("--zipf-words", type=int, default=256_000, help="vocabulary of the synthetic corpus (--lm)")
    parser.add_argument("--zipf-tokens", type=int, default=10_000_000,
                        help="training tokens of the synthetic corpus (--lm)")
    parser.add_argument("--lm-log-every", type=int, default=20,
                        help="steps between logged intervals (--lm); tokens/s is timed from the first")
    parser.add_argument("--no-tests", action="store_true", help="do not run the GPU tests first")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
                        / "gpu.md", help="the report (a folder: gpu.md in it), written again after every row")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of a method that fails")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device and torch.cuda.is_available() is False: nothing measured, "
              "nothing written", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
    report = Report(args.output, args, device, None if args.no_tests else run_gpu_tests())
    run_heads(args, device, report)
    if args.lm:
        run_lm(args, device, report)
    report.write()
    print(f"wrote {report.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
