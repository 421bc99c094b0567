"""What each row of "Which head to pick" reads: the committed runs, through the loaders of the pages that table them.

Every situation is a :class:`Table`: the forms of the heads it measured (:class:`Form`: how a user runs that form,
its figure seed by seed, the commit each seed was measured at), the budget, corpus and device, and where the same
runs are tabled in full. ``benchmarks/which_head.py`` decides and writes; this module only reads:

* ``fair_quality.py``'s runs (``docs/results/fair/``), its ``_summary`` and ``RUNS`` (the command of each form);
* ``tuning.py``'s final runs (``docs/results/tuning/``), its ``summarize`` and ``head_options``;
* ``subword.py``'s and ``subword_hf.py``'s runs, their ``_summary`` and ``_hf_summary`` (bits per byte);
* ``large_vocab.py``'s runs, ``large_vocab_report.run_summary`` (bits per byte, the commit in each ``run.json``);
* ``docs/results/pretrained.json`` (``pretrained.py``'s figures: its script imports torch, its JSON is enough);
* the speeds: ``docs/benchmarks/measured.json``, ``large-vocab/TOKENIZER/speed.json``, ``docs/benchmarks/
  scaling.json``.

A run's commit is the one its own files name where they name one (``run.json``, ``pretrained.json``, the speed
files); else the commit that first added its ``config.json`` (or ``result.json``) to the repository, which it was
trained at or before (:func:`kept_at`; ``None`` where git has no such history).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import fair_quality
import large_vocab
import large_vocab_report
import subword
import subword_hf
import tuning

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
MEASURED = ROOT / "docs" / "benchmarks" / "measured.json"
SCALING = ROOT / "docs" / "benchmarks" / "scaling.json"


class Form(NamedTuple):
    """One head in one form, as a user would run it, and its figure (lower is better) seed by seed."""
    label: str                  # its run's name on the page that tables it
    head: str                   # the head it is (``full`` for a model's own lm_head)
    command: str                # how a user gets it
    heads: tuple[str, ...]      # the sohsm heads whose code it runs (none for a model's own lm_head)
    seeds: dict[int, float]     # seed -> figure
    commits: dict[int, str | None]  # seed -> the commit it was measured (or kept) at


class Speed(NamedTuple):
    """Training tokens/s of some forms, each measured once, one after another or side by side."""
    rates: dict[str, float]     # form label -> tokens/s
    heads: dict[str, tuple[str, ...]]
    commits: dict[str, str]     # form label -> the commit it was measured at
    device: str
    page: str                   # from docs/results/


class Table(NamedTuple):
    """One situation: what was run, how, and what it scored."""
    situation: str              # what a user has, in README's words
    corpus: str
    budget: str                 # the model and what it was trained on
    device: str
    metric: str                 # the figure of every form, lower is better
    page: str                   # the page that tables these runs, from docs/results/
    forms: list[Form]
    loop: tuple[str, ...]       # the code that trained and scored every form (the training loop, or sohsm.hf)
    readme: bool = True         # a row of README's table too (else of which-head.md alone)
    speed: Speed | None = None


#: the code of every language-model run besides its head: the training loop, the LM task, the models
LOOP = ("src/sohsm/train/", "src/sohsm/tasks/lm/", "src/sohsm/models/")
#: a head in a Hugging Face model: sohsm.hf, and the loop's code where sohsm's optimizer and evaluation are used
HF = ("src/sohsm/hf/",)


def kept_at(folders: list[str]) -> dict[str, str]:
    """File -> the commit that first added it (7 characters), for every file under ``folders`` (one ``git log``)."""
    try:
        done = subprocess.run(["git", "log", "--no-renames", "--diff-filter=A", "--format=%x00%H", "--name-only",
                               "--", *folders], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:  # no git here: every such commit unknown
        return {}
    found, commit = {}, None
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        if line.startswith("\0"):
            commit = line[1:8]
        elif line.strip():
            found[line.strip()] = commit  # the log runs newest first: the first addition is the last written
    return found


def _commit(kept: dict[str, str], file: Path) -> str | None:
    return kept.get(str(file.relative_to(ROOT)))


def _command(head: str, tied: bool, options: list[str]) -> str:
    return " ".join(["--head", head, *(f"--head-option {o}" for o in options), *([] if tied else ["--no-tie-weights"])])


def _forms(names, seeds, figure, command, head, commit, code=None) -> list[Form]:
    """The forms of ``names`` that have a figure on some seed; ``head(name)``: the head a form is, ``code(name)``:
    the heads whose code it runs (default: that head)."""
    forms = []
    for name in names:
        by_seed = {s: figure(name, s) for s in seeds}
        by_seed = {s: v for s, v in by_seed.items() if v is not None}
        if by_seed:
            forms.append(Form(name, head(name), command(name), (code or (lambda n: (head(n),)))(name), by_seed,
                              {s: commit(name, s) for s in by_seed}))
    return forms


#: fair_quality.py's protocols: folder -> (situation, corpus, in README)
FAIR = {"lstm256-ptb": ("LSTM, 6 epochs", "PTB (10k)", True),
        "lstm256-wikitext-2": ("LSTM, 6 epochs", "WikiText-2 (33k)", True),
        "lstm256-text8": ("LSTM, 6 epochs", "text8 (50k)", True),
        "lstm256-wikitext-2-cuda": ("LSTM, 6 epochs, on a GPU", "WikiText-2 (33k)", False),
        "lstm256-text8-cuda": ("LSTM, 6 epochs, on a GPU", "text8 (50k)", False),
        "promise": ("LSTM 512, 300k tokens", "PTB (10k)", True),
        "transformer-ptb": ("transformer, 1 epoch", "PTB (10k)", True),
        "transformer-ptb-3-epochs": ("transformer, 3 epochs", "PTB (10k)", False),
        "transformer-ptb-6-epochs": ("transformer, 6 epochs", "PTB (10k)", True)}


def fair_tables(kept: dict[str, str]) -> list[Table]:
    tables = []
    for folder, (situation, corpus_words, readme) in FAIR.items():
        protocol, gpu = folder.removesuffix("-cuda"), folder.endswith("-cuda")
        corpus, _, title = fair_quality.PROTOCOLS[protocol]
        base = fair_quality.RESULTS / folder
        if not base.is_dir():
            continue
        seeds = sorted(int(p.name.split("-")[1]) for p in base.glob("seed-*"))
        metric = "dev" if corpus in fair_quality.NO_TEST_SPLIT else "test"
        summaries = {(n, s): fair_quality._summary(base / f"seed-{s}" / n) for n in fair_quality.RUNS for s in seeds}
        forms = _forms(fair_quality.RUNS, seeds, lambda n, s: (summaries[n, s] or {}).get(metric),
                       lambda n: _command(fair_quality.RUNS[n][0], fair_quality.RUNS[n][1],
                                          fair_quality.scaled_options(fair_quality.RUNS[n][2], corpus)),
                       lambda n: fair_quality.RUNS[n][0],
                       lambda n, s: _commit(kept, base / f"seed-{s}" / n / "config.json"))
        tables.append(Table(situation, corpus_words, title.split(", ", 1)[1], "GPU" if gpu else "CPU",
                            f"{metric} perplexity", "fair.md", forms, LOOP, readme))
    return tables


#: a tokenizer's vocabulary, as README names it
TOKENIZERS = {"llama3": "Llama 3's 128k vocabulary", "o200k": "o200k's 200k vocabulary"}
TUNING = {"ptb": "PTB (10k)", "wikitext-2": "WikiText-2 (33k)", "text8-small": "text8 (50k)"}


def _tuned_command(corpus: str, head: str) -> str:
    """The flags of a head's chosen form (its final runs' ``setting.json``), as ``tuning.command`` gives them."""
    seed_dir = min((tuning.RESULTS / corpus / "final").glob(f"seed-*/{head}/setting.json"))
    setting = json.loads(seed_dir.read_text())
    flags = tuning.head_options(head, {k: v for k, v in setting.items() if k in tuning.GRID[head]},
                                tuning.CORPORA[corpus][1])
    options = [flags[i + 1] for i in range(0, len(flags), 2)]
    extra = ([f"--warmup {setting['warmup']}"] if setting.get("warmup", tuning.WARMUPS[0]) != tuning.WARMUPS[0] else
             []) + ([f"--init-range {setting['init_range']}"]
                    if setting.get("init_range", tuning.INIT_RANGES[0]) != tuning.INIT_RANGES[0] else [])
    return " ".join([_command(head, True, options), *extra])


def tuning_tables(kept: dict[str, str]) -> list[Table]:
    final = tuning.summarize(tuning.RESULTS)["final"]
    tables = []
    for corpus, corpus_words in TUNING.items():
        if corpus not in final:
            continue
        heads = final[corpus]["heads"]
        metric = next(iter(heads.values()))["metric"]
        seeds = sorted({s for row in heads.values() for s in row["seeds"]})
        forms = _forms(heads, seeds, lambda h, s: (heads[h]["seeds"].get(s) or {}).get(metric),
                       lambda h: _tuned_command(corpus, h), lambda h: h,
                       lambda h, s: _commit(kept, tuning.RESULTS / corpus / "final" / f"seed-{s}" / h / "config.json"))
        tables.append(Table("LSTM, 1 epoch, tuned", corpus_words, "LSTM 256, one epoch, every head tuned alike "
                            "on PTB's dev split", "CPU", f"{metric} perplexity", "tuning.md", forms, LOOP))
    return tables


def subword_tables(kept: dict[str, str]) -> list[Table]:
    tables = []
    for folder in sorted(subword.RESULTS.glob("bpe-*"), key=lambda p: int(p.name.split("-")[1])):
        seeds = sorted(int(p.name.split("-")[1]) for p in folder.glob("seed-*"))
        forms = _forms(subword.RUNS, seeds, lambda n, s: (subword._summary(folder / f"seed-{s}" / n) or {}).get(
                           "test_bpb"),
                       lambda n: _command(*subword.RUNS[n][:2], list(subword.RUNS[n][2])),
                       lambda n: subword.RUNS[n][0],
                       lambda n, s: _commit(kept, folder / f"seed-{s}" / n / "config.json"))
        size = int(folder.name.split("-")[1]) // 1000
        tables.append(Table("subword tokens", f"WikiText-2 ({size}k BPE)", "transformer 4 x 256, 1M tokens", "CPU",
                            "test bits/byte", "subword.md", forms, LOOP))
    return tables


def hf_tables(kept: dict[str, str]) -> list[Table]:
    """The subword model as a Hugging Face Llama trained by the ``Trainer`` (from scratch), beside its speed inside a
    large Llama on a GPU."""
    tables = []
    for folder in sorted(subword_hf.RESULTS.glob("bpe-*"), key=lambda p: int(p.name.split("-")[1])):
        seeds = sorted(int(p.name.split("-")[1]) for p in folder.glob("seed-*"))
        names = sorted({p.name for p in folder.glob("seed-*/hf-llama-*")})
        forms = _forms(names, seeds, lambda n, s: (subword_hf._hf_summary(folder / f"seed-{s}" / n) or {}).get(
                           "test_bpb"),
                       lambda n: f'sohsm.hf.use_head(model, "{n.removeprefix("hf-llama-")}")',
                       lambda n: n.removeprefix("hf-llama-"),
                       lambda n, s: _commit(kept, folder / f"seed-{s}" / n / subword_hf.RESULT))
        if forms:
            size = int(folder.name.split("-")[1]) // 1000
            tables.append(Table("a Hugging Face Llama", f"WikiText-2 ({size}k BPE)",
                                "Llama 4 x 256 by the Trainer, 1M tokens", "CPU", "test bits/byte", "subword-hf.md",
                                forms, HF + LOOP, readme=False, speed=measured_speed("hf-llama-128k-h200")))
    return tables


def pretrained_tables() -> list[Table]:
    """``pretrained.py``: a pretrained Llama's ``lm_head`` replaced (``use_head(..., data=...)``), then fine-tuned."""
    path = RESULTS / "pretrained.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    own = "keep its `lm_head`"
    commands = {"full": own, **{h: f'sohsm.hf.use_head(model, "{h}", data=...)' for h in
                                ("self_organized", "two_level_frequency", "two_level_random")},
                **{f"{h}-naive": f'sohsm.hf.use_head(model, "{h}", keep_weights=False)' for h in
                   ("self_organized", "two_level_frequency", "two_level_random")}}
    tables = []
    for key, words in (("ptb_test_ppl", ""), ("wiki_test_ppl", ", fine-tuned")):
        names = [n for n in commands if any(key in r.get(n, {}) for r in data["results"])]
        forms = _forms(names, [r["seed"] for r in data["results"]],
                       lambda n, s: next(r for r in data["results"] if r["seed"] == s).get(n, {}).get(key),
                       commands.get, lambda n: n.removesuffix("-naive"), lambda n, s: data["commit"],
                       lambda n: () if n == "full" else (n.removesuffix("-naive"),))
        corpus = "PTB" if key == "ptb_test_ppl" else "WikiText-2"
        model = "Llama 2 x 64, 2k BPE, pretrained here on PTB" + (", fine-tuned 100 steps on a domain shift"
                                                                  if words else "")
        tables.append(Table("a pretrained HF model" + words, corpus, model, "CPU", "test perplexity per token",
                            "pretrained.md", forms, HF, readme=True))
    return tables


