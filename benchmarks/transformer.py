"""A decoder-only transformer with each head: whole-model training tokens/s, on a GPU and on the CPU.

**GPU** (the default): ``sohsm lm train --model transformer`` at GPT-2 small's size (12
blocks, width 768, 12 heads, context 512, batch 16 = 8,192 tokens a step, bf16 autocast,
float32 master weights, fused AdamW, dropout 0.1) with each head of ``--heads`` (every head's
defaults; the two-level heads on their sync-free Triton path, their default on CUDA), on
WikiText-2 (33k words) and on a synthetic Zipf corpus of ``--zipf-words`` words (256k;
:func:`gpu.write_zipf_corpus`). Each run is a process of its own and runs alone on the GPU,
``--gpu-tokens`` training tokens, no dev evaluation while it trains. The tokens/s reported is
that of the training clock after the first ``--log-every`` steps (allocation, autotuning and,
with ``--compile``, compilation fall in those); the whole run's rate stands beside it. Writes
``docs/benchmarks/transformer-gpu.md``. Without a CUDA device it says so in one line and exits
with status 1.

**CPU** (``--cpu``): the small model of the quality protocol (4 blocks, width 256, 4 heads,
context 128) on WikiText-2 (33k words), one training step after another of each head of
``--cpu-heads`` (the full softmax and the self-organized head) taking turns in one process on
one thread, so that both see the same load; each step is the loop's own (``sohsm.train.step.TrainStep``:
forward, backward, clipping, fused AdamW) on the run's own batches. Reported: the median step time
of ``--cpu-steps`` steps after ``--cpu-warmup``, tokens/s, and the ratio to the full softmax. The
self-organized head re-clusters every K steps (about 8 times an epoch); one re-clustering is timed
on its own after the steps and its cost spread over K steps in the last column. Writes
``docs/benchmarks/transformer.md``.

**Hugging Face** (``--hf``): a ``transformers`` ``LlamaForCausalLM`` built from a ``LlamaConfig`` (nothing
downloaded) at a Llama-3.2-1B-like shape (16 blocks, width 2048, MLP 8192, 32 attention heads, 8 key-value heads,
context 2048, batch 4 = 8,192 tokens a step; every size a flag) with **Llama 3's BPE vocabulary size, 128,256**,
untied as Llama 3 8B is (``--hf-tie``: tied). One row after another, each in a fresh model (same seed) on the same
batches, its memory freed before the next: HF's own ``lm_head`` and loss (the baseline), Liger Kernel's patched model
(``apply_liger_kernel_to_llama`` before the model is built: its fused linear cross-entropy with its RMSNorm, RoPE and
SwiGLU), Liger's fused linear cross-entropy alone, and sohsm's heads through ``sohsm.hf.use_head`` (``--hf-heads``:
``full``, ``self_organized`` attached to the optimizer with its default schedule, ``adaptive``,
``two_level_frequency``). A plain loop: bf16 autocast, float32 master weights, fused AdamW, ``--hf-warmup`` steps
untimed, then ``--hf-steps`` timed between two ``torch.cuda.synchronize()``; tokens/s, the ratio to HF's own head and
the peak memory (``torch.cuda.max_memory_allocated``). The token ids are a Zipf stream over the vocabulary (id =
frequency rank), not text: a step's speed depends on the vocabulary's size and its tokens' frequencies, not on what
the tokens say, and a real 128k BPE cannot be trained on the corpora at hand (WikiText-2 has too few distinct words
for 128k merges). The sohsm heads' ``counts`` are the stream's expected counts over ``--hf-corpus-tokens`` tokens (the
epoch that sets the self-organized head's K). A row that runs out of memory says so and the next one runs; the report
(``docs/benchmarks/transformer-hf-gpu.md``) is written again after every row. Without CUDA it says so in one line and
exits with status 1, unless ``--hf-device cpu`` (a smoke test at tiny sizes; its report goes to the temporary folder
unless ``--output`` names one).

Usage::

    python benchmarks/transformer.py                                 # GPU: every head, WikiText-2 and Zipf 256k
    python benchmarks/transformer.py --heads full self_organized --gpu-tokens 400000 --compile
    OMP_NUM_THREADS=1 python benchmarks/transformer.py --cpu         # CPU: full vs self_organized, one thread
    OMP_NUM_THREADS=1 python benchmarks/transformer.py --cpu --batch-size 8 --cpu-steps 8   # a shorter CPU run
    OMP_NUM_THREADS=1 python benchmarks/transformer.py --cpu --tokenizer bpe:32000 --cpu-heads full adaptive \
        two_level_frequency self_organized     # over 32k BPE tokens: docs/benchmarks/transformer-bpe-32000.md
    python benchmarks/transformer.py --hf                            # GPU: HF Llama, 128k vocabulary, every row
    python benchmarks/transformer.py --hf --hf-heads hf liger full self_organized --hf-batch 8   # 4 rows, 16k tokens
    python benchmarks/transformer.py --hf --hf-device cpu --hf-vocab 500 --hf-hidden 32 --hf-intermediate 64 \\
        --hf-layers 1 --hf-attention-heads 4 --hf-kv-heads 2 --hf-context 16 --hf-batch 2 --hf-steps 2   # smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

import sohsm
from _machine import command_line, machine, write_page

ROOT = Path(__file__).resolve().parent.parent
HEADS = ("full", "adaptive", "two_level_frequency", "self_organized")
CPU_HEADS = ("full", "self_organized")

#: GPT-2 small's shape, 8,192 tokens a step
GPU_MODEL = ["--model", "transformer", "--layers", "12", "--hidden-size", "768", "--attention-heads", "12",
             "--bptt", "512", "--batch-size", "16", "--dropout", "0.1"]
#: the small model of the CPU quality protocol (docs/results/transformer.md)
CPU_MODEL = {"model.architecture": "transformer", "model.layers": 4, "model.hidden_size": 256,
             "model.attention_heads": 4, "bptt": 128}


# -- GPU: whole runs of `sohsm lm train` ------------------------------------------------------------
def gpu_settings(args, tmp: Path) -> list[tuple[str, str, list[str]]]:
    """``(name, corpus, extra lm-train arguments)`` of each corpus: WikiText-2, then the Zipf corpus."""
    from gpu import write_zipf_corpus

    zipf = write_zipf_corpus(tmp / f"zipf-{args.zipf_words}", args.zipf_words, args.zipf_tokens, args.seed)
    return [("WikiText-2", "wikitext-2", []), (f"Zipf {args.zipf_words // 1000}k", str(zipf), ["--min-count", "1"])]


def steady_rate(run_dir: Path) -> tuple[float | None, float | None, int]:
    """``(tokens/s after the first log interval, tokens/s of the whole run, steps)`` from a run's train records."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        return None, None, 0
    last = train[-1]
    whole = last["tokens"] / last["elapsed_s"] if last["elapsed_s"] > 0 else None
    if len(train) < 2:
        return None, whole, last["step"]
    first = train[0]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    return ((last["tokens"] - first["tokens"]) / seconds if seconds > 0 else None), whole, last["step"]


