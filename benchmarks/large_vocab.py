"""Large vocabularies on real text: every head over Llama 3's 128,256 tokens (or o200k's 200,019) on WikiText-2.

The output layer has the tokenizer's whole vocabulary as rows (``--tokenizer llama3``: every id a row, though
WikiText-2's training split uses about 27,000 of them), as a model trained with that tokenizer has. Subcommands:

``speed`` trains each run for about ``--seconds`` seconds of steps (after its start-up) and writes the training
tokens/s of each, measured one after another on the same machine, to ``RESULTS/TOKENIZER/speed.json``: what says
whether a run can finish, and the only speed figure of a run too slow to train whole.

``train`` trains, for each run and seed, one ``sohsm lm train`` with the protocol of ``subword.py`` (the transformer
4 x 256 of ``fair_quality.py``'s ``transformer-wikitext-2``; ``--model lstm256``: its ``lstm256-wikitext-2``, the
LSTM 256, kept in ``RESULTS/TOKENIZER/lstm256/``) and ``--tokenizer TOKENIZER``, for ``--tokens`` training tokens
(the same for every run), then scores its best checkpoint on test (``sohsm lm eval --split test --json``) and
measures the probability it leaves on the tokens training never shows (``unused_mass.py``, on the first
``--mass-tokens`` test tokens). ``RESULTS/TOKENIZER/tokens-T/seed-S/RUN/`` keeps ``config.json``,
``metrics.jsonl``, ``valid.json`` (the run's last dev evaluation, which ``best.pt`` is: a budget under a quarter of
an epoch evaluates once, at its end), ``test.json``, ``unused.json`` and ``run.json`` (the commit, peak resident
memory of training and evaluation, wall time) -- never checkpoints. Run it again to continue: kept runs are skipped,
interrupted ones resumed from their last checkpoint (every 100,000 tokens or so).

``report`` writes ``docs/results/large-vocab.md``, ``large-vocab.json`` and the plot beside them,
``large-vocab.png``, from the kept files alone.

Usage::

    python benchmarks/large_vocab.py speed --seconds 30
    python benchmarks/large_vocab.py train --tokens 500000 --seeds 1            # runs in runs/large-vocab/...
    python benchmarks/large_vocab.py train --tokens 500000 --runs full-tied --tokenizer o200k
    python benchmarks/large_vocab.py train --model lstm256 --tokens 500000 --seeds 1,2,3
    python benchmarks/large_vocab.py report
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import kept_runs
import large_vocab_report
from fair_quality import PROTOCOLS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "large-vocab"
REPORT = ROOT / "docs" / "results" / "large-vocab.md"
TOKENIZERS = ("llama3", "o200k")
#: the rows of each tokenizer's output layer (N), for the options given in % of N
ROWS = {"llama3": 128_256, "o200k": 200_019}
#: the protocol's flags (its corpus and model) but for the budget, which ``--tokens`` sets for every run alike
PROTOCOL = "transformer-wikitext-2"
#: model -> (its protocol in fair_quality.py, the folder of its runs in a tokenizer's, its name on the page, steps
#: between checkpoints: about 100,000 tokens, 32 x 128 a transformer step, the LSTM's 20 x 35); the transformer's runs
#: are the tokenizer's folder itself
MODELS: dict[str, tuple[str, str, str, int]] = {"transformer": (PROTOCOL, "", "transformer 4 x 256", 25),
                                                "lstm256": ("lstm256-wikitext-2", "lstm256", "LSTM 256", 150)}
#: run name -> (head, tied, head options), in the order ``train`` takes them: the cheap heads first, the full
#: softmax (about 65 MFLOP a token at 128k rows, each way) last
RUNS: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    # the default: the words training never shows (count 0: most of the tokenizer's rows) in clusters of their own
    "self_organized-tied": ("self_organized", True, ()),
    # those words placed as any other (the default before unseen_words=apart became one)
    "self_organized_spread-tied": ("self_organized", True, ("unseen_words=spread",)),
    # fairseq's large-vocabulary configurations: a head of 20,000 tokens, tails to 60,000 and the rest, factor 4
    "adaptive_20k-tied": ("adaptive", True, ("cutoffs=[20000,60000]",)),
    # the tuning protocol's adaptive softmax (fair_quality.py's adaptive_tuned-tied): cutoffs at 10% and 40% of N,
    # div_value 2, as tuning chose it on Penn Treebank, scaled to N
    "adaptive_tuned-tied": ("adaptive", True, ("cutoffs=[10%N,40%N]", "div_value=2")),
    # sampled softmax as it is used at this size: 1,024 unigram samples shared by the batch; exact evaluation
    "importance_sampling-untied": ("importance_sampling", False, ("n_samples=1024",)),
    "two_level_frequency-tied": ("two_level_frequency", True, ()),
    "full-tied": ("full", True, ()),
}
REFERENCE = "full-tied"
SELF_ORGANIZED = "self_organized-tied"


def _settings(tokens: int | None, model: str = "transformer") -> list[str]:
    """The protocol's flags with its budget (``--max-tokens`` or ``--epochs``) replaced by ``tokens``."""
    _, settings, _ = PROTOCOLS[MODELS[model][0]]
    out = list(settings)
    for budget in ("--max-tokens", "--epochs"):
        if budget in out:
            i = out.index(budget)
            del out[i:i + 2]
    return out + (["--max-tokens", str(tokens)] if tokens is not None else [])


