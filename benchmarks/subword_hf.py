"""The subword benchmark's model built as a Hugging Face ``LlamaForCausalLM``, trained by the ``Trainer`` with the
full and the self-organized head (``sohsm.hf.use_head``), beside sohsm's own transformer (issue 42).

Two steps, each resumable, as in ``benchmarks/subword.py``, whose protocol this reuses:

``train`` trains, for each vocabulary (``bpe:SIZE``), seed and head, one ``LlamaForCausalLM`` and evaluates it on
valid and test. Everything but the model's architecture is the sohsm run's of the same vocabulary, head and seed
(``subword.py``'s ``HEAD-tied`` run), read from the same places:

* **Settings.** The flags ``subword.py`` gives ``sohsm lm train`` (``fair_quality.py``'s ``transformer-wikitext-2``:
  WikiText-2, 4 blocks of 256, 4 attention heads, context 128, batch 32, 1M training tokens; ``--tokenizer
  bpe:SIZE --head HEAD --tie-weights --seed S``) are parsed by sohsm's own ``lm train`` parser into its run config
  (:class:`sohsm.tasks.lm.LMConfig`, the transformer's defaults included), and every setting below is read from it.
* **Tokens.** The corpus is that config's (``sohsm.tasks.lm.task.load_lm_corpus``: the same byte-level BPE trained
  on the same training split, from sohsm's cache; ids ordered by training count; ``vocab.counts`` for the head).
* **Model.** ``LlamaConfig(vocab_size=len(vocab), hidden_size=256, intermediate_size=4 * 256 (sohsm's MLP width),
  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
  tie_word_embeddings=True, attention_dropout=sohsm's dropout (0.2))``, every other field Llama's default (RMSNorm,
  SwiGLU MLP, rotary positions, no biases, no dropout on embeddings or residual branches, which Llama does not
  have), then ``sohsm.hf.use_head(model, HEAD, counts=vocab.counts, **sohsm's head options)`` (K of the
  self-organized head: its own automatic choice, ~8 re-clusterings per epoch, as in sohsm's run).
* **Training.** ``transformers.Trainer`` (``callbacks=[sohsm.hf.HeadCallback()]``, ``use_cpu=True``,
  ``report_to=[]``, a sequential sampler, no data-loading workers, ``seed`` = the run's) for sohsm's planned steps
  (1M tokens: ceil(1,000,000 / (32 x 128)) = 245 steps, 1,003,520 tokens), on **the same batches in the same
  order** as sohsm's run: step k reads rows [128k, 128k + 128) of the training ids laid out in 32 columns
  (``sohsm.data.batchify``), each column one example, its targets the next row (``shift_labels``: 128 targets
  per row, so the loss is the mean over 4,096 tokens as sohsm's is). The optimizer is sohsm's own
  (``sohsm.train.builders.build_optimizer``: AdamW at lr 1e-3, betas and eps torch's defaults, weight decay 0.1 on
  the blocks' linear weights only, none on the embedding, norms or head; fused where torch can), the rate sohsm's
  (``sohsm.train.schedule.schedule_factor``: 100 linear warm-up steps from lr / 100, then half a cosine to lr / 10
  at the last step), passed to the ``Trainer`` as ``optimizers=``; gradients clipped to norm 1 (``max_grad_norm``).
  The ``Trainer`` checkpoints every 200 steps into the run directory; run again to resume from there.
* **Evaluation** of the final model (sohsm's numbers are of its best dev checkpoint, which in a run shorter than
  an epoch with a cosine is its last; the report shows its step): sohsm's own code, ``sohsm.tasks.lm.evaluation.
  evaluate_stream`` with the Llama's final hidden states and the head, so the same windows as ``sohsm lm eval``:
  the split in 32 columns (``eval_batch_size``), each read in disjoint windows of 128 tokens (a token sees the 0
  to 127 before it in its window), every token but each column's first scored, at most 31 trailing tokens
  dropped. Then ``sohsm.tasks.lm.run.split_scores`` with the corpus's words and bytes of the split: the mean NLL
  per scored token extended to the whole split, ``ppl per word = exp(L / words)`` (one ``<eos>`` per line
  counted) and ``bits per byte = L / ln 2 / UTF-8 bytes``, exactly as ``sohsm lm eval`` computes them.

``docs/results/subword-hf/bpe-SIZE/seed-S/hf-llama-HEAD/result.json`` keeps each run (its settings, steps, tokens,
training tokens/s, the training loss every 25 steps, and valid and test scores); kept runs are skipped.

``report`` writes ``docs/results/subword-hf.md`` from the kept files alone, each HF run beside sohsm's own
``HEAD-tied`` run of the same vocabulary and seed read from ``docs/results/subword/`` (``subword.py``'s), "not run
yet" where either is missing, and the commands that train them.

Usage::

    python benchmarks/subword_hf.py train --vocabularies bpe:32000 --heads full --seeds 1
    python benchmarks/subword_hf.py train --seeds 1,2,3                  # every vocabulary and head
    python benchmarks/subword_hf.py report                               # writes docs/results/subword-hf.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import fair_quality
import subword
from fair_quality import PROTOCOLS, _paired

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "subword-hf"
REPORT = ROOT / "docs" / "results" / "subword-hf.md"
RESULT = "result.json"
#: ``--matched``: beside ``subword.py --matched``'s runs (rotary positions and no dropout in sohsm's transformer too)
MATCHED_RESULTS = ROOT / "docs" / "results" / "subword-hf-matched"
MATCHED_REPORT = ROOT / "docs" / "results" / "subword-hf-matched.md"

#: the heads trained by default; each is compared with sohsm's ``HEAD-tied`` run
HEADS = ("full", "self_organized")
SPLITS = ("valid", "test")
#: training loss kept every this many steps
LOSS_EVERY = 25
#: Trainer checkpoints every this many steps (as subword.py's --checkpoint-every), the last this many kept
SAVE_STEPS = 200
KEEP_CHECKPOINTS = 1


def run_name(head: str) -> str:
    return f"hf-llama-{head}"


def sohsm_run(head: str) -> str:
    """The sohsm run of ``subword.py`` an HF run is compared with."""
    return f"{head}-tied"


def sohsm_args(vocabulary: str, head: str, seed: int, corpus: str | None = None,
               extra: list[str] | None = None) -> list[str]:
    """The ``sohsm lm train`` flags of ``subword.py``'s ``HEAD-tied`` run (``extra`` after, overriding)."""
    protocol_corpus, settings, _ = PROTOCOLS[subword.PROTOCOL]
    return ["--corpus", corpus or protocol_corpus, *settings, "--tokenizer", vocabulary, "--head", head,
            "--tie-weights", "--seed", str(seed), *(extra or [])]


