"""Which head to pick, computed from the committed runs: README's section "Which head to pick" and its long form,
docs/results/which-head-table.md, both written by this script and by no hand (docs/results/which-head.md, written by
hand, gives the evidence in words and links the table).

Usage::

    python benchmarks/which_head.py            # writes both from the committed runs
    python benchmarks/which_head.py --check    # exit 1, naming what differs, where either is not what it writes

What each situation read (runs, commands, commits) is ``which_head_runs.py``; what is concluded from it is decided
here, by these rules, which the pages print as written here:

- A situation's *forms* are the heads it ran, each in one form (tied or not, its options), with the command that
  gives a user that form. The forms *ranked* are those run on every seed of its best-covered form; the *top* is the
  ranked form of the lowest mean figure over those seeds (perplexity; bits per byte for subword tokens, where a
  token is not a word).
- *Gap*: the top's figure over another form's, the geometric mean of their seed-by-seed ratios, minus one, in
  percent; *k of n*: on how many of the n seeds both ran the top was lower. Their *seed spread*: the range (max -
  min) of the seed-by-seed ratios, in percent: how much the gap itself moves from seed to seed. (Not one head's
  spread across seeds: that also holds what a seed changes for both heads alike, its data order or its pretrained
  model, and would call level a gap that every seed shows.)
- *Level*: the seeds disagree (k is not n) or the gap is within the seed spread. The top is the *pick* where no
  other ranked form is level with it; else the row says *level*, names every form level with the top, and picks
  none. With one seed there is no spread: the row names no pick (*one seed*) and gives the order.
- *Stale*: a run measured at a commit that does not contain the last commit changing its head's code or the code
  that trained it (``HEAD_CODE``, ``COMMON``; ``which_head_runs.LOOP``, ``HF``: ``git log -1 -- PATHS``, then
  ``git merge-base --is-ancestor``); a row is stale where a run of a form it names is. *Unknown* where git cannot
  tell (a shallow clone, a commit not in the history). A run's commit is the one its files name, else the commit
  that added its files, which it was trained at or before: so *stale* is certain, *current* is as far as git shows.
- *Speed*: training tokens/s, one measurement a form: the fastest over the next, with no spread; stale by the same
  rule. A situation with no quality run says so; so does a device with no current speed.

A later commit that changes a head's or the loop's code can turn a row stale: ``tests/test_which_head.py`` then
fails until this script is run again and its output committed.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import which_head_runs as runs
from which_head_runs import Form, Speed, Table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TABLE = ROOT / "docs" / "results" / "which-head-table.md"
SECTION = "## Which head to pick"
GPU = "On a GPU: what is measured"
COMMAND = "python benchmarks/which_head.py"

#: every head's base class and its tied embedding, which every head below runs
COMMON = ("src/sohsm/heads/base.py", "src/sohsm/heads/tying.py")
_TWO_LEVEL = ("src/sohsm/heads/two_level/", "src/sohsm/clustering/")
#: the code of each head (a head not named here: all of src/sohsm/heads/)
HEAD_CODE = {"full": ("src/sohsm/heads/full.py",), "adaptive": ("src/sohsm/heads/adaptive.py",),
             "two_level_frequency": _TWO_LEVEL, "two_level_random": _TWO_LEVEL, "self_organized": _TWO_LEVEL,
             "importance_sampling": ("src/sohsm/heads/sampled.py",)}


# ---- the rules: level, pick ----------------------------------------------------------------------------------


class Pair(NamedTuple):
    """The top against another form over the seeds both ran."""
    gap: float                  # percent
    lower: int                  # k: seeds where the top was lower
    seeds: int                  # n
    low: float                  # the seed-by-seed ratios' range, percent
    high: float

    @property
    def spread(self) -> float | None:
        """The seed spread (None with one seed: no spread)."""
        return self.high - self.low if self.seeds > 1 else None


def pair(top: Form, other: Form) -> Pair:
    seeds = sorted(set(top.seeds) & set(other.seeds))
    logs = [math.log(top.seeds[s] / other.seeds[s]) for s in seeds]
    pct = lambda x: math.expm1(x) * 100  # noqa: E731
    return Pair(pct(sum(logs) / len(logs)), sum(x < 0 for x in logs), len(seeds), pct(min(logs)), pct(max(logs)))


def level(p: Pair) -> bool:
    """The rule: no pick between two forms whose seeds disagree or whose gap is within their seed spread."""
    return p.spread is None or p.lower != p.seeds or abs(p.gap) <= p.spread


class Verdict(NamedTuple):
    status: str                 # "pick", "level", "one seed", "alone", "unmeasured"
    ranked: list[Form]          # lowest mean first
    fewer: list[Form]           # run on fewer seeds: shown, not ranked
    named: list[Form]           # the pick, or the forms level with the top, or the top two of one seed
    runner_up: Form | None
    pair: Pair | None


def mean(form: Form, seeds) -> float:
    return sum(form.seeds[s] for s in seeds) / len(seeds)


def decide(forms: list[Form]) -> Verdict:
    if not forms:
        return Verdict("unmeasured", [], [], [], None, None)
    every = max((f.seeds.keys() for f in forms), key=lambda s: (len(s), sum(set(g.seeds) >= set(s) for g in forms)))
    ranked = sorted((f for f in forms if set(f.seeds) >= set(every)), key=lambda f: (mean(f, every), f.label))
    fewer = [f for f in forms if f not in ranked]
    top = ranked[0]
    if len(ranked) == 1:
        return Verdict("alone", ranked, fewer, [top], None, None)
    runner_up, first = ranked[1], pair(top, ranked[1])
    if len(every) == 1:
        return Verdict("one seed", ranked, fewer, ranked[:2], runner_up, first)
    tied = [top] + [f for f in ranked[1:] if level(pair(top, f))]
    return Verdict("pick" if len(tied) == 1 else "level", ranked, fewer, tied, runner_up, first)


# ---- the rule: stale ---------------------------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess:
    """``git ARGS`` in the repository; a failed command (no git at all included) returns non-zero, never raises."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError as error:
        return subprocess.CompletedProcess(["git", *args], 128, "", str(error))