def large_vocab_tables() -> list[Table]:
    """Each tokenizer's runs, a table per model and budget; README: the transformer's largest budget that every head
    ran (:func:`large_vocab.readme_budget`; the longer one of the leading heads, and the LSTM's runs: the table
    page)."""
    tables = []
    for tokenizer_dir in sorted(p for p in large_vocab.RESULTS.iterdir() if p.is_dir()):
        for model, (_, _, model_name, _) in large_vocab.MODELS.items():
            folder = large_vocab.model_folder(large_vocab.RESULTS, tokenizer_dir.name, model)
            speed = _large_vocab_speed(folder)
            readme = large_vocab.readme_budget(folder) if model == "transformer" else None
            for budget in sorted(folder.glob("tokens-*"), key=lambda p: int(p.name.split("-")[1])):
                tables.append(_large_vocab_table(tokenizer_dir.name, model, model_name, budget, speed,
                                                 budget.name == f"tokens-{readme}"))
    return tables


def _large_vocab_table(tokenizer: str, model: str, model_name: str, budget: Path, speed: Speed | None,
                       readme: bool) -> Table:
    seeds = sorted(int(p.name.split("-")[1]) for p in budget.glob("seed-*"))
    summaries = {(n, s): large_vocab_report.run_summary(budget / f"seed-{s}" / n)
                 for n in large_vocab.RUNS for s in seeds}
    forms = _forms(large_vocab.RUNS, seeds, lambda n, s: (summaries[n, s] or {}).get("test_bpb"),
                   lambda n: _command(*large_vocab.RUNS[n][:2], list(large_vocab.RUNS[n][2])),
                   lambda n: large_vocab.RUNS[n][0], lambda n, s: summaries[n, s]["commit"])
    tokens = int(budget.name.split("-")[1])
    transformer = model == "transformer"
    situation = TOKENIZERS.get(tokenizer, tokenizer) + ("" if transformer else f", {model_name}")
    return Table(situation, f"WikiText-2, {tokens // 1000}k tokens", f"{model_name}, {tokens:,} tokens", "CPU",
                 "test bits/byte", "large-vocab.md", forms, LOOP, speed=speed,
                 readme=readme)