def sohsm_config(args: list[str]):
    """The run config ``sohsm lm train ARGS`` would train (its own parser and defaults; nothing trained)."""
    from sohsm.cli.train_options import add_training_options, head_overrides, requested_head_options, training_overrides
    from sohsm.tasks.lm import LMConfig

    parser = argparse.ArgumentParser(prog="sohsm lm train")
    flags = add_training_options(parser, LMConfig)
    parsed = parser.parse_args([*args, "--run-dir", "unused"])
    overrides = training_overrides(parsed, flags, LMConfig)
    options, update_every = requested_head_options(parsed)
    name = overrides.pop("head.name", LMConfig().head.name)
    file_options, file_k = overrides.pop("head.options", {}), overrides.pop("head.update_every", None)
    k = file_k if update_every is None else update_every
    overrides.update(head_overrides(name, {**file_options, **options}, k))
    config = LMConfig.from_overrides(overrides)
    config.validate()
    if config.model.architecture != "transformer":
        raise ValueError("the HF comparison is of sohsm's transformer (--model transformer)")
    if config.optim.lr_decay != 1.0 or config.optim.anneal != 1.0:
        raise ValueError("lr_decay and anneal are not reproduced in the HF run (the protocol leaves them at 1)")
    return config


def head_options(config) -> dict:
    """The options sohsm's run gives its head (``sohsm.tasks.heads.build_run_head``'s: the config's, K, the seed)."""
    from sohsm.heads import head_options as takes

    options = dict(config.head.options)
    if config.head.update_every is not None:
        options["update_every"] = config.head.update_every
    if "seed" not in options and "seed" in (takes(config.head.name) or {}):
        options["seed"] = config.seed
    return options