def model_folder(results: Path, tokenizer: str, model: str = "transformer") -> Path:
    """Where a model's runs over a tokenizer are kept (their ``speed.json`` and ``tokens-T/`` folders)."""
    return results / tokenizer / MODELS[model][1]


def new_run(name: str, tokenizer: str, seed: int, tokens: int | None, extra: list[str] | None = None,
            model: str = "transformer") -> list[str]:
    """The ``sohsm lm train`` flags of a new run (without ``--run-dir``)."""
    head, tied, options = RUNS[name]
    corpus, _, _ = PROTOCOLS[MODELS[model][0]]
    options = [re.sub(r"(\d+)%N", lambda m: str(round(int(m.group(1)) / 100 * ROWS[tokenizer])), o) for o in options]
    return ["--corpus", corpus, *_settings(tokens, model), "--tokenizer", tokenizer, "--head", head,
            *(arg for option in options for arg in ("--head-option", option)),
            "--tie-weights" if tied else "--no-tie-weights", "--seed", str(seed), *(extra or [])]


def _start(args: list[str], stdout, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sohsm", *args], stdout=stdout, stderr=stderr)


def _reap(proc: subprocess.Popen, block: bool = True) -> float | None:
    """Wait for the child (``block``) or look whether it ended; its peak resident memory in MiB (``ru_maxrss`` of
    the wait that reaped it), ``None`` while it runs."""
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if not pid:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024


def _run_measured(args: list[str], log: Path) -> tuple[int, float, float, str]:
    """``python -m sohsm ARGS``, stdout to ``log``: (exit code, peak resident memory in MiB, wall seconds, the last
    line of stderr)."""
    start = time.time()
    err = log.with_suffix(".err")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out, open(err, "w") as errors:
        proc = _start(args, out, errors)
        peak = _reap(proc)
    lines = err.read_text().strip().splitlines()
    return proc.returncode, peak, time.time() - start, lines[-1] if lines else ""


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def train(tokenizer: str, tokens: int, seeds: list[int], runs: list[str], runs_dir: Path, results: Path = RESULTS,
          mass_tokens: int = 16384, corpus: str | None = None, extra: list[str] | None = None,
          model: str = "transformer") -> int:
    """Train, score and keep each run not kept yet; 1 if any failed. ``corpus`` and ``extra`` are for a smoke test."""
    failed = 0
    for seed in seeds:
        for name in runs:
            folder = model_folder(Path(tokenizer), "", model) / f"tokens-{tokens}" / f"seed-{seed}" / name
            kept, run = results / folder, runs_dir / folder
            if (kept / "test.json").exists():
                continue
            label = f"{tokenizer} {MODELS[model][2]} {tokens:,} tokens seed {seed} {name}"
            flags = new_run(name, tokenizer, seed, tokens,
                            ["--checkpoint-every", str(MODELS[model][3]), "--quiet", *(extra or [])], model)
            if corpus is not None:
                flags[flags.index("--corpus") + 1] = corpus
            args = (["lm", "train", "--run-dir", str(run), "--resume"] if (run / "last.pt").exists() else
                    ["lm", "train", *flags, "--run-dir", str(run)])
            print(f"{label}: sohsm {' '.join(args)}", flush=True)
            code, train_peak, train_wall, last = _run_measured(args, run.parent / f"{name}.train.log")
            if code != 0:
                print(f"  {label} failed ({code}): {last}", flush=True)
                failed += 1
                continue
            test, eval_peak, eval_wall = _evaluate(run, label)
            if test is None:
                failed += 1
                continue
            evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                     if line.strip() and json.loads(line)["kind"] == "eval"]
            mass = _unused_mass(run, mass_tokens, label)
            if mass is None:
                failed += 1
                continue
            # test.json marks a run as kept, so it comes last: a run cut off here is evaluated again, never half kept
            kept.mkdir(parents=True, exist_ok=True)
            (kept / "valid.json").write_text(json.dumps({**evals[-1], "from": "metrics.jsonl"}, indent=1) + "\n")
            (kept / "unused.json").write_text(json.dumps(mass, indent=1) + "\n")
            (kept / "run.json").write_text(json.dumps(
                {"commit": _commit(), "command": ["sohsm", "lm", "train", *flags],
                 "train_peak_rss_mib": round(train_peak),
                 "train_wall_s": round(train_wall), "eval_peak_rss_mib": round(eval_peak),
                 "eval_wall_s": round(eval_wall)}, indent=1) + "\n")
            kept_runs.keep(run, kept, {"test": test})
            print(f"  test {test['bits_per_byte']:.4f} bits per byte, unused mass {mass['unused_mass']:.4f}",
                  flush=True)
    return 1 if failed else 0


