"""The figures README's "Which head to pick" and docs/results/which-head.md quote are those of the pages they link,
and the generated result pages are what their scripts write from the committed runs: a page and its quotes cannot
drift apart. (README's section and its long form, docs/results/which-head-table.md, are written by
benchmarks/which_head.py: tests/test_which_head.py compares them with what the script writes, where the history is
there to tell a stale run by. README's rows are read here as quotes of the table page they link, figure by figure,
and each row as its section's verdict: pick or level names, runner-up, gap, k of n, spread, seeds, commit, state.)

A quoting text is split into units: a paragraph, a list item (a nested one is a unit of its own), a table row, a
heading; fenced code (commands) is left out. A figure is a number with one decimal point as printed (104.07, 2.28 of
"2.28%", 1.17 of "1.17x", 1,907.63), its sign left out; numbers with two or more points (versions such as 2.11.0) and
numbers glued to a letter before them (v0.3) are not figures. Every figure of a unit must be a figure of at least one
docs/*.md page that the unit links (relative links resolved from the quoting file's folder); a link with an anchor
gives only its heading's section (to the next heading of its level or above), so a figure said of one table cannot
be found in another, and an anchor with no such heading fails. A "k of n" of a unit's prose (not of a table row:
tables are read row by row below) must be in what its links give too. A unit with figures and no such link fails.
"""
import functools
import json
import re
import sys
from pathlib import Path

import pytest

from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCHMARKS = ROOT / "benchmarks"
README = ROOT / "README.md"
WHICH_HEAD = DOCS / "results" / "which-head.md"
SECTION = "Which head to pick"

NUMBER = re.compile(r"\d(?:[\d,.]*\d)?")            # a run of digits, commas and points, from a digit to a digit
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s")
FENCE = re.compile(r"\s*(```|~~~)")
K_OF_N = re.compile(r"\b\d+ of \d+\b")                # "3 of 3" (seeds), as the pages print it


def figures(text: str, glued: bool = False) -> list[str]:
    """The decimal figures of ``text`` as printed; ``glued``: also those right after a letter (a page's own)."""
    found = []
    for match in NUMBER.finditer(text):
        if match.group().count(".") != 1:
            continue
        if not glued and match.start() and text[match.start() - 1].isalpha():
            continue
        found.append(match.group())
    return found


def units(text: str) -> list[str]:
    """The paragraphs, list items, table rows and headings of markdown ``text``, each joined into one line."""
    found, current, fenced = [], [], False

    def close():
        if current:
            found.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        if FENCE.match(line):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = line.strip()
        while stripped.startswith(">"):                 # a quoted block reads as its text
            stripped = stripped[1:].strip()
        if not stripped:
            close()
        elif stripped.startswith(("|", "#")):
            close()
            found.append(stripped)
        else:
            if LIST_ITEM.match(line):
                close()
            current.append(stripped)
    close()
    return found


def linked_pages(unit: str, folder: Path) -> list[tuple[Path, str]]:
    """The docs/*.md pages ``unit`` links, resolved from ``folder`` (the quoting file's), each with its anchor."""
    pages = []
    for target in LINK.findall(unit):
        path, _, anchor = target.partition("#")
        if not path or "://" in path or path.startswith("mailto:"):
            continue
        page = (folder / path).resolve()
        if page.suffix == ".md" and page.is_relative_to(DOCS.resolve()) and (page, anchor) not in pages:
            pages.append((page, anchor))
    return pages


@functools.cache
def _slug():
    return load_script("which_head").slug


def heading_section(text: str, anchor: str) -> str | None:
    """What of markdown ``text`` lies under the heading GitHub anchors ``anchor``, to the next heading of its level
    or above (fenced code holds no heading); None where no heading has that anchor."""
    lines, start, level, fenced, seen = text.splitlines(), None, 0, False, {}
    for number, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+)\s+(.*)", line)
        if heading is None:
            continue
        if start is not None and len(heading.group(1)) <= level:
            return "\n".join(lines[start:number])
        slug = _slug()(heading.group(2).strip())            # GitHub's: the second "Speed" is speed-1
        slug, seen[slug] = (f"{slug}-{seen[slug]}" if slug in seen else slug), seen.get(slug, 0) + 1
        if start is None and slug == anchor:
            start, level = number, len(heading.group(1))
    return None if start is None else "\n".join(lines[start:])