#: commits that change how code reads, not what it does (lint, formatting), one full hash a line, ``#`` comments: the
#: file git blame's ``--ignore-revs-file`` takes; such a commit does not make a run stale
IGNORED_REVS = ROOT / ".git-blame-ignore-revs"


def ignored_revs() -> set[str]:
    if not IGNORED_REVS.exists():
        return set()
    return {line.split("#")[0].strip() for line in IGNORED_REVS.read_text().splitlines() if line.split("#")[0].strip()}


@functools.cache
def last_change(paths: tuple[str, ...]) -> str | None:
    """The last commit that changed any of ``paths``, but those of :data:`IGNORED_REVS` (None: no git history)."""
    skip = ignored_revs()
    # a merge brings its parents' commits, each judged on its own: the merge itself is not a change
    for commit in _git("log", "--no-merges", "--format=%H", "--", *paths).stdout.split():
        if commit not in skip:
            return commit
    return None


@functools.cache
def contains(commit: str | None, change: str | None) -> bool | None:
    """Whether ``commit`` has ``change`` in its history (None: git cannot tell)."""
    if not commit or not change or _git("cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return None
    code = _git("merge-base", "--is-ancestor", change, commit).returncode
    return {0: True, 1: False}.get(code)


def code_paths() -> dict[str, tuple[str, ...]]:
    """The paths of every code group, as the page lists them."""
    return {"the loop (`loop`)": runs.LOOP, "`sohsm.hf` (a head in a Hugging Face model)": runs.HF,
            **{f"`{head}`": paths for head, paths in HEAD_CODE.items()}, "any other head": ("src/sohsm/heads/",),
            "every head, besides its own": COMMON}


def code_of(head: str) -> tuple[str, ...]:
    return HEAD_CODE.get(head, ("src/sohsm/heads/",)) + COMMON


def code_groups(loop: tuple[str, ...], heads: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The code a run depends on, by the name a page gives it: the loop (``sohsm.hf`` apart) and each head's."""
    hf = tuple(p for p in loop if p.startswith("src/sohsm/hf/"))
    groups = {"loop": tuple(p for p in loop if p not in hf), "sohsm.hf": hf}
    return {name: paths for name, paths in {**groups, **{h: code_of(h) for h in heads}}.items() if paths}


def staleness(commit: str | None, heads: tuple[str, ...], loop: tuple[str, ...]) -> set[str]:
    """What changed since ``commit``: names of :func:`code_groups`; ``{"unknown"}`` where git cannot tell."""
    found = set()
    for what, paths in code_groups(loop, heads).items():
        has = contains(commit, last_change(paths))
        found |= {"unknown"} if has is None else set() if has else {what}
    return found


def form_staleness(form: Form, loop: tuple[str, ...]) -> set[str]:
    return set().union(*(staleness(c, form.heads, loop) for c in sorted(set(form.commits.values()), key=str)))


def state(changes: set[str]) -> str:
    """One word for a set of changes: stale, unknown or current."""
    return "stale" if changes - {"unknown"} else "unknown" if changes else "current"


def speed_staleness(speed: Speed, loop: tuple[str, ...]) -> set[str]:
    return set().union(*(staleness(speed.commits[n], speed.heads[n], loop) for n in speed.rates))


# ---- the pages ---------------------------------------------------------------------------------------------


def _rules() -> str:
    """The rules of this docstring, as the pages print them."""
    text = __doc__.split("by these rules, which the pages print as written here:\n\n", 1)[1].split("\n\nA later", 1)[0]
    return re.sub(r"``([^`]*)``", r"`\1`", re.sub(r"\n  ", " ", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def title(table: Table) -> str:
    return f"{table.situation}: {table.corpus}"


def _pct(value: float) -> str:
    return f"{value:+.2f}%"


def _oldest(commits) -> str:
    """The first of ``commits`` in the history (what a stale verdict rests on); by name where git cannot order."""
    known = sorted({c for c in commits if c})
    when = {c: _git("show", "-s", "--format=%ct", c).stdout.strip() for c in known}
    return min(known, key=lambda c: (when[c] or "~", c)) if known else "unknown"


def speed_words(speed: Speed) -> str:
    order = sorted(speed.rates, key=speed.rates.get, reverse=True)
    fastest = f"`{order[0]}` {speed.rates[order[0]] / speed.rates[order[1]]:.2f}x `{order[1]}`"
    return fastest if len(order) > 1 else f"`{order[0]}` alone"


def code(command: str) -> str:
    """A command as code, unless it is words that hold their own (keep its `lm_head`)."""
    return command if "`" in command else f"`{command}`"


def _gap(p: Pair) -> str:
    return f"{_pct(p.gap)} ({p.lower} of {p.seeds}), spread {p.spread:.2f}%" if p.spread is not None else (
        f"{_pct(p.gap)} (one seed), no spread")


def readme_row(table: Table, verdict: Verdict) -> str:
    """A row of README's table: the situation (a link to its detail), the pick's command or the forms level with the
    top, the top against the runner-up, and how and when it was measured."""
    link = f"[{title(table)}](docs/results/which-head-table.md#{slug(title(table))})"
    if verdict.status == "unmeasured":
        stale = state(speed_staleness(table.speed, table.loop))
        return (f"| {link} | quality unmeasured | speed: {speed_words(table.speed)} | one run each, "
                f"{'' if table.device == 'CPU' else table.device + ', '}{_oldest(table.speed.commits.values())}, "
                f"{stale} |")
    top, runner_up = verdict.named[0], verdict.runner_up
    pick = {"pick": code(top.command), "level": "level: " + ", ".join(f"`{f.label}`" for f in verdict.named),
            "one seed": f"none, one seed; lowest `{top.label}`",  # its command: the table page
            "alone": f"{code(top.command)} alone"}[verdict.status]
    named_second = verdict.status == "level" and verdict.named[1] is runner_up
    gap = "–" if runner_up is None else ("" if named_second else f"`{runner_up.label}`: ") + _gap(verdict.pair)
    named = verdict.named + [f for f in [runner_up] if f and f not in verdict.named]
    stale = state(set().union(*(form_staleness(f, table.loop) for f in named)))
    commits = _oldest(c for f in named for c in f.commits.values())
    seeds = len(top.seeds)
    device = "" if table.device == "CPU" else f"{table.device}, "  # the intro says: on the CPU unless a row says
    return f"| {link} | {pick} | {gap} | {seeds} seed{'s' * (seeds != 1)}, {device}{commits}, {stale} |"


def gpu_speeds(tables: list[Table]) -> list[tuple[Speed, str]]:
    """The speeds measured on a GPU, each with its state (stale, unknown, current)."""
    return [(t.speed, state(speed_staleness(t.speed, t.loop))) for t in tables
            if t.speed and re.search(r"GPU|NVIDIA|H100|H200", t.speed.device)]


def gpu_row(tables: list[Table]) -> str:
    """A GPU: the speeds and the quality runs measured on one, and whether any is current."""
    speeds = gpu_speeds(tables)
    current = [s for s, now in speeds if now == "current"]
    last = _oldest(c for s, _ in speeds for c in s.commits.values()) if speeds else "none"
    quality = [t for t in tables if t.device == "GPU"]
    quality_state = state(set().union(*(form_staleness(f, t.loop) for t in quality for f in t.forms)))
    link = f"[on a GPU](docs/results/which-head-table.md#{slug(GPU)})"
    speed = f"speed: {len(current)} current" if current else f"speed: stale ({last})"
    return f"| {link} | unmeasured | {speed} | quality: {len(quality)} rows, {quality_state} |"


def readme_section(tables: list[Table]) -> str:
    rows = [readme_row(t, decide(t.forms)) for t in tables if t.readme]
    intro = (f"Computed by `{COMMAND}` from the committed runs (rows in full, rules: "
             "[which-head-table.md](docs/results/which-head-table.md#the-rules)). *Gap*: the top's perplexity "
             "(bits/byte for subwords) over the runner-up's, lower on k of n seeds; *level*: seeds disagree or the gap "
             "is within their spread, no pick; *stale*: its head's or the loop's code changed since. On the CPU unless "
             "a row says.")
    return "\n".join([
        "",
        *textwrap.wrap(intro, 120, break_long_words=False, break_on_hyphens=False),
        "",
        "| situation | pick | the top against the runner-up | measured |",
        "|---|---|---|---|",
        *rows,
        gpu_row(tables),
        "", ""])


def _form_line(form: Form, top: Form, verdict: Verdict, table: Table) -> str:
    """A form's row: its command, seeds and mean (over the seeds it shares with the top), the top against it."""
    shared = sorted(set(form.seeds) & set(top.seeds)) or sorted(form.seeds)
    against = "– | – | –" if form is top or set(form.seeds) & set(top.seeds) else "– | no seed in common | –"
    if against == "– | – | –" and form is not top:
        p = pair(top, form)
        against = (f"{_pct(p.gap)} | {p.lower} of {p.seeds} | " + ("no spread" if p.spread is None else
                   f"{p.spread:.2f}% ({_pct(p.low)} to {_pct(p.high)}): {'level' if level(p) else 'below'}"))
    ranked = "" if form in verdict.ranked else " (not ranked)"
    commits = ", ".join(sorted({c or "unknown" for c in form.commits.values()}))
    changes = form_staleness(form, table.loop)
    since = state(changes) + (f": {', '.join(sorted(changes - {'unknown'}))}" if changes - {"unknown"} else "")
    digits = 4 if "bits" in table.metric else 2
    return (f"| `{form.label}`{ranked} | {code(form.command)} | {', '.join(map(str, sorted(form.seeds)))} | "
            f"{mean(form, shared):.{digits}f} | {against} | {commits} | {since} |")


def verdict_words(verdict: Verdict) -> str:
    p, named = verdict.pair, verdict.named
    if verdict.status == "pick":
        return (f"**Pick** {code(named[0].command)}: {_pct(p.gap)} against the runner-up `{verdict.runner_up.label}` "
                f"(lower on {p.lower} of {p.seeds} seeds), beyond the gap's seed spread of {p.spread:.2f}%.")
    if verdict.status == "level":
        return (f"**Level**, no pick: {', '.join(f'`{f.label}`' for f in named)} (the top and every form level with "
                f"it); the top against the runner-up `{verdict.runner_up.label}`: {_pct(p.gap)}, lower on {p.lower} "
                f"of {p.seeds} seeds, seed spread {p.spread:.2f}%.")
    if verdict.status == "one seed":
        return (f"**One seed**, no pick: lowest `{named[0].label}`, {_pct(p.gap)} against `{named[1].label}`, "
                "with no seed spread to judge the gap by.")
    if verdict.status == "alone":
        return f"**One form** on every seed, `{named[0].label}`: nothing to compare it with."
    return "**Quality unmeasured**: speed alone."


def _speed_lines(table: Table) -> list[str]:
    speed = table.speed
    if speed is None:
        return []
    changes = speed_staleness(speed, table.loop)
    rates = ", ".join(f"`{n}` {r:,.{0 if r >= 1000 else 1}f}" for n, r in sorted(speed.rates.items(),
                                                                              key=lambda x: -x[1]))
    commits = ", ".join(sorted(set(speed.commits.values())))
    return ["", f"Speed, training tokens/s ({speed.device}; commit {commits}; [the page]({speed.page})): {rates}. "
            f"The fastest: {speed_words(speed)}, one measurement each; {state(changes)}"
            + (f" ({', '.join(sorted(changes - {'unknown'}))} changed since)." if changes - {"unknown"} else ".")]


def situation(table: Table) -> list[str]:
    """A situation in full: the verdict, how it was measured, and every form against the top."""
    verdict = decide(table.forms)
    missing = [h for h in ("full", "adaptive", "two_level_frequency", "self_organized")
               if h not in {f.head for f in table.forms}]
    measured = "; ".join([table.budget[0].upper() + table.budget[1:], table.device,
                          *([table.metric] if table.metric else []),
                          f"the runs: [{table.page.split('/')[-1]}]({table.page})"])
    not_run = f" Not run: {', '.join(f'`{h}`' for h in missing)}." if table.forms and missing else ""
    lines = [f"## {title(table)}", "", f"{verdict_words(verdict)} {measured}.{not_run}"]
    if table.forms:
        lines += ["", "| form | command | seeds | mean | the top over it | lower on | seed spread: the top is "
                  "| commits | changed since |", "|---|---|---|---:|---:|---|---|---|---|"]
        lines += [_form_line(f, verdict.ranked[0], verdict, table) for f in verdict.ranked + verdict.fewer]
    return lines + _speed_lines(table) + [""]


def _wrapped(line: str) -> list[str]:
    """A paragraph or list item in lines of 120 characters at most; a table row or heading as it is."""
    if line.startswith(("|", "#")) or len(line) <= 120:
        return [line]
    return textwrap.wrap(line, 120, subsequent_indent="  " if line.startswith("- ") else "",
                         break_long_words=False, break_on_hyphens=False)


def table_page(tables: list[Table]) -> str:
    """which-head-table.md: the rules, the code each run is checked against, every situation in full, a GPU."""
    lines = ["# Which head to pick: the table, computed", "",
             f"Written by `{COMMAND}` from the committed runs, and by no hand (`benchmarks/which_head_runs.py` says "
             "what each situation reads). README's section \"Which head to pick\" is its summary, a row a situation; "
             "[which-head.md](which-head.md) gives the evidence in words.", "",
             "## The rules", "", *_rules().split("\n"), "",
             "The code each run is checked against (a folder: every file in it):", "",
             *(f"- {name}: {', '.join(f'`{p}`' for p in paths)}" for name, paths in code_paths().items()), ""]
    for table in tables:
        lines += situation(table)
    speeds = "; ".join(f"{s.device}, commit {', '.join(sorted(set(s.commits.values())))}: {now}"
                       for s, now in gpu_speeds(tables))
    quality = "; ".join(f"[{title(t)}](#{slug(title(t))})" for t in tables if t.device == "GPU")
    lines += [f"## {GPU}", "",
              f"Speed: {speeds or 'none'} (the GPU speeds of `docs/benchmarks/measured.json`; "
              "[gpu.md](../benchmarks/gpu.md) keeps others, written by hand, which this script does not read). "
              f"Quality: {quality or 'none'}. A speed of this code on a GPU is unmeasured unless one here is current."]
    return "\n".join(wrapped for line in lines for wrapped in _wrapped(line)) + "\n"


def readme_text(text: str, section: str) -> str:
    """``text`` (README) with its section replaced by ``section``."""
    match = re.search(rf"^{re.escape(SECTION)}[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    if match is None:
        raise SystemExit(f"README.md has no '{SECTION}' heading")
    return text[:match.start(1)] + section + text[match.end(1):]


def written(texts: dict[Path, str]) -> dict[Path, str]:
    """README.md (``texts[README]``: as it is) and which-head-table.md as this script writes them from the committed
    runs."""
    tables = runs.tables()
    return {README: readme_text(texts[README], readme_section(tables)),
            TABLE: table_page(tables)}


def differences(texts: dict[Path, str]) -> list[str]:
    """Where ``texts`` are not what this script writes: per file, its first line that differs and what it should
    read, and the command that writes it again."""
    problems = []
    for path, want in written(texts).items():
        if texts[path] != want:
            have, should = next((a, b) for a, b in itertools.zip_longest(texts[path].splitlines(), want.splitlines())
                                if a != b)
            problems.append(f"{path.relative_to(ROOT)} is not what `{COMMAND}` writes from the committed runs (a run "
                            f"added, or code changed since a run: a row turned stale): «{have}» should read "
                            f"«{should}». Run `{COMMAND}` and commit README.md and {TABLE.relative_to(ROOT)}.")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page differs")
    args = parser.parse_args(argv)
    texts = {path: path.read_text() if path.exists() else "" for path in (README, TABLE)}
    if args.check:
        problems = differences(texts)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path, text in written(texts).items():
        if text != texts[path]:
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