def _evaluate(run: Path, label: str) -> tuple[dict | None, float, float]:
    out = run.parent / f"{run.name}.test.json"
    code, peak, wall, last = _run_measured(["lm", "eval", str(run), "--split", "test", "--json"], out)
    if code != 0:
        print(f"  {label} test evaluation failed: {last}", flush=True)
        return None, peak, wall
    result = json.loads(out.read_text())
    result["checkpoint"] = Path(result["checkpoint"]).name
    return result, peak, wall


def _unused_mass(run: Path, tokens: int, label: str) -> dict | None:
    """``unused_mass.py RUN`` in a child process (this one stays small, so that its children's peak memory is
    theirs: a child's starts from its parent's at the fork)."""
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "unused_mass.py"), str(run), "--tokens",
                           str(tokens)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  {label} unused-token mass failed: {(done.stderr.strip().splitlines() or [''])[-1]}", flush=True)
        return None
    return json.loads(done.stdout)


def speed(tokenizer: str, runs: list[str], seconds: float, runs_dir: Path, results: Path = RESULTS,
          model: str = "transformer") -> dict:
    """Each run's training tokens/s over about ``seconds`` of steps (one train record a step), one after another."""
    rates, commit = {}, _commit()
    for name in runs:
        run = model_folder(runs_dir, tokenizer, model) / "speed" / name
        if run.exists():
            shutil.rmtree(run)
        flags = new_run(name, tokenizer, 1, None, ["--log-every", "1", "--checkpoint-every", "0", "--quiet"], model)
        proc = _start(["lm", "train", *flags, "--run-dir", str(run)], subprocess.DEVNULL, subprocess.DEVNULL)
        start, records, peak = time.time(), [], None
        while peak is None and time.time() - start < 8 * seconds + 120:
            time.sleep(2)
            peak = _reap(proc, block=False)
            if (run / "metrics.jsonl").exists():
                records = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                           if r["kind"] == "train"]
                if len(records) >= 2 and records[-1]["elapsed_s"] - records[0]["elapsed_s"] >= seconds:
                    break
        if peak is None:
            proc.send_signal(signal.SIGKILL)
            peak = _reap(proc)
        if len(records) >= 2:  # from the end of the first step, so that start-up and the first step's costs are out
            a, b = records[0], records[-1]
            rates[name] = {"tokens_per_s": round((b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"]), 1),
                           "steps": len(records) - 1, "seconds": round(b["elapsed_s"] - a["elapsed_s"], 1),
                           "peak_rss_mib": round(peak)}
        else:
            rates[name] = None
        print(f"{name}: {rates[name]}", flush=True)
    record = {"commit": commit, "seconds": seconds, "runs": rates,
              "command": f"python benchmarks/large_vocab.py speed --tokenizer {tokenizer} "
                         f"{'' if model == 'transformer' else f'--model {model} '}--runs {','.join(runs)} "
                         f"--seconds {seconds:g}"}
    folder = model_folder(results, tokenizer, model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "speed.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


#: the budget every run of a tokenizer reads, the seeds each should have, and the longer budget of the leading heads
BUDGET, SEEDS, LONGER = 500_000, (1, 2, 3), 1_500_000
#: the issue's protocol: at least this many tokens for every head, and three times that for the two leading heads
PROTOCOL_TOKENS = 1_000_000
PROTOCOL_LONGER = 3 * PROTOCOL_TOKENS


def readme_budget(folder: Path) -> int | None:
    """The largest budget under ``folder`` (a tokenizer's, or a model's in it) at which every head of :data:`RUNS`
    has a kept run (one of its runs, one seed at least): the budget README's row reads. None where there is none."""
    heads = {head for head, _, _ in RUNS.values()}
    budgets = [int(p.name.split("-")[1]) for p in folder.glob("tokens-*")]
    for tokens in sorted(budgets, reverse=True):
        kept = {RUNS[p.name][0] for p in (folder / f"tokens-{tokens}").glob("seed-*/*")
                if p.name in RUNS and (p / "test.json").exists()}
        if kept >= heads:
            return tokens
    return None


def _missing(budget_folder: Path) -> dict[str, list[int]]:
    """Run name -> the seeds of :data:`SEEDS` not kept in ``budget_folder`` (runs with every seed kept left out)."""
    missing = {name: [s for s in SEEDS if not (budget_folder / f"seed-{s}" / name / "test.json").exists()]
               for name in RUNS}
    return {name: seeds for name, seeds in missing.items() if seeds}


def _full_pace(results: Path, tokenizer: str) -> str:
    """How long the full softmax takes at the budget over ``tokenizer``: from a kept run's tokens/s, else from
    ``speed.json``; empty where neither was measured."""
    kept = [large_vocab_report.run_summary(p) for p in (results / tokenizer / f"tokens-{BUDGET}").glob(
        f"seed-*/{REFERENCE}")]
    rates = [run["tokens_per_s"] for run in kept if run and run["tokens_per_s"]]
    where = f"its kept run{'s' * (len(rates) > 1)}"
    if not rates:
        speed = results / tokenizer / "speed.json"
        measured = json.loads(speed.read_text())["runs"].get(REFERENCE) if speed.exists() else None
        rates, where = ([measured["tokens_per_s"]], "`speed`") if measured else ([], "")
    if not rates:
        return ""
    rate = sum(rates) / len(rates)
    return (f" (the full softmax reads {rate:,.0f} tokens/s over {tokenizer} here, by {where}: "
            f"{BUDGET / rate / 60:.0f} minutes a run)")


def not_run(results: Path = RESULTS) -> list[str]:
    """What the page says was not run, from the kept runs, each with the command that would run it."""
    lines = ["## Not run yet", ""]
    for tokenizer in TOKENIZERS:
        missing = _missing(results / tokenizer / f"tokens-{BUDGET}")
        pace = _full_pace(results, tokenizer) if REFERENCE in missing else ""
        if missing:
            lines.append(f"- **{tokenizer}, {BUDGET:,} tokens**: " + _listed(missing)
                         + f" (`python benchmarks/large_vocab.py train --tokenizer {tokenizer} --tokens "
                f"{BUDGET} --seeds 1,2,3 --runs RUN`){pace}.")
    longer = results / "llama3" / f"tokens-{LONGER}"
    kept = sorted(p.parent.name + "/" + p.name for p in longer.glob("seed-*/*") if (p / "test.json").exists())
    lines += [f"- **Three times the budget** ({LONGER:,} tokens) kept for: {', '.join(kept) or 'none'}; the other "
              "seeds and heads not run (`... train --tokens 1500000 --seeds 2,3 --runs RUN`).",
              *_protocol_not_run(results), *_protocol_longer_not_run(results), *_lstm_not_run(results)]
    return lines


def leading(folder: Path, count: int = 2) -> list[str]:
    """The ``count`` runs of ``folder`` (a budget's) with the lowest mean test bits per byte over their kept seeds:
    the heads the longer budget is for, read from the data rather than named."""
    means = {}
    for name in RUNS:
        bpb = [json.loads((p / "test.json").read_text())["bits_per_byte"] for p in folder.glob(f"seed-*/{name}")
               if (p / "test.json").exists()]
        if bpb:
            means[name] = sum(bpb) / len(bpb)
    return sorted(means, key=means.get)[:count]


def _listed(missing: dict[str, list[int]]) -> str:
    """Runs and their seeds not kept, as the page lists them: ```full-tied` seeds 1, 2; ...``."""
    return "; ".join(f"`{name}` seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
                     for name, seeds in missing.items())


def _protocol_longer_not_run(results: Path) -> list[str]:
    """Three times the protocol's budget (:data:`PROTOCOL_LONGER`) for the two runs that lead at the protocol's:
    the seeds of theirs not kept, each tokenizer where the protocol's budget has runs."""
    lines = []
    for tokenizer in TOKENIZERS:
        leaders = leading(results / tokenizer / f"tokens-{PROTOCOL_TOKENS}")
        if not leaders:
            continue
        folder = results / tokenizer / f"tokens-{PROTOCOL_LONGER}"
        absent = _missing(folder) if folder.exists() else {n: list(SEEDS) for n in leaders}
        missing = {n: absent[n] for n in leaders if n in absent}
        if missing:
            lines.append(f"- **Three times the protocol's budget** ({PROTOCOL_LONGER:,} tokens, {tokenizer}, the two "
                         f"lowest at {PROTOCOL_TOKENS:,}: {', '.join(f'`{n}`' for n in leaders)}): "
                         + _listed(missing)
                         + f" (`python benchmarks/large_vocab.py train --tokenizer {tokenizer} --tokens "
                         f"{PROTOCOL_LONGER} --seeds 1,2,3 --runs RUN`).")
    return lines


def _protocol_not_run(results: Path) -> list[str]:
    """The issue's budget (:data:`PROTOCOL_TOKENS`), each tokenizer: the runs and seeds not kept (two seeds of the
    full softmax, which takes hours a run there; the spread variant left to the longer budgets' comparisons)."""
    lines = []
    for tokenizer in TOKENIZERS:
        folder = results / tokenizer / f"tokens-{PROTOCOL_TOKENS}"
        missing = {name: seeds[:len(seeds) - (name == REFERENCE)] for name, seeds in _missing(folder).items()
                   if name != "self_organized_spread-tied"}
        missing = {name: seeds for name, seeds in missing.items() if seeds}
        command = (f"(`python benchmarks/large_vocab.py train --tokenizer {tokenizer} --tokens {PROTOCOL_TOKENS} "
                   "--seeds 1,2,3 --runs RUN`)")
        if not folder.exists():
            lines.append(f"- **The protocol's {PROTOCOL_TOKENS:,} tokens, {tokenizer}**: no run yet {command}.")
        elif missing:
            lines.append(f"- **The protocol's {PROTOCOL_TOKENS:,} tokens, {tokenizer}**: " + _listed(missing)
                         + f" {command}.")
    hours = {t: h for t in TOKENIZERS if (h := _reference_hours(results / t / f"tokens-{PROTOCOL_TOKENS}"))}
    if hours:
        lines.append(f"- **Two seeds of `{REFERENCE}`** at the protocol's {PROTOCOL_TOKENS:,} tokens, not three, as "
                     "the issue allows where one run takes hours: " + ", ".join(
                         f"{t}'s took {h:.1f} hours a run here" for t, h in hours.items())
                     + " (training and test evaluation: the kept runs' `run.json`, the mean).")
    return lines


def _reference_hours(folder: Path) -> float | None:
    """The mean wall time, in hours, of a kept :data:`REFERENCE` run's training and test evaluation in ``folder``."""
    walls = [meta["train_wall_s"] + meta["eval_wall_s"] for run in folder.glob(f"seed-*/{REFERENCE}")
             if (run / "test.json").exists() and (meta := json.loads((run / "run.json").read_text()))]
    return sum(walls) / len(walls) / 3600 if walls else None


def _lstm_not_run(results: Path) -> list[str]:
    """The LSTM 256's missing runs at the budget, for each tokenizer (every run and seed where none is kept)."""
    lines = []
    for tokenizer in TOKENIZERS:
        missing = _missing(model_folder(results, tokenizer, "lstm256") / f"tokens-{BUDGET}")
        command = (f"(`python benchmarks/large_vocab.py train --model lstm256 --tokenizer {tokenizer} --tokens "
                   f"{BUDGET} --seeds 1,2,3 --runs RUN`)")
        if len(missing) == len(RUNS) and all(len(s) == len(SEEDS) for s in missing.values()):
            lines.append(f"- **The tied LSTM 256, {tokenizer}**: no run yet {command}.")
        elif missing:
            lines.append(f"- **The tied LSTM 256, {tokenizer}, {BUDGET:,} tokens**: " + _listed(missing)
                         + f" {command}.")
    return lines


def report(output: Path = REPORT, results: Path = RESULTS) -> str:
    """Write the page and its figures (``large-vocab.json``) from the kept runs; return the page."""
    _, _, title = PROTOCOLS[PROTOCOL]
    others = {MODELS[m][1]: (MODELS[m][2], _settings(None, m)) for m in MODELS if m != "transformer"}
    text = large_vocab_report.report(results, output, list(RUNS), title.replace(", 1M tokens", ""),
                                     _settings(None), others)
    text += "\n" + "\n".join(not_run(results)) + "\n"
    output.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("train", "speed"):
        p = sub.add_parser(command)
        p.add_argument("--tokenizer", choices=TOKENIZERS, default="llama3")
        p.add_argument("--model", choices=list(MODELS), default="transformer",
                       help="the transformer 4 x 256 (default) or the LSTM 256 of fair_quality.py")
        p.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of: " + ", ".join(RUNS))
        p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "large-vocab")
        if command == "train":
            p.add_argument("--tokens", type=int, default=1_000_000, help="training tokens of every run")
            p.add_argument("--seeds", default="1")
            p.add_argument("--mass-tokens", type=int, default=16384,
                           help="test tokens the unused-token mass is measured on")
        else:
            p.add_argument("--seconds", type=float, default=30.0)
    sub.add_parser("report")
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(), end="")
        return 0
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"unknown run {unknown[0]!r}: one of {', '.join(RUNS)}")
    if args.command == "speed":
        speed(args.tokenizer, runs, args.seconds, args.runs_dir, model=args.model)
        return 0
    return train(args.tokenizer, args.tokens, [int(s) for s in args.seeds.split(",")], runs, args.runs_dir,
                 mass_tokens=args.mass_tokens, model=args.model)


if __name__ == "__main__":
    sys.exit(main())