def run_gpu(args) -> list[dict]:
    rows = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for setting, corpus, extra in gpu_settings(args, tmp):
            for head in args.heads:
                run_dir = tmp / f"{setting.split()[0]}-{head}"
                argv = ["lm", "train", "--corpus", corpus, "--head", head, "--run-dir", str(run_dir), *GPU_MODEL,
                        "--device", "cuda", "--amp", "bf16", "--max-tokens", str(args.gpu_tokens),
                        "--log-every", str(args.log_every), "--eval-every", "0", "--checkpoint-every", "0",
                        "--eval-batch-size", "4", "--seed", str(args.seed), "--quiet", *extra]
                if args.compile:
                    argv.append("--compile")
                done = subprocess.run([sys.executable, "-m", "sohsm", *argv], env=env, capture_output=True,
                                      text=True)
                shown = ["ZIPF_FOLDER" if a == corpus and extra else a for a in argv if a != str(run_dir)]
                row = {"setting": setting, "head": head, "command": "sohsm " + " ".join(shown).replace(
                    "--run-dir ", "--run-dir RUN ")}
                if done.returncode == 0:
                    row["tokens_per_s"], row["whole_tokens_per_s"], row["steps"] = steady_rate(run_dir)
                else:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    row["note"] = f"exit status {done.returncode}: {last[:160]}"
                rows.append(row)
                print(row, flush=True)
    return rows