def llama_config(config, n_words: int):
    """A ``LlamaConfig`` of the sohsm transformer's sizes (Llama's own choices for everything else)."""
    from transformers import LlamaConfig

    from sohsm.models.transformer_lm import MLP_RATIO

    m = config.model
    return LlamaConfig(vocab_size=n_words, hidden_size=m.hidden_size, intermediate_size=MLP_RATIO * m.hidden_size,
                       num_hidden_layers=m.layers, num_attention_heads=m.attention_heads,
                       num_key_value_heads=m.attention_heads, max_position_embeddings=config.bptt,
                       tie_word_embeddings=m.tie_weights, attention_dropout=m.dropout, use_cache=False,
                       pad_token_id=None, bos_token_id=None, eos_token_id=None)


def _torch_parts():
    """Classes that need torch (imported when a run starts, so that ``report`` needs neither torch nor HF)."""
    import torch
    from torch import nn

    from sohsm.data.batching import batchify

    class Windows(torch.utils.data.Dataset):
        """sohsm's training batches as ``Trainer`` examples: step ``k``'s batch is examples ``kB .. kB + B - 1``,
        the ``B`` columns of rows ``[k bptt, k bptt + bptt)`` of the ``[T, B]`` layout, targets the next row
        (``sohsm.tasks.lm.task.LMTask.batches``); an epoch's last window may be shorter, then the next epoch."""

        def __init__(self, ids, batch_size: int, bptt: int, steps: int) -> None:
            self.data = batchify(ids, batch_size)  # [T, B]
            self.batch_size, self.bptt, self.steps = batch_size, bptt, steps
            self.epoch_length = self.data.size(0) - 1  # the last row is only a target
            self.steps_per_epoch = -(-self.epoch_length // bptt)

        def __len__(self) -> int:
            return self.steps * self.batch_size

        def rows(self, step: int) -> tuple[int, int]:
            row = (step % self.steps_per_epoch) * self.bptt
            return row, min(row + self.bptt, self.epoch_length)

        def tokens(self, first: int = 0, stop: int | None = None) -> int:
            """Training tokens (targets) of steps ``first .. stop - 1``."""
            return sum((b - a) * self.batch_size for a, b in map(self.rows, range(first, self.steps
                                                                                  if stop is None else stop)))

        def __getitem__(self, index: int) -> dict:
            step, column = divmod(index, self.batch_size)
            start, stop = self.rows(step)
            ids = self.data[start:stop + 1, column]
            return {"input_ids": ids[:-1], "labels": ids[:-1], "shift_labels": ids[1:]}

    class HiddenStates(nn.Module):
        """The Llama as sohsm's models are called: ``ids [T, B] -> (final hidden states [T, B, d], None)``; and the
        parameters weight decay applies to, as ``TransformerLM.decayed_parameters``: the blocks' linear weights."""

        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, state=None):
            hidden = self.model.model(input_ids=ids.t()).last_hidden_state  # [B, T, d]
            return hidden.transpose(0, 1), None

        def decayed_parameters(self) -> list:
            return [m.weight for layer in self.model.model.layers for m in layer.modules() if isinstance(m, nn.Linear)]

    return Windows, HiddenStates