def _large_vocab_speed(tokenizer_dir: Path) -> Speed | None:
    path = tokenizer_dir / "speed.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    rates = {n: r["tokens_per_s"] for n, r in data["runs"].items() if r}
    return Speed(rates, {n: (large_vocab.RUNS[n][0],) for n in rates}, dict.fromkeys(rates, data["commit"]), "CPU",
                 "large-vocab.md")


def measured_speed(name: str) -> Speed | None:
    """A speed of a hand-written page, as ``docs/benchmarks/measured.json`` keeps it (``hf``: the model's own
    head)."""
    entry = json.loads(MEASURED.read_text()).get(name)
    if entry is None:
        return None
    rates = entry["tokens_per_s"]
    return Speed(rates, {n: () if n == "hf" else (n,) for n in rates}, dict.fromkeys(rates, entry["commit"]),
                 entry["device"], os.path.relpath(ROOT / entry["page"], RESULTS))


def million_words() -> Table | None:
    """``scaling.py`` at a million words: speed alone (a Zipf stream: its quality means nothing)."""
    cells = {k.split("@")[0]: v for k, v in json.loads(SCALING.read_text()).items()
             if k.endswith("@1000000") and v.get("tokens_per_s")}
    if not cells:
        return None
    heads = {n: ("adaptive" if c["head"].startswith("adaptive") else c["head"],) for n, c in cells.items()}
    speed = Speed({n: c["tokens_per_s"] for n, c in cells.items()}, heads,
                  {n: c["commit"] for n, c in cells.items()}, "CPU", "../benchmarks/scaling.md")
    return Table("1M words", "a Zipf stream", "LSTM 256, a few timed steps a head", "CPU", "",
                 "../benchmarks/scaling.md", [], LOOP, speed=speed)


def tables() -> list[Table]:
    """Every situation, in the table's order."""
    kept = kept_at(["docs/results/fair", "docs/results/tuning", "docs/results/subword", "docs/results/subword-hf"])
    fair = fair_tables(kept)
    one_epoch = [t for t in fair if t.situation.startswith("LSTM 512")]
    six = [t for t in fair if t.situation.startswith("LSTM, 6")]
    wikitext = next((i for i, t in enumerate(six) if t.corpus.startswith("WikiText") and t.device == "CPU"), None)
    if wikitext is not None:
        six[wikitext] = six[wikitext]._replace(speed=measured_speed("lm-wikitext-2-lstm256-cpu"))
    transformer = [t for t in fair if t.situation.startswith("transformer")]
    million = million_words()
    return [*tuning_tables(kept), *six, *one_epoch, *transformer, *subword_tables(kept), *large_vocab_tables(),
            *([million] if million else []), *hf_tables(kept), *pretrained_tables()]