def write_gpu_report(path: Path, args, rows: list[dict]) -> None:
    props = torch.cuda.get_device_properties(0)
    lines = [
        "# A transformer with each head on a GPU: whole-model training tokens/s", "",
        f"Device: {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, torch "
        f"{torch.__version__}, Python {platform.python_version()}, sohsm {sohsm.__version__}; "
        f"{datetime.date.today().isoformat()}.", "",
        f"Command: `python benchmarks/transformer.py {command_line(sys.argv[1:])}`", "",
        "GPT-2 small's shape: 12 blocks, width 768, 12 heads, context 512, batch 16 (8,192 tokens a step), bf16 "
        f"autocast, fused AdamW, dropout 0.1{', torch.compile' if args.compile else ''}; every head with its "
        f"defaults; {args.gpu_tokens:,} training tokens per run, each run alone on the GPU; *tokens/s*: the training "
        f"clock after the first {args.log_every} steps, *whole run*: from the first step. Zipf: a synthetic corpus "
        f"of {args.zipf_words:,} words ({args.zipf_tokens:,} training tokens, every word at least once).", "",
        "| corpus | head | steps | tokens/s | whole run | vs full | vs adaptive | note |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        def ratio(other: str) -> str:
            peer = next((r for r in rows if r["setting"] == row["setting"] and r["head"] == other
                         and r.get("tokens_per_s")), None)
            return f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer and row.get("tokens_per_s") else "-"

        if row.get("tokens_per_s"):
            lines.append(f"| {row['setting']} | {row['head']} | {row['steps']} | {row['tokens_per_s']:,.0f} | "
                         f"{row['whole_tokens_per_s']:,.0f} | {ratio('full')} | {ratio('adaptive')} | |")
        else:
            lines.append(f"| {row['setting']} | {row['head']} | - | - | - | - | - | {row.get('note', '')} |")
    lines += ["", "Commands (`--head HEAD` each; ZIPF_FOLDER is the synthetic corpus' folder, RUN a fresh folder):", ""]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        first = next(r for r in rows if r["setting"] == setting)
        lines.append("- `" + first["command"].replace(f"--head {first['head']}", "--head HEAD") + "`")
    write_page(path, lines)


# -- CPU: training steps taking turns in one process ------------------------------------------------
def cpu_trainer(head_name: str, args):
    """The run's task, model, head and step (``TrainStep``) for ``head_name``, built as `sohsm lm train` builds them."""
    from sohsm.tasks.lm import LMConfig, LMTask
    from sohsm.train.distributed import Ranks
    from sohsm.train.step import TrainStep

    device = torch.device("cpu")
    config = LMConfig.from_overrides({**CPU_MODEL, "data.corpus": args.corpus, "head.name": head_name,
                                      "batch_size": args.batch_size, "seed": args.seed,
                                      **({"data.tokenizer": args.tokenizer} if args.tokenizer else {})})
    task = LMTask.load(config, device)
    model, head = task.build(device)
    optimizer = task.build_optimizer(model, head)
    head.attach(optimizer)
    step = TrainStep(task, model, head, optimizer, Ranks(device=device), config.optim.clip)
    model.train()
    head.train()
    return config, task, model, head, step


def run_cpu(args) -> tuple[list[dict], dict]:
    from sohsm.heads import SelfOrganizingHead
    from sohsm.train.progress import parameter_count

    trainers = {name: cpu_trainer(name, args) for name in args.cpu_heads}
    batches = {name: trainer[1].batches(0, 0) for name, trainer in trainers.items()}
    times: dict[str, list[float]] = {name: [] for name in trainers}
    tokens = args.batch_size * trainers[args.cpu_heads[0]][0].bptt
    for i in range(args.cpu_warmup + args.cpu_steps):
        for name, (_config, _task, _model, _head, step) in trainers.items():  # the heads take turns
            batch, _ = next(batches[name])
            start = time.perf_counter()
            step(batch, i + 1)
            if i >= args.cpu_warmup:
                times[name].append(time.perf_counter() - start)
        if i >= args.cpu_warmup:
            print(f"step {i + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in times), flush=True)
    rows = []
    for name, (_config, _task, model, head, _step) in trainers.items():
        row = {"head": name, "params": parameter_count(head), "model_params": parameter_count(model),
               "step_s": statistics.median(times[name]), "reclusterings": 0}
        if isinstance(head, SelfOrganizingHead):
            row["reclusterings"] = len(head.history)
            start = time.perf_counter()
            head.reassign()
            row["recluster_s"], row["K"] = time.perf_counter() - start, head.update_every
        rows.append(row)
    facts = {"vocab": len(trainers[args.cpu_heads[0]][1].vocab), "tokens": tokens}
    return rows, facts


def write_cpu_report(path: Path, args, rows: list[dict], facts: dict) -> None:
    full = next((r for r in rows if r["head"] == "full"), None)
    lines = [
        "# A transformer with each head on the CPU: training step tokens/s", "",
        f"Produced by `OMP_NUM_THREADS=1 python benchmarks/transformer.py {' '.join(sys.argv[1:])}` on "
        f"{datetime.date.today().isoformat()} ({machine()}, sohsm {sohsm.__version__}).", "",
        f"The small model of the CPU quality protocol: 4 blocks, width 256, 4 heads, context 128, batch "
        f"{args.batch_size} ({facts['tokens']:,} tokens a step), on {args.corpus} ({facts['vocab']:,} "
        f"{'words' if not args.tokenizer else f'subword tokens of --tokenizer {args.tokenizer}'}); "
        "AdamW (fused), clipping 1, every head with its defaults, as `sohsm lm train --model transformer` builds "
        "them. The heads' training steps (forward, backward, clipping, optimizer step: the loop's own) take "
        f"turns in one process on one thread; median of {args.cpu_steps} steps after {args.cpu_warmup}. "
        "*with re-clustering*: one re-clustering of the self-organized head, timed on its own, spread over its K "
        "steps.", "",
        "| head | head parameters | model parameters | step s | tokens/s | vs full | re-clustering s (K) | "
        "tokens/s with re-clustering | vs full |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rate = facts["tokens"] / row["step_s"]
        versus = f"{full['step_s'] / row['step_s']:.2f}x" if full else "-"
        if "recluster_s" in row:
            amortised = row["step_s"] + row["recluster_s"] / row["K"]
            recluster = f"{row['recluster_s']:.2f} ({row['K']})"
            with_re = f"{facts['tokens'] / amortised:,.0f}"
            versus_re = f"{full['step_s'] / amortised:.2f}x" if full else "-"
        else:
            recluster, with_re, versus_re = "-", f"{rate:,.0f}", versus
        lines.append(f"| {row['head']} | {row['params'] / 1e6:.2f}M | {row['model_params'] / 1e6:.2f}M | "
                     f"{row['step_s']:.3f} | {rate:,.0f} | {versus} | {recluster} | {with_re} | {versus_re} |")
    write_page(path, lines)


# -- Hugging Face: a Llama with Llama 3's 128k vocabulary, with HF's head, Liger's and sohsm's ---------
#: Llama 3's BPE vocabulary (``meta-llama/Llama-3.*``'s ``vocab_size``)
LLAMA3_VOCAB = 128_256
#: the rows of ``--hf``, in order: (key, what the row is)
HF_ROWS = {
    "hf": "HF lm_head + its loss",
    "liger": "Liger patched model",
    "liger_flce": "Liger fused linear CE alone",
    "full": "sohsm full",
    "self_organized": "sohsm self_organized",
    "adaptive": "sohsm adaptive",
    "two_level_frequency": "sohsm two_level_frequency",
}
#: the rows that are sohsm heads, given to the model by ``sohsm.hf.use_head``
HF_SOHSM_ROWS = ("full", "self_organized", "adaptive", "two_level_frequency")


def hf_zipf_batches(args) -> tuple[torch.Tensor, torch.Tensor]:
    """``([steps, batch, context] token ids, [vocab] counts)``: a Zipf stream over the vocabulary (id = frequency
    rank), the same for every row, and its expected counts over ``--hf-corpus-tokens`` tokens."""
    from gpu import zipf_probabilities

    probs = zipf_probabilities(args.hf_vocab, "cpu")
    generator = torch.Generator().manual_seed(args.seed)
    steps = args.hf_warmup + args.hf_steps
    ids = torch.multinomial(probs, steps * args.hf_batch * args.hf_context, replacement=True, generator=generator)
    counts = (probs * args.hf_corpus_tokens).round().long()
    return ids.view(steps, args.hf_batch, args.hf_context), counts


def llama_config(args):
    """A ``LlamaConfig`` of ``--hf-*``'s sizes (Llama 3's RoPE base; nothing downloaded)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=args.hf_vocab, hidden_size=args.hf_hidden, intermediate_size=args.hf_intermediate,
                       num_hidden_layers=args.hf_layers, num_attention_heads=args.hf_attention_heads,
                       num_key_value_heads=args.hf_kv_heads, max_position_embeddings=args.hf_context,
                       tie_word_embeddings=args.hf_tie,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                       bos_token_id=None, eos_token_id=None, use_cache=False)


@contextlib.contextmanager
def liger_patched(body: bool):
    """Liger Kernel's ``apply_liger_kernel_to_llama`` with its fused linear cross-entropy (and, ``body``, its RMSNorm,
    RoPE and SwiGLU) while the ``with`` block builds and trains a model; the patches undone after it, so the rows that
    follow run HF's own Llama. Raises ``Skipped`` where Liger Kernel is not installed."""
    from gpu import Skipped

    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama
    except ImportError as error:
        raise Skipped(f"liger-kernel not installed ({error.name})") from None
    import torch.nn.functional as F
    from transformers.models.llama import modeling_llama

    # Liger patches the module's names (the classes a new model is built from) and LlamaForCausalLM.forward
    names = dict(vars(modeling_llama))
    classes = [c for c in names.values() if isinstance(c, type) and c.__module__ == modeling_llama.__name__]
    forwards = {c: c.__dict__.get("forward") for c in classes}
    cross_entropy = F.cross_entropy
    try:
        apply_liger_kernel_to_llama(rope=body, rms_norm=body, swiglu=body, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
        yield
    finally:
        for name in set(vars(modeling_llama)) - set(names):
            delattr(modeling_llama, name)
        vars(modeling_llama).update(names)
        for cls, forward in forwards.items():
            if forward is not None:
                cls.forward = forward
            elif "forward" in cls.__dict__:
                delattr(cls, "forward")
        F.cross_entropy = cross_entropy


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def free_memory(device: torch.device) -> None:
    """What the last row left (its model, optimizer, a traceback's frames) given back before the next row."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_hf_row(key: str, row: dict, args, config, batches: torch.Tensor, counts: torch.Tensor,
                   device: torch.device) -> None:
    """Build row ``key``'s model (seed ``--seed``) and train it on ``batches``; its figures go into ``row`` as they
    come (so a row that fails keeps what it measured)."""
    from transformers import LlamaForCausalLM

    import sohsm.hf
    from sohsm.heads import SelfOrganizingHead
    from sohsm.train.progress import parameter_count

    patch = liger_patched(body=key == "liger") if key.startswith("liger") else contextlib.nullcontext()
    with patch:
        torch.manual_seed(args.seed)
        with torch.device(device):
            model = LlamaForCausalLM(config)
        head = None
        if key in HF_SOHSM_ROWS:  # a fresh model: its random rows (tied or not) are not worth keeping
            head = sohsm.hf.use_head(model, key, counts=counts, keep_weights=not args.hf_tie and key == "full")
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.hf_lr, fused=True)
        if head is not None:
            head.attach(optimizer)  # the self-organized head re-clusters on its default schedule
        row["params"] = parameter_count(model)
        row["head_params"] = parameter_count(head if head is not None else model.get_output_embeddings())
        batches = batches.to(device)

        def step(ids: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        losses = [step(ids) for ids in batches[:args.hf_warmup]]
        so = head if isinstance(head, SelfOrganizingHead) else None
        before = len(so.history) if so is not None else 0
        synchronize(device)
        start = time.perf_counter()
        for ids in batches[args.hf_warmup:]:
            losses.append(step(ids))
        synchronize(device)
        seconds = time.perf_counter() - start
        row["step_ms"] = 1000 * seconds / args.hf_steps
        row["tokens_per_s"] = args.hf_steps * args.hf_batch * args.hf_context / seconds
        row["first_loss"] = float(losses[0])
        row["last_loss"] = float(losses[-1])
        if device.type == "cuda":
            row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        if so is not None:  # one re-clustering more, timed on its own (it moves the optimizer's state too)
            row["K"], row["reclusterings"] = so.update_every, len(so.history) - before
            synchronize(device)
            start = time.perf_counter()
            so.reassign(optimizer)
            synchronize(device)
            row["recluster_ms"] = 1000 * (time.perf_counter() - start)
        if not (math.isfinite(row["first_loss"]) and math.isfinite(row["last_loss"])):
            row["note"] = "the loss is not finite"


def run_hf(args, device: torch.device, path: Path) -> list[dict]:
    """Every row of ``--hf-heads`` in turn; the report written again after each, so a crash loses nothing."""
    config = llama_config(args)
    batches, counts = hf_zipf_batches(args)
    rows: list[dict] = []
    for key in args.hf_heads:
        row = {"key": key, "name": HF_ROWS[key]}
        try:
            measure_hf_row(key, row, args, config, batches, counts, device)
        except Exception as error:  # a row that fails is reported, not fatal
            from gpu import Skipped

            if isinstance(error, Skipped):
                row["note"] = f"skipped: {error}"
            elif out_of_memory(error):
                row["note"] = "out of memory"
            else:
                row["note"] = f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"
            if args.verbose and not isinstance(error, Skipped):
                traceback.print_exc()
        free_memory(device)
        rows.append(row)
        write_hf_report(path, args, device, config, rows)
        print(format_hf_row(row, rows), flush=True)
    return rows


def format_hf_row(row: dict, rows: list[dict]) -> str:
    baseline = next((r for r in rows if r["key"] == "hf" and r.get("tokens_per_s")), None)
    versus = f"{row['tokens_per_s'] / baseline['tokens_per_s']:.2f}x" if baseline and row.get("tokens_per_s") else "-"

    def number(key: str, fmt: str) -> str:
        return fmt.format(row[key]) if row.get(key) is not None else "-"

    loss = f"{row['first_loss']:.3f} → {row['last_loss']:.3f}" if "last_loss" in row else "-"
    recluster = "-"
    if "recluster_ms" in row:
        recluster = f"K {row['K']}, {row['reclusterings']} in the timed steps; one: {row['recluster_ms']:,.1f} ms"
    return (f"| {row['name']} | {number('head_params', '{:,}')} | {number('params', '{:,}')} | "
            f"{number('step_ms', '{:,.1f}')} | {number('tokens_per_s', '{:,.0f}')} | {versus} | "
            f"{number('peak_gib', '{:.1f}')} | {loss} | {recluster} | {row.get('note', '')} |")


def write_hf_report(path: Path, args, device: torch.device, config, rows: list[dict]) -> None:
    from gpu import package_version

    versions = ", ".join(f"{p} {package_version(p)}" for p in ("transformers", "liger-kernel", "triton")
                         if package_version(p))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = (f"Device: {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, torch "
                 f"{torch.__version__}, {versions}, Python {platform.python_version()}, sohsm {sohsm.__version__}; "
                 f"{datetime.date.today().isoformat()}.")
    else:
        where = (f"Device: **{device.type}, a smoke test of the rows, not a measurement of the GPU's** ({machine()}, "
                 f"{versions}, sohsm {sohsm.__version__}); {datetime.date.today().isoformat()}.")
    tokens = args.hf_batch * args.hf_context
    lines = [
        "# A Hugging Face Llama with Llama 3's 128k vocabulary: HF's head, Liger's and sohsm's", "",
        where, "",
        f"Command: `python benchmarks/transformer.py {command_line(args.argv)}`", "",
        f"`transformers`' `LlamaForCausalLM` from a `LlamaConfig` (nothing downloaded): {args.hf_layers} blocks, width "
        f"{args.hf_hidden}, MLP {args.hf_intermediate}, {args.hf_attention_heads} attention heads "
        f"({args.hf_kv_heads} key-value), context {args.hf_context}, batch {args.hf_batch} ({tokens:,} tokens a step), "
        f"vocabulary {args.hf_vocab:,}, {'tied' if args.hf_tie else 'untied'}, attention "
        f"`{getattr(config, '_attn_implementation', None) or 'default'}`. Each row in a fresh model (seed {args.seed}) "
        "on the same batches, one row at a time, its memory freed before the next; a plain loop: bf16 autocast, "
        f"float32 master weights, fused AdamW (lr {args.hf_lr:g}), {args.hf_warmup} warm-up steps untimed, then "
        f"{args.hf_steps} timed steps between two synchronisations. *tokens/s*: input tokens (batch x context) a "
        "second of the timed steps; *vs HF*: over HF's own head's; *peak*: `torch.cuda.max_memory_allocated` over the "
        "steps (weights, gradients, AdamW's state and activations); *loss*: the first step's and the last's.", "",
        "Token ids: a Zipf stream over the vocabulary (id = frequency rank), the same for every row. A step's speed "
        "depends on the vocabulary's size and its tokens' frequencies, not on the text, so no tokenizer runs; a real "
        "128k BPE cannot be trained on the corpora at hand (WikiText-2 has too few distinct words for 128k merges). "
        f"The sohsm heads' `counts` are the stream's expected counts over {args.hf_corpus_tokens:,} tokens (the epoch "
        "from which the self-organized head's default schedule sets K); the self-organized head is attached to the "
        "optimizer (`head.attach`), its re-clusterings within the timed steps count in its tokens/s, and one more is "
        "timed on its own after them.", "",
        "Rows: *HF lm_head + its loss*: the model as `transformers` builds it (its loss upcasts the logits to "
        "float32); *Liger patched model*: `apply_liger_kernel_to_llama(fused_linear_cross_entropy=True)` before the "
        "model is built, with Liger's defaults (its RMSNorm, RoPE and SwiGLU kernels too, so its ratio is not the "
        "output layer's alone); *Liger fused linear CE alone*: the same with `rope`, `rms_norm` and `swiglu` off; "
        "*sohsm HEAD*: `sohsm.hf.use_head(model, HEAD, counts=counts)` in place of `lm_head`, every head's defaults.",
        "",
        "| row | head parameters | model parameters | step ms | tokens/s | vs HF | peak GiB | loss | re-clustering "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|",
        *(format_hf_row(row, rows) for row in rows),
    ]
    write_page(path, lines)


def main_hf(args) -> int:
    device = torch.device(args.hf_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/transformer.py --hf needs a CUDA device and torch.cuda.is_available() is False: nothing "
              "measured, nothing written (--hf-device cpu runs the rows as a smoke test)", file=sys.stderr)
        return 1
    if args.hf_steps < 1 or args.hf_warmup < 0:
        print("benchmarks/transformer.py --hf: --hf-steps must be at least 1 and --hf-warmup at least 0",
              file=sys.stderr)
        return 1
    try:
        import sohsm.hf  # noqa: F401
    except ImportError as error:
        print(f"benchmarks/transformer.py --hf needs transformers (pip install 'sohsm[hf]'): {error}", file=sys.stderr)
        return 1
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
        path = args.output or ROOT / "docs" / "benchmarks" / "transformer-hf-gpu.md"
    else:
        path = args.output or Path(tempfile.gettempdir()) / "transformer-hf-cpu.md"
    run_hf(args, device, path)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU section instead of the GPU runs")
    parser.add_argument("--heads", nargs="+", default=list(HEADS), help="heads of the GPU runs")
    parser.add_argument("--gpu-tokens", type=int, default=1_000_000, help="training tokens per GPU run")
    parser.add_argument("--log-every", type=int, default=10, help="GPU runs: steps of the first, untimed interval")
    parser.add_argument("--compile", action="store_true", help="GPU runs: torch.compile model and head")
    parser.add_argument("--zipf-words", type=int, default=256_000, help="vocabulary of the synthetic corpus")
    parser.add_argument("--zipf-tokens", type=int, default=4_000_000, help="training tokens of the synthetic corpus")
    parser.add_argument("--cpu-heads", nargs="+", default=list(CPU_HEADS), help="heads of the CPU section")
    parser.add_argument("--corpus", default="wikitext-2", help="CPU section: the corpus")
    parser.add_argument("--tokenizer", metavar="bpe:SIZE|FILE", help="CPU section: subword tokens (lm train's "
                        "--tokenizer) instead of words; the page is then transformer-SIZE.md")
    parser.add_argument("--batch-size", type=int, default=32, help="CPU section: columns (x 128 tokens a step)")
    parser.add_argument("--cpu-steps", type=int, default=10, help="CPU section: timed steps per head")
    parser.add_argument("--cpu-warmup", type=int, default=2, help="CPU section: untimed steps first")
    hf = parser.add_argument_group("--hf: a Hugging Face Llama with Llama 3's 128k vocabulary")
    hf.add_argument("--hf", action="store_true", help="the Hugging Face rows instead of the GPU runs")
    hf.add_argument("--hf-device", default="cuda", help="cuda (the default) or cpu, for a smoke test at tiny sizes")
    hf.add_argument("--hf-heads", nargs="+", choices=list(HF_ROWS), default=list(HF_ROWS), metavar="ROW",
                    help="the rows, in order: " + ", ".join(f"{k} ({v})" for k, v in HF_ROWS.items()))
    hf.add_argument("--hf-vocab", type=int, default=LLAMA3_VOCAB, help="vocabulary (Llama 3's BPE: 128,256)")
    hf.add_argument("--hf-hidden", type=int, default=2048, help="width")
    hf.add_argument("--hf-intermediate", type=int, default=8192, help="the MLP's width")
    hf.add_argument("--hf-layers", type=int, default=16, help="blocks")
    hf.add_argument("--hf-attention-heads", type=int, default=32, help="attention heads")
    hf.add_argument("--hf-kv-heads", type=int, default=8, help="key-value heads (grouped-query attention)")
    hf.add_argument("--hf-context", type=int, default=2048, help="tokens per sequence")
    hf.add_argument("--hf-batch", type=int, default=4, help="sequences per step")
    hf.add_argument("--hf-tie", action="store_true", help="tie the output embedding to the input's (Llama 3.2 1B's "
                    "config ties; Llama 3 8B's does not)")
    hf.add_argument("--hf-steps", type=int, default=20, help="timed steps per row")
    hf.add_argument("--hf-warmup", type=int, default=5, help="untimed steps first")
    hf.add_argument("--hf-lr", type=float, default=3e-4, help="AdamW's learning rate")
    hf.add_argument("--hf-corpus-tokens", type=int, default=100_000_000,
                    help="the epoch the sohsm heads' counts stand for (sets the self-organized head's K)")
    hf.add_argument("--verbose", action="store_true", help="--hf: print the traceback of a row that fails")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, help="the page to write (default: docs/benchmarks/transformer.md "
                        "for --cpu, docs/benchmarks/transformer-gpu.md for the GPU, "
                        "docs/benchmarks/transformer-hf-gpu.md for --hf, transformer-hf-cpu.md in the temporary "
                        "folder for --hf --hf-device cpu)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.hf:
        return main_hf(args)
    if args.cpu:
        torch.set_num_threads(1)
        rows, facts = run_cpu(args)
        page = "transformer.md" if not args.tokenizer else f"transformer-{args.tokenizer.replace(':', '-')}.md"
        write_cpu_report(args.output or ROOT / "docs" / "benchmarks" / page, args, rows, facts)
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/transformer.py needs a CUDA device for its GPU runs and torch.cuda.is_available() is False: "
              "nothing measured, nothing written (--cpu runs the CPU section)", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name(0)}", flush=True)
    rows = run_gpu(args)
    write_gpu_report(args.output or ROOT / "docs" / "benchmarks" / "transformer-gpu.md", args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