def train_run(vocabulary: str, head_name: str, seed: int, run_dir: Path, corpus: str | None = None,
              extra: list[str] | None = None, quiet: bool = True) -> dict:
    """Train (or resume, from the last ``Trainer`` checkpoint in ``run_dir``) and evaluate one HF run; returns what
    ``result.json`` keeps."""
    import torch
    import transformers
    from transformers import LlamaForCausalLM, PrinterCallback, Trainer, TrainingArguments

    import sohsm.hf
    from sohsm.data.subwords import tokenizers_version
    from sohsm.tasks.lm.evaluation import evaluate_stream
    from sohsm.tasks.lm.model import build_model_and_head
    from sohsm.tasks.lm.run import split_scores
    from sohsm.tasks.lm.task import load_lm_corpus
    from sohsm.train.builders import build_optimizer, unique_parameters
    from sohsm.train.schedule import planned_steps, schedule_factor
    from sohsm.version import __version__

    Windows, HiddenStates = _torch_parts()
    args = sohsm_args(vocabulary, head_name, seed, corpus, extra)
    config = sohsm_config(args)
    data = load_lm_corpus(config)
    vocab = data.vocab
    windows = Windows(data.train, config.batch_size, config.bptt, 1)
    tokens_per_epoch = windows.epoch_length * config.batch_size
    planned = config.epochs * tokens_per_epoch if config.max_tokens is None else min(
        config.epochs * tokens_per_epoch, config.max_tokens)
    steps = planned_steps(planned, tokens_per_epoch, windows.steps_per_epoch, config.bptt * config.batch_size)
    windows.steps = steps

    sohsm_model, sohsm_head = build_model_and_head(config, vocab)  # only to count its parameters
    sohsm_parameters = sum(p.numel() for p in unique_parameters(sohsm_model, sohsm_head))
    del sohsm_model, sohsm_head

    transformers.set_seed(config.seed)
    model = LlamaForCausalLM(llama_config(config, len(vocab)))
    options = head_options(config)
    # a fresh model: a two-level head starts from its own clusters and vectors (it would keep a pretrained model's)
    head = sohsm.hf.use_head(model, head_name, counts=torch.from_numpy(vocab.counts.copy()),
                             keep_weights=head_name == "full", **options)
    states = HiddenStates(model)
    optimizer = build_optimizer(config, states, head)
    o = config.optim
    moves = o.warmup > 0 or o.lr_schedule != "constant"
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: schedule_factor(o.lr_schedule, s, o.warmup, steps) if moves else 1.0)

    training = TrainingArguments(
        output_dir=str(run_dir), max_steps=steps, per_device_train_batch_size=config.batch_size,
        learning_rate=o.learning_rate, weight_decay=o.weight_decay, max_grad_norm=o.clip or 0.0,
        warmup_steps=o.warmup, seed=config.seed, data_seed=config.seed, use_cpu=True, report_to=[],
        train_sampling_strategy="sequential", dataloader_num_workers=0, remove_unused_columns=False,
        logging_steps=min(LOSS_EVERY, max(1, steps // 4)), save_strategy="steps", save_steps=SAVE_STEPS,
        save_total_limit=KEEP_CHECKPOINTS,
        disable_tqdm=quiet, log_level="warning" if quiet else "passive")
    trainer = Trainer(model=model, args=training, train_dataset=windows, optimizers=(optimizer, scheduler),
                      callbacks=[sohsm.hf.HeadCallback()])
    if quiet:  # no line per logging step, no progress bar when a checkpoint is written
        trainer.remove_callback(PrinterCallback)
        transformers.utils.logging.disable_progress_bar()
    checkpoints = [int(p.name.split("-")[1]) for p in run_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    first = max(checkpoints, default=0)
    start = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=str(run_dir / f"checkpoint-{first}") if checkpoints else None)
    seconds = float(output.metrics.get("train_runtime", time.perf_counter() - start))
    trained = trainer.state.global_step
    sessions_file = run_dir / "sessions.json"  # each train() call's steps and seconds, for tokens/s over them all
    sessions = json.loads(sessions_file.read_text()) if checkpoints and sessions_file.exists() else []
    sessions = [s for s in sessions if s["stop"] <= first]
    if trained > first:
        sessions.append({"first": first, "stop": trained, "seconds": round(seconds, 3)})
    sessions_file.write_text(json.dumps(sessions))
    trained_tokens = sum(windows.tokens(s["first"], s["stop"]) for s in sessions)
    trained_seconds = sum(s["seconds"] for s in sessions)
    losses = [[h["step"], round(float(h["loss"]), 4)] for h in trainer.state.log_history if "loss" in h]

    scores = {}
    for split in SPLITS:
        ids = getattr(data, split)
        result = evaluate_stream(states, head, ids, config.eval_batch_size, config.bptt)
        scored = split_scores(result, ids.numel(), data.words.get(split), data.text_bytes.get(split),
                              data.tokenizer is not None)
        scores[split] = {key: value for key, value in scored.__dict__.items() if key != "subwords"}
    llama = model.config
    result = {
        "run": run_name(head_name), "vocabulary": vocabulary, "seed": seed, "head": head_name,
        "head_options": options, "K": getattr(head, "update_every", None),
        "compared_with": sohsm_run(head_name), "sohsm_flags": shlex.join(args),
        "corpus": data.signature,
        "llama": {key: getattr(llama, key) for key in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "attention_dropout",
            "hidden_act", "rms_norm_eps", "initializer_range")},
        "parameters": sum(p.numel() for p in unique_parameters(model)),
        "sohsm_parameters": sohsm_parameters,
        "optimizer": {"name": o.optimizer, "lr": o.learning_rate, "weight_decay": o.weight_decay,
                      "decayed": "the blocks' linear weights", "clip": o.clip, "schedule": o.lr_schedule,
                      "warmup": o.warmup, "fused": bool(optimizer.defaults.get("fused"))},
        "batch_size": config.batch_size, "bptt": config.bptt, "steps": trained, "planned_steps": steps,
        "tokens": windows.tokens(0, trained),
        "train_seconds": round(trained_seconds, 2),
        "train_tokens_per_s": trained_tokens / trained_seconds if trained_seconds > 0 and sessions else None,
        "sessions": len(sessions), "threads": torch.get_num_threads(),
        "train_loss": losses,
        "valid": scores["valid"], "test": scores["test"],
        "versions": {"sohsm": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers_version()},
    }
    return result


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1) + "\n")
    temporary.replace(path)