def unquoted(text: str, folder: Path, name: str) -> list[str]:
    """What in ``text`` (of the file ``name``, in ``folder``) is not quoted from a page it links: one line each."""
    problems: list[str] = []
    texts: dict[Path, str | None] = {}
    given: dict[tuple[Path, str], set[str] | None] = {}
    for unit in units(text):
        shown = LINK.sub(lambda m: m.group(0).split("](", 1)[0] + "]", unit)   # a link's target holds no figure
        wanted = figures(shown)
        counts = [] if unit.startswith("|") else K_OF_N.findall(shown)
        if not wanted and not counts:
            continue
        start = " ".join(unit.split()[:8])
        pages = linked_pages(unit, folder)
        if not pages:
            problems.append(f"{name}: «{start} ...» quotes {', '.join(wanted + counts)} and links no docs/*.md page")
            continue
        have: set[str] = set()
        for page, anchor in pages:
            if page not in texts:
                texts[page] = page.read_text() if page.is_file() else None
            if (page, anchor) not in given:   # what a page, or its anchored section, quotes: read once a call
                section = texts[page] if texts[page] is None or not anchor else heading_section(texts[page], anchor)
                given[page, anchor] = (None if section is None
                                       else set(figures(section, glued=True)) | set(K_OF_N.findall(section)))
            if texts[page] is None:
                problems.append(f"{name}: «{start} ...» links {page.relative_to(ROOT)}, which does not exist")
            elif given[page, anchor] is None:
                problems.append(f"{name}: «{start} ...» links {page.relative_to(ROOT)}#{anchor}, no such heading")
            else:
                have |= given[page, anchor]
        for figure in wanted + counts:
            if figure not in have:
                named = ", ".join(str(p.relative_to(ROOT)) + (f"#{a}" if a else "") for p, a in pages)
                problems.append(f"{name}: «{start} ...» quotes {figure}, found in none of {named}")
    return problems