def train(vocabularies: list[str], seeds: list[int], heads: list[str], runs_dir: Path, results: Path = RESULTS,
          corpus: str | None = None, extra: list[str] | None = None, quiet: bool = True) -> int:
    """Train, evaluate and keep each run not kept yet; 1 if any failed. ``corpus`` and ``extra`` (``sohsm lm
    train`` flags after the protocol's, which they override) are for a smoke test on a small text."""
    failed = 0
    for vocabulary in vocabularies:
        for seed in seeds:
            for head in heads:
                name = run_name(head)
                kept = results / subword._folder_name(vocabulary) / f"seed-{seed}" / name
                if (kept / RESULT).exists():
                    continue
                run = runs_dir / subword._folder_name(vocabulary) / f"seed-{seed}" / name
                flags = shlex.join(sohsm_args(vocabulary, head, seed, corpus, extra))
                print(f"{vocabulary} seed {seed} {name}: the settings of sohsm lm train {flags}", flush=True)
                try:
                    result = train_run(vocabulary, head, seed, run, corpus, extra, quiet)
                except Exception as error:  # noqa: BLE001 - one run's failure must not stop the others
                    print(f"  failed: {type(error).__name__}: {error}", flush=True)
                    failed += 1
                    continue
                _write_json(kept / RESULT, result)
                test = result["test"]
                print(f"  {result['steps']} steps, {result['tokens']:,} tokens; test ppl per word "
                      f"{test['ppl_word']:.2f}, {test['bits_per_byte']:.4f} bits per byte", flush=True)
    return 1 if failed else 0


# -- the report ---------------------------------------------------------------------------------------------------
def _hf_summary(folder: Path) -> dict | None:
    path = folder / RESULT
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    return {"steps": r["steps"], "tokens": r["tokens"], "dev_token": r["valid"]["ppl"], "test_token": r["test"]["ppl"],
            "dev_word": r["valid"]["ppl_word"], "test_word": r["test"]["ppl_word"],
            "dev_bpb": r["valid"]["bits_per_byte"], "test_bpb": r["test"]["bits_per_byte"],
            "tokens_per_s": r["train_tokens_per_s"], "parameters": r["parameters"],
            "sohsm_parameters": r["sohsm_parameters"], "K": r.get("K"), "corpus": r.get("corpus")}


def _sohsm_summary(folder: Path) -> dict | None:
    """``subword.py``'s kept run: its numbers (of ``best.pt``), the step of that checkpoint and the run's steps."""
    summary = subword._summary(folder)
    if summary is None:
        return None
    valid = json.loads((folder / "valid.json").read_text())
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = max((r for r in records if "step" in r), key=lambda r: r["step"], default={})
    return {**summary, "dev_token": valid["ppl"], "best_step": valid.get("step"), "steps": last.get("step"),
            "tokens": last.get("tokens")}


def _number(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def report(output: Path = REPORT, results: Path = RESULTS, sohsm_results: Path = subword.RESULTS,
           matched: bool = False) -> str:
    """Write the report from the kept runs, and its figures by name beside it (``subword-hf.json``); return the
    report. ``matched``: of the ``--matched`` runs, whose sohsm transformer takes Llama's rotary positions and no
    dropout."""
    corpus, settings, title = PROTOCOLS[subword.PROTOCOL]
    flag = " --matched" if matched else ""
    positions = ("| positions | rotary (base 10000; `--positions rotary`) | rotary (base 10000) |" if matched else
                 "| positions | learned, 128 vectors | rotary (base 10000) |")
    dropout = ("| dropout | none (`--dropout 0`) | none (attention dropout: sohsm's, 0) |" if matched else
               "| dropout 0.2 | embeddings, attention weights, residual branches | attention weights only |")
    lines = ["# Subword vocabularies: sohsm's transformer against the same model as a Hugging Face Llama"
             + (", matched: rotary positions, no dropout" if matched else ""),
             "",
             *(["The runs of `--matched`: sohsm's transformer as like the Llama as its flags make it "
                f"(`{' '.join(subword.MATCHED_FLAGS)}` after the protocol's flags, in both models' runs), to see how "
                "much of the gap between the two models of [subword-hf.md](subword-hf.md) their positions and "
                "dropout make. What still differs: norm, MLP, biases and initialisation.", ""] if matched else []),
             f"Generated by `python benchmarks/subword_hf.py report{flag}` from the kept runs in "
             f"[{results.name}/]({results.name}/)",
             "(each run's `result.json`) and, beside them, `benchmarks/subword.py`'s runs of sohsm's own transformer",
             f"in [{sohsm_results.name}/]({sohsm_results.name}/)"
             + ("" if matched else " ([subword.md](subword.md))") + ". Issue 42: the same model built as a "
                                                                    "`transformers`",
             "`LlamaForCausalLM`, with the full and the self-organized head (`sohsm.hf.use_head`), trained by the",
             "`Trainer` (`sohsm.hf.HeadCallback()`) for the same tokens, should reach the same perplexity as sohsm's",
             "transformer within seed noise.",
             "",
             f"Protocol: {title} (`fair_quality.py`'s `{subword.PROTOCOL}`) with `--tokenizer bpe:SIZE --tie-weights`.",
             "The HF run takes every setting from the config `sohsm lm train` builds from the same flags, the same",
             "token ids (sohsm's BPE and vocabulary, from its cache), **the same batches in the same order** (step k:",
             "rows [128k, 128k + 128) of the training ids in 32 columns, targets the next row), sohsm's optimizer",
             "(AdamW, lr 1e-3, weight decay 0.1 on the blocks' linear weights only, clip 1) and rate (100 warm-up",
             "steps, cosine to lr / 10), and is scored by sohsm's own evaluation (the same disjoint 128-token windows",
             "in 32 columns, words and bytes as `sohsm lm eval` counts them). What differs is the model, as Llama",
             "builds it:",
             "",
             "| | sohsm transformer | HF `LlamaForCausalLM` |",
             "|---|---|---|",
             "| blocks, width, attention heads, context | 4, 256, 4, 128 | 4, 256, 4 (4 key-value heads), 128 |",
             "| norm | LayerNorm (pre-norm), with bias | RMSNorm (pre-norm) |",
             "| MLP | GELU, 256 → 1024 → 256, biases | SwiGLU, intermediate 1024 (gate, up, down), no biases |",
             positions,
             dropout,
             "| initialisation | normal(0, 0.02), residual projections / sqrt(2L) | normal(0, 0.02) |",
             "| embedding and head | tied | tied (`tie_word_embeddings=True`) |",
             "| numbers of | the best dev checkpoint (`best.pt`) | the final model |",
             "",
             "*ppl/token* compares only within a vocabulary; *ppl/word* (exp(loss of the split / its words, one",
             "`<eos>` per line counted)) and *bits/byte* (loss in bits / the UTF-8 bytes of the split's text) across",
             "them. *tokens/s* is each run's own on the CPU, trained beside other jobs: a guide, not a speed",
             "comparison. *HF / sohsm - 1* is the ratio of test perplexities per word, seed by seed "
             "(a paired t-test on",
             "log perplexity over the seeds where there are several); *sohsm's seed spread* is the standard deviation",
             "of log test perplexity per word over sohsm's own seeds, the noise the difference is to be read against.",
             *([] if matched else ["The same comparison with sohsm's transformer given Llama's rotary positions and "
                                   "no dropout (`--matched`): [subword-hf-matched.md](subword-hf-matched.md)."]),
             ""]
    figures: dict = {}
    vocabularies = set(subword.VOCABULARIES)
    for root in (results, sohsm_results):
        if root.is_dir():
            vocabularies |= {p.name.replace("-", ":", 1) for p in root.iterdir()
                             if p.is_dir() and p.name.startswith("bpe-")}
    for vocabulary in sorted(vocabularies, key=lambda v: int(v.split(":")[1])):
        folder = subword._folder_name(vocabulary)
        seeds = sorted({int(p.name.split("-")[1]) for root in (results, sohsm_results)
                        for p in (root / folder).glob("seed-*")} or {1})
        lines += [f"## {vocabulary}", "",
                  "| model | head | seed | steps | training tokens | dev ppl/token | test ppl/token | dev ppl/word "
                  "| test ppl/word | dev bits/byte | test bits/byte | parameters | tokens/s |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        pairs: dict[str, list[tuple[int, dict | None, dict | None]]] = {}
        for head in HEADS:
            for seed in seeds:
                ours = _sohsm_summary(sohsm_results / folder / f"seed-{seed}" / sohsm_run(head))
                hf = _hf_summary(results / folder / f"seed-{seed}" / run_name(head))
                pairs.setdefault(head, []).append((seed, ours, hf))
                for model, row in (("sohsm transformer", ours), ("HF Llama", hf)):
                    label = sohsm_run(head) if model.startswith("sohsm") else f"`use_head(model, \"{head}\")`"
                    if row is None:
                        lines.append(f"| {model} | {label} | {seed} | not run yet |" + " |" * 9)
                        continue
                    steps = _number(row.get("steps"), "d")
                    if model.startswith("sohsm") and row.get("best_step") not in (None, row.get("steps")):
                        steps += f" (best.pt: {row['best_step']})"
                    params = row.get("parameters") if model == "HF Llama" else (hf or {}).get("sohsm_parameters")
                    lines.append(
                        f"| {model} | {label} | {seed} | {steps} | {_number(row.get('tokens'), ',')} | "
                        f"{row['dev_token']:.2f} | {row['test_token']:.2f} | {row['dev_word']:.2f} | "
                        f"{row['test_word']:.2f} | {row['dev_bpb']:.4f} | {row['test_bpb']:.4f} | "
                        f"{_number(params, ',')} | {_number(row.get('tokens_per_s'), ',.0f')} |")
        lines.append("")
        for head, rows in pairs.items():
            common = [(seed, ours, hf) for seed, ours, hf in rows if ours and hf]
            text = f"- {head}: HF / sohsm - 1, test ppl per word "
            if common:
                text += _paired([hf["test_word"] for _, _, hf in common], [ours["test_word"] for _, ours, _ in common])
                dev = _paired([hf["dev_word"] for _, _, hf in common], [ours["dev_word"] for _, ours, _ in common])
                text += f" [dev {dev}]"
            else:
                text += "not run yet (both runs of a seed are needed)"
            ours_all = [math.log(ours["test_word"]) for _, ours, _ in rows if ours]
            if len(ours_all) >= 2:
                mean = sum(ours_all) / len(ours_all)
                sd = math.sqrt(sum((x - mean) ** 2 for x in ours_all) / (len(ours_all) - 1))
                text += f"; sohsm's seed spread ±{math.expm1(sd) * 100:.2f}% ({len(ours_all)} seeds)"
            else:
                text += "; sohsm's seed spread: needs two seeds of its run"
            lines.append(text)
        text, figures[vocabulary] = _head_against_head(pairs)
        lines.append(text)
        lines += ["", "Commands (from the repository root; each skips what is kept):", "", "```",
                  f"python benchmarks/subword.py train{flag} --vocabularies {vocabulary} --runs "
                  f"{','.join(sohsm_run(h) for h in HEADS)} --seeds {','.join(map(str, seeds))}"]
        lines += [f"python benchmarks/subword_hf.py train{flag} --vocabularies {vocabulary} --heads {head} "
                  f"--seeds {','.join(map(str, seeds))}" for head in HEADS]
        lines += [("" if matched else "python benchmarks/subword.py report && ")
                  + f"python benchmarks/subword_hf.py report{flag}", "```", ""]
    text = "\n".join(lines)
    output.write_text(text)
    fair_quality.write_figures(output, figures)
    return text


def _head_against_head(pairs: dict[str, list[tuple[int, dict | None, dict | None]]]) -> tuple[str, dict]:
    """The line that reads the two models against each other where their architectures differ: within each model,
    the self-organized head against the full head (test ppl per word, seed by seed over the seeds both models
    have both heads of); and its figures by name."""
    first, second = HEADS
    by_seed = {seed: (ours, hf) for seed, ours, hf in pairs.get(first, [])}
    both = [(by_seed[seed], (ours, hf)) for seed, ours, hf in pairs.get(second, [])
            if seed in by_seed and ours and hf and all(by_seed[seed])]
    text = f"- {second} / {first} - 1 within each model, test ppl per word: "
    if not both:
        return text + "not run yet (both heads of both models in one seed are needed)", {}
    ours = _paired([b[0]["test_word"] for _, b in both], [a[0]["test_word"] for a, _ in both])
    hf = _paired([b[1]["test_word"] for _, b in both], [a[1]["test_word"] for a, _ in both])
    figures = {model: {f"{second} vs {first}": {"test_word": fair_quality.paired_figures(
        [b[i]["test_word"] for _, b in both], [a[i]["test_word"] for a, _ in both])}}
        for i, model in enumerate(("sohsm transformer", "HF Llama"))}
    return text + f"sohsm transformer {ours}, HF Llama {hf}", figures


def main(argv: list[str] | None = None) -> int:
    parser, t, r = fair_quality.command_line(__doc__, "train, evaluate and keep the HF runs (resumable)",
                                             "write docs/results/subword-hf.md from the kept runs", REPORT, RESULTS)
    t.add_argument("--vocabularies", default=",".join(subword.VOCABULARIES), help="comma-separated bpe:SIZE values "
                   f"(default: {','.join(subword.VOCABULARIES)})")
    t.add_argument("--heads", default=",".join(HEADS), help=f"comma-separated, of {', '.join(HEADS)}")
    t.add_argument("--runs-dir", type=Path, default=Path("runs/subword-hf"),
                   help="where the Trainer's run directories (checkpoints) go")
    t.add_argument("--results", type=Path, help="where the kept runs go (default: docs/results/subword-hf, with "
                   "--matched docs/results/subword-hf-matched)")
    for command in (t, r):
        command.add_argument("--matched", action="store_true", help="the runs whose sohsm transformer takes "
                             f"{' '.join(subword.MATCHED_FLAGS)} (subword.py --matched), kept and reported apart")
    t.add_argument("--progress", action="store_true", help="the Trainer's progress bar and log lines")
    # a smoke test on a small text: another corpus, and sohsm lm train flags that override the protocol's
    t.add_argument("--corpus", help=argparse.SUPPRESS)
    t.add_argument("--extra", default="", help=argparse.SUPPRESS)
    r.add_argument("--sohsm-results", type=Path, help="subword.py's kept runs (default: docs/results/subword, "
                   "with --matched docs/results/subword-matched)")
    args = parser.parse_args(argv)
    if args.command == "report":
        if args.matched:
            output = MATCHED_REPORT if args.output == REPORT else args.output
            results = MATCHED_RESULTS if args.results == RESULTS else args.results
            print(report(output, results, args.sohsm_results or subword.MATCHED_RESULTS, matched=True))
        else:
            print(report(args.output, args.results, args.sohsm_results or subword.RESULTS))
        return 0
    heads = fair_quality.chosen(parser, args.heads, HEADS, "heads")
    vocabularies = fair_quality.vocabularies(parser, args.vocabularies)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as subword.py's runs train: one thread each
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    results = args.results or (MATCHED_RESULTS if args.matched else RESULTS)
    extra = [*(subword.MATCHED_FLAGS if args.matched else ()), *args.extra.split()]
    return train(vocabularies, [int(s) for s in args.seeds.split(",")], heads, args.runs_dir, results,
                 args.corpus, extra, quiet=not args.progress)


if __name__ == "__main__":
    sys.exit(main())