def readme_section(text: str) -> str | None:
    """README's section "Which head to pick": from its heading to the next ``## `` heading (None without one)."""
    match = re.search(rf"^## {re.escape(SECTION)}[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    return match.group(1) if match else None


def test_which_head_md_quotes_only_what_its_linked_pages_say():
    problems = unquoted(WHICH_HEAD.read_text(), WHICH_HEAD.parent, "docs/results/which-head.md")
    assert not problems, "\n".join(problems)


def test_readme_which_head_section_quotes_only_what_its_linked_pages_say():
    section = readme_section(README.read_text())
    if section is None:
        pytest.skip(f"README.md has no '## {SECTION}' heading")
    problems = unquoted(section, README.parent, "README.md")
    assert not problems, "\n".join(problems)


def test_every_figure_of_readme_is_quoted_from_a_page_it_links():
    """Not only its generated section: README keeps its provenance on the docs pages it links, so a figure anywhere
    in it (its fenced commands and output left out) is a figure of a page its paragraph, item or row links."""
    problems = unquoted(README.read_text(), README.parent, "README.md")
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_figure_its_page_lacks_and_a_figure_with_no_link(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    (docs / "results" / "fair.md").write_text(
        "# Fair\n\n| run | 104.07 / 98.10 |\n\n- full-tied: -0.23% (t -0.27, p 0.813), lower on 2 of 3\n\n"
        "## One, at 1M\n\n-0.43%, lower on 3 of 3\n\n```bash\n# Two\n```\n\n### Deeper\n\n0.21%\n\n"
        "## Two\n\n0.44%, 1 of 3\n\n## Speed\n\n1.5x\n\n## Speed\n\n1.34x\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", docs)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    text = ("The head scored 104.07, level (0.23%, [fair](results/fair.md#fair)); torch 2.11.0, v0.3 and `1e5e578`.\n\n"
            "- It was 2.28% lower\n  ([fair.md](results/fair.md)).\n"
            "  - nested, 104.07 and no link\n\n"
            "| row | 98.10 | [page](results/fair.md) |\n"
            "| row | 0.81 | [page](results/fair.md) |\n\n"
            "```bash\nsohsm lm train --lr 0.35\n```\n\n"
            "See [the missing page](results/none.md): 1.5x.\n\n"
            "p 0.81 [fair](https://example.org/fair.md)\n\n"
            "At 1M lower on 3 of 3 by 0.43%, spread 0.21% ([one](results/fair.md#one-at-1m)).\n\n"
            "At 1M lower on 1 of 3 by 0.44% ([one](results/fair.md#one-at-1m)).\n\n"
            "| at 1M | 0.44% | 1 of 3 | [one](results/fair.md#one-at-1m) |\n\n"
            "Lower on 2 of 3 and 1 of 3 ([fair](results/fair.md)), 1.34x ([speed](results/fair.md#speed-1)).\n\n"
            "1.5x ([speed](results/fair.md#speed-2)).\n")
    problems = unquoted(text, docs, "quoting.md")
    fair, none, one = "docs/results/fair.md", "docs/results/none.md", "docs/results/fair.md#one-at-1m"
    assert problems == [
        f"quoting.md: «- It was 2.28% lower ([fair.md](results/fair.md)). ...» quotes 2.28, found in none of {fair}",
        "quoting.md: «- nested, 104.07 and no link ...» quotes 104.07 and links no docs/*.md page",
        f"quoting.md: «| row | 0.81 | [page](results/fair.md) | ...» quotes 0.81, found in none of {fair}",
        f"quoting.md: «See [the missing page](results/none.md): 1.5x. ...» links {none}, which does not exist",
        f"quoting.md: «See [the missing page](results/none.md): 1.5x. ...» quotes 1.5, found in none of {none}",
        "quoting.md: «p 0.81 [fair](https://example.org/fair.md) ...» quotes 0.81 and links no docs/*.md page",
        f"quoting.md: «At 1M lower on 1 of 3 by ...» quotes 0.44, found in none of {one}",
        f"quoting.md: «At 1M lower on 1 of 3 by ...» quotes 1 of 3, found in none of {one}",
        f"quoting.md: «| at 1M | 0.44% | 1 of ...» quotes 0.44, found in none of {one}",
        f"quoting.md: «1.5x ([speed](results/fair.md#speed-2)). ...» links {fair}#speed-2, no such heading",
        f"quoting.md: «1.5x ([speed](results/fair.md#speed-2)). ...» quotes 1.5, found in none of {fair}#speed-2",
    ]


def test_readme_section_runs_to_the_next_second_level_heading():
    text = "# t\n\n## Which head to pick\n\nA 1.5x.\n\n### Sub\n\nB 2.5x.\n\n## Set up and run\n\nC 3.5x.\n"
    assert readme_section(text) == "\nA 1.5x.\n\n### Sub\n\nB 2.5x.\n\n"
    assert readme_section("**Which head to pick.** 1.5x\n\n## Set up\n") is None


# ---- README's section and its long form, which-head-table.md: written by benchmarks/which_head.py ---------------
#
# The section is the script's output from the committed runs (tests/test_which_head.py compares them and changes each
# figure, sign, k of n and name). What this file keeps of it: the words, the spans a mutation changes, and the speeds
# of hand-written pages that the script reads from docs/benchmarks/measured.json.

MEASURED = "docs/benchmarks/measured.json"
#: a figure as the section prints it, with its sign (a number with one point, not glued to a letter before it), and
#: a "k of n"
SIGNED = re.compile(r"[+-]?\d(?:[\d,.]*\d)?")


def quoted_spans(section: str) -> list[tuple[int, int, str]]:
    """Each figure and "k of n" of ``section`` outside link targets: (start, end, text)."""
    spans = []
    for match in SIGNED.finditer(section):
        number = match.group().lstrip("+-")
        start = match.start() + len(match.group()) - len(number)
        if number.count(".") == 1 and not (start and section[start - 1].isalpha()):
            spans.append((match.start(), match.end(), match.group()))
    spans += [(m.start(), m.end(), m.group()) for m in K_OF_N.finditer(section)]
    targets = [m.span(1) for m in LINK.finditer(section)]
    return [span for span in spans if not any(a <= span[0] < b for a, b in targets)]


def _section() -> str:
    section = readme_section(README.read_text())
    assert section is not None, f"README.md has no '## {SECTION}' heading"
    return section


def mutations(section: str):
    """``section`` with one figure, sign or "k of n" changed, each way in turn: (what changed, the new section)."""
    for start, end, text in quoted_spans(section):
        if " of " in text:
            k, n = map(int, text.split(" of "))
            changed = [f"{k - 1 if k else k + 1} of {n}", f"{k} of {n + 1}"]
        else:
            sign, number = (text[0], text[1:]) if text[0] in "+-" else ("", text)
            last = number[-1]
            changed = [sign + number[:-1] + str((int(last) + 1) % 10),
                       {"+": "-", "-": "+", "": "-"}[sign] + number]
        for new in changed:
            yield f"{text} -> {new}", section[:start] + new + section[end:]


def test_readme_section_is_under_500_words():
    """Short enough to read at a glance. (450 while README ran to 6,000 words; with README under 2,500 and the rows
    a user asked for added, large vocabularies, a pretrained model as converted and fine-tuned, the GPU, 500.)"""
    assert len(_section().split()) < 500


def test_hand_measured_figures_are_their_pages():
    """docs/benchmarks/measured.json keeps the speeds of pages written by hand: each tokens/s as the page prints it,
    the ratio which_head.py renders from them (the fastest over the next) printed there too, and which-head-table.md
    names the commit that measured them."""
    table = (DOCS / "results" / "which-head-table.md").read_text()
    for name, measured in json.loads((ROOT / MEASURED).read_text()).items():
        page = (ROOT / measured["page"]).read_text()
        for head, rate in measured["tokens_per_s"].items():
            assert f"{rate:,}" in page, f"{MEASURED} {name}: {head}'s {rate:,} tokens/s is not on {measured['page']}"
        assert measured["commit"] and measured["device"] and measured["command"], name
        fast, slow = sorted(measured["tokens_per_s"].values(), reverse=True)[:2]
        assert f"{fast / slow:.2f}x" in page, f"{MEASURED} {name}: {fast / slow:.2f}x is not on {measured['page']}"
        assert f"commit {measured['commit']}" in table, f"which-head-table.md: no commit {measured['commit']} ({name})"


# ---- README's rows against the table page's sections they link ---------------------------------------------------
#
# A row is the short form of the section its first cell links: the pick or the forms level with the top, the runner-up,
# the gap, its k of n and its spread are the section's verdict; its seeds, commit and state are those of the section's
# rows. The figure check above reads only the numbers (a k of n, a name, a sign or a state word could change and
# pass), and tests/test_which_head.py needs the history: this holds wherever the two committed texts are.

TABLE_PAGE = DOCS / "results" / "which-head-table.md"
ROW = re.compile(r"^\| \[[^\]]*\]\(docs/results/which-head-table\.md#([\w-]+)\) \| (.*) \| (.*) \| (.*) \|$")
GAP = re.compile(r"^(?:`([^`]+)`: )?([+-]\d+\.\d+%) \((?:(\d+ of \d+)|one seed)\), (?:spread (\d+\.\d+%)|no spread)$")
SEEDS = re.compile(r"^(\d+) seeds?, (?:.+, )?([0-9a-f]{7,40}), (current|stale|unknown)$")
SPEED_ROW = re.compile(r"^speed: (.+)$")
STATUS = re.compile(r"^\*\*(Pick|Level|One seed|One form|Quality unmeasured)\*\*")


def table_sections(text: str) -> dict[str, list[str]]:
    """The table page's sections by their heading's anchor: their lines, the heading left out."""
    which_head = load_script("which_head")
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(which_head.slug(line[3:]), [])
        elif current is not None:
            current.append(line)
    return sections


def _verdict(lines: list[str]) -> dict:
    """What a section's verdict paragraph says: status, pick, named forms, runner-up, gap, k of n, spread."""
    paragraph = "\n".join(lines).strip().split("\n\n")[0].replace("\n", " ")
    status = STATUS.match(paragraph)
    said = {"status": status.group(1) if status else None}
    if said["status"] == "Pick":
        said["pick"] = re.match(r"\*\*Pick\*\* (.+?): [+-]\d", paragraph).group(1)
    if said["status"] == "Level":
        said["named"] = re.findall(r"`([^`]+)`", paragraph.split(" (the top", 1)[0])
    if said["status"] == "One seed":
        said["named"] = re.findall(r"lowest `([^`]+)`", paragraph)
    runner = re.search(r"(?:the runner-up|against) `([^`]+)`", paragraph)
    gap, k_of_n = re.search(r"[+-]\d+\.\d+%", paragraph), re.search(r"(\d+ of \d+) seeds", paragraph)
    spread = re.search(r"spread(?: of)? (\d+\.\d+%)", paragraph)
    said.update(runner=runner and runner.group(1), gap=gap and gap.group(), k_of_n=k_of_n and k_of_n.group(1),
                spread=spread and spread.group(1))
    return said


def _forms(lines: list[str]) -> dict[str, list[str]]:
    """A section's table rows by form label: their cells."""
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        label = re.match(r"`([^`]+)`", cells[0]) if line.startswith("| `") else None
        if label:
            rows[label.group(1)] = cells
    return rows


def _state(states: set[str]) -> str:
    """The one word for rows' "changed since" words: stale where one is, else unknown where one is, else current."""
    return "stale" if "stale" in states else "unknown" if "unknown" in states else "current"


def row_problems(section: str, page: str) -> list[str]:
    """Where a row of README's ``section`` is not the verdict of the table ``page``'s section it links."""
    sections, problems = table_sections(page), []
    for line in section.splitlines():
        if not line.startswith("| ["):
            continue
        row = ROW.match(line)
        if not row or row.group(1) not in sections:
            problems.append(f"README row links no section of which-head-table.md: «{line}»")
            continue
        anchor, pick, gap, measured = row.groups()
        lines = sections[anchor]
        said = _verdict(lines)
        wrong = lambda what, have, want: problems.append(  # noqa: E731
            f"README row #{anchor}: {what} {have!r}, its section says {want!r}")
        if pick == "unmeasured":                                # on a GPU: the section lists what was measured
            text = " ".join(lines)
            speed = re.search(r"commit (\w+): (\w+)", text)
            quality = re.search(r"Quality: (.*?)\. A speed", text)
            linked = [a.lstrip("#") for a in LINK.findall(quality.group(1))] if quality else []
            states = {form[8].split(":")[0] for a in linked for form in _forms(sections.get(a, [])).values()}
            want = f"speed: {speed.group(2)} ({speed.group(1)})" if speed else None
            if gap != want:
                wrong("speed", gap, want)
            if measured != f"quality: {len(linked)} rows, {_state(states)}":
                wrong("quality", measured, f"{len(linked)} rows, {_state(states)}")
            continue
        if pick == "quality unmeasured":
            fastest = SPEED_ROW.match(gap)
            speed_line = next((s for s in lines if s.startswith("Speed, ")), "")
            speed_line = " ".join(s for s in lines[lines.index(speed_line):] if s) if speed_line else ""
            if said["status"] != "Quality unmeasured":
                wrong("status", "quality unmeasured", said["status"])
            if not fastest or f"The fastest: {fastest.group(1)}, one measurement each; " not in speed_line:
                wrong("speed", gap, speed_line)
            commit, word = (["", ""] + measured.split(", "))[-2:]
            if not re.search(rf"commit [^;]*\b{re.escape(commit)}\b", speed_line) or \
                    f"one measurement each; {word}" not in speed_line:
                wrong("speed's commit and state", measured, speed_line)
            continue
        status, named = "Pick", []
        if pick.startswith("level: "):
            status, named = "Level", re.findall(r"`([^`]+)`", pick)
        elif pick.startswith("none, one seed; lowest "):
            status, named = "One seed", re.findall(r"`([^`]+)`", pick)
        elif pick.endswith(" alone"):
            status = "One form"
        if said["status"] != status:
            wrong("status", status, said["status"])
        if status == "Pick" and pick != said.get("pick"):
            wrong("pick", pick, said.get("pick"))
        if named and named != said.get("named"):
            wrong("forms", named, said.get("named"))
        parts = GAP.match(gap)
        if gap != "–" and not parts:
            problems.append(f"README row #{anchor}: the gap «{gap}» does not read as one")
        elif parts:
            runner = parts.group(1) or (named[1] if status == "Level" and len(named) > 1 else None)
            for what, have in (("runner-up", runner), ("gap", parts.group(2)), ("k of n", parts.group(3)),
                               ("spread", parts.group(4))):
                key = what.replace("-", "_").replace(" ", "_").replace("runner_up", "runner")
                if have != said[key]:
                    wrong(what, have, said[key])
        forms = _forms(lines)
        cells = SEEDS.match(measured)
        if not cells or not forms:
            problems.append(f"README row #{anchor}: «{measured}» does not read as seeds, commit and state")
            continue
        top = next(iter(forms.values()))
        compared = [top] + [forms[n] for n in dict.fromkeys([*named, said["runner"]]) if n in forms and forms[n] != top]
        seeds, commit, word = cells.groups()
        if int(seeds) != len(top[2].split(", ")):
            wrong("seeds", seeds, top[2])
        if not any(commit in form[7].split(", ") for form in compared):
            wrong("commit", commit, [form[7] for form in compared])
        if word != _state({form[8].split(":")[0] for form in compared}):
            wrong("state", word, _state({form[8].split(":")[0] for form in compared}))
    return problems


def row_mutations(section: str, page: str):
    """README's rows with one thing changed each: a figure, sign or k of n, a name (swapped for another form of its
    section), the seeds, or the state word."""
    sections = table_sections(page)
    for line in section.splitlines():
        row = ROW.match(line)
        if not row:
            continue
        for what, changed in mutations(line):
            yield what, section.replace(line, changed, 1)
        labels = list(_forms(sections.get(row.group(1), [])))
        for name in dict.fromkeys(re.findall(r"`([^`]+)`", line.split(" | ", 1)[1])):
            for other in [label for label in labels if label != name][:2]:
                yield f"{name} -> {other}", section.replace(line, line.replace(f"`{name}`", f"`{other}`"), 1)
        for old, new in (("current |", "stale |"), ("stale |", "current |"), (" seeds, ", "0 seeds, ")):
            if old in line:
                yield f"{old} -> {new}", section.replace(line, line.replace(old, new, 1), 1)


def test_readme_rows_are_the_verdicts_of_the_sections_they_link():
    problems = row_problems(_section(), TABLE_PAGE.read_text())
    assert not problems, "\n".join(problems)


def test_any_changed_figure_name_k_of_n_seeds_or_state_of_a_readme_row_fails():
    """What the figure check let pass (a k of n, a runner-up's name, -0.16% for -0.17% where -0.17% is elsewhere on
    the page): each change to a row must make the row check fail."""
    section, page = _section(), TABLE_PAGE.read_text()
    changes = list(row_mutations(section, page))
    assert len(changes) >= 100, "the rows' figures and names were not found"
    passed = [what for what, changed in changes if not row_problems(changed, page)]
    assert not passed, f"these changes of README's rows pass the row check: {passed}"


# ---- which-head.md's tables, row by row from the same named figures (its prose keeps the check above) ------------
#: the rows as they must read: benchmarks/which_head_md.py computes them from the JSON (and writes them)
WHICH_HEAD_MD = load_script("which_head_md")
LARGE_VOCAB_HEADER = WHICH_HEAD_MD.LARGE_VOCAB_HEADER


def table_problems(text: str, tables: dict[str, list[str]] | None = None) -> list[str]:
    """Where a table of which-head.md ``text`` is not what its named figures make it (``tables``: which_head_md's
    tables, read once by a caller that asks many times): one line a row."""
    lines, problems = text.splitlines(), []
    for header, rows in (tables or WHICH_HEAD_MD.which_head_tables()).items():
        if header not in lines:
            problems.append(f"which-head.md: no table headed {header}")
            continue
        at = lines.index(header) + 2
        found = lines[at:at + len(rows)] + [""] * (len(rows) - len(lines[at:at + len(rows)]))
        problems += [f"which-head.md: «{have}» should read «{want}»"
                     for have, want in zip(found, rows) if have != want]
        if at + len(rows) < len(lines) and lines[at + len(rows)].startswith("|"):
            problems.append(f"which-head.md: a row past those tied to their figures: «{lines[at + len(rows)]}»")
    return problems


def test_which_head_md_tables_are_their_data():
    problems = table_problems(WHICH_HEAD.read_text())
    assert not problems, "\n".join(problems) + "\n(python benchmarks/which_head_md.py writes them)"


def test_the_writer_restores_a_changed_a_missing_and_an_extra_row_and_leaves_the_prose():
    text, tables = WHICH_HEAD.read_text(), WHICH_HEAD_MD.which_head_tables()
    first, last = tables[LARGE_VOCAB_HEADER][0], tables[LARGE_VOCAB_HEADER][-1]
    promise = tables["| head | tied | untied | source |"][-1]
    damaged = (text.replace(first, first.replace(" | ", " | 9", 1), 1).replace(last + "\n", "", 1)
               .replace(promise + "\n", promise + "\n| extra |\n", 1))
    assert len(table_problems(damaged, tables)) >= 3
    assert WHICH_HEAD_MD.write_tables(damaged, tables) == text
    with pytest.raises(SystemExit, match="no table headed"):
        WHICH_HEAD_MD.write_tables(text.replace(LARGE_VOCAB_HEADER, "| a table renamed |"), tables)


def test_any_changed_figure_sign_or_k_of_n_of_which_head_md_tables_fails():
    text = WHICH_HEAD.read_text()
    tables = [line for header, rows in WHICH_HEAD_MD.which_head_tables().items() for line in rows]
    changes = [(what, changed) for row in tables for what, changed_row in mutations(row)
               for changed in [text.replace(row, changed_row, 1)]]
    assert len(changes) >= 2 * len(tables)
    passed = [what for what, changed in changes if not table_problems(changed)]
    assert not passed, f"these changes of which-head.md's tables pass the check: {passed}"


def test_any_changed_figure_or_k_of_n_of_which_head_md_large_vocabularies_fails():
    """The section that quotes the large-vocabulary runs: its table is their data (above) and each figure and k of n
    of its prose is on the section of a page its links name, so none can change and pass. (A sign in prose is not
    read: the figure check leaves signs out.)"""
    text = WHICH_HEAD.read_text()
    section = heading_section(text, "large-vocabularies-128k-and-200k-tokens")
    assert section, "which-head.md has no section on large vocabularies"
    checked, passed = 0, []
    tables = {LARGE_VOCAB_HEADER: WHICH_HEAD_MD.which_head_tables()[LARGE_VOCAB_HEADER]}
    assert not table_problems(section, tables)
    for what, changed in mutations(section):
        at = next(i for i, (a, b) in enumerate(zip(section, changed)) if a != b)
        old, new = what.split(" -> ")
        if old.lstrip("+-") == new.lstrip("+-") and not section[section.rfind("\n", 0, at) + 1:].startswith("|"):
            continue
        checked += 1
        if not unquoted(changed, WHICH_HEAD.parent, "which-head.md") and not table_problems(changed, tables):
            passed.append(what)
    assert checked >= 2 * len(WHICH_HEAD_MD.large_vocab_rows())
    assert not passed, f"these changes of which-head.md's large vocabularies pass the check: {passed}"


# ---- the generated pages, written again from the committed runs --------------------------------------------------




def _fair(output):
    fair = load_script("fair_quality")
    return fair.report(output=output, results=fair.RESULTS), fair.REPORT


def _subword(output):
    subword = load_script("subword")
    return subword.report(output=output, results=subword.RESULTS), subword.REPORT


def _subword_hf(output):
    hf = load_script("subword_hf")
    return hf.report(output=output, results=hf.RESULTS, sohsm_results=hf.subword.RESULTS), hf.REPORT


def _subword_hf_matched(output):
    hf = load_script("subword_hf")
    return (hf.report(output=output, results=hf.MATCHED_RESULTS, sohsm_results=hf.subword.MATCHED_RESULTS,
                      matched=True), hf.MATCHED_REPORT)


def _tuning(output):
    tuning = load_script("tuning")
    return tuning.report(output=output, results=tuning.RESULTS), tuning.REPORT


def _large_vocab(output):
    large_vocab = load_script("large_vocab")
    return large_vocab.report(output=output, results=large_vocab.RESULTS), large_vocab.REPORT


@pytest.mark.parametrize("write", [_fair, _subword, _subword_hf, _subword_hf_matched, _tuning, _large_vocab],
                         ids=["fair.md", "subword.md", "subword-hf.md", "subword-hf-matched.md", "tuning.md",
                              "large-vocab.md"])
def test_a_generated_page_is_what_its_script_writes_from_the_committed_runs(write, tmp_path):
    """The page and its figures by name (``PAGE.json``, which README's checks read). scipy (the reports' paired
    t-tests) comes with the dev extra: without it this fails rather than skips."""
    output = tmp_path / "page.md"
    text, committed = write(output)
    assert output.read_text() == text
    for made, kept in ((output, committed), (output.with_suffix(".json"), committed.with_suffix(".json"))):
        assert kept.is_file(), f"{kept.relative_to(ROOT)} is not committed: run python benchmarks/SCRIPT.py report"
        assert made.read_bytes() == kept.read_bytes(), (
            f"{kept.relative_to(ROOT)} differs from what its script writes from the committed runs: "
            "regenerate it (python benchmarks/SCRIPT.py report) and commit the page and its .json")
