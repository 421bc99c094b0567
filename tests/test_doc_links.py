"""Every relative link of README.md and of the pages under docs/ leads somewhere: to a file or folder of the
repository, and where it names an anchor (``page.md#section``), to a heading of that page as GitHub makes its
anchors. Fenced code is left out; links to other sites are not followed."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"\s*(```|~~~)")
HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> list[str]:
    """The lines of markdown ``text`` outside fenced code."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``, a repeated one numbered ``-1``, ``-2``, ..."""
    found, seen = set(), {}
    for line in prose(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if not count else f"{slug}-{count}")
    return found


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """The relative links of ``page`` (its ``text``, else the file's) that lead nowhere: one line each."""
    text = page.read_text() if text is None else text
    problems = []
    for line in prose(text):
        for target in LINK.findall(line):
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            shown = f"{page.relative_to(ROOT)}: ({target})"
            if not where.exists():
                problems.append(f"{shown} leads to no file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text()):
                problems.append(f"{shown}: {where.name} has no heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_missing_file_and_a_missing_heading():
    readme = ROOT / "README.md"
    text = ("[ok](docs/setup.md) [ok](docs/setup.md#the-tests) [ok](#set-up) [web](https://example.org/x.md)\n"
            "[gone](docs/no-such-page.md) [no heading](docs/setup.md#no-such-heading) [here](#nowhere)\n"
            "```\n[in code](docs/also-gone.md)\n```\n")
    assert broken_links(readme, text) == [
        "README.md: (docs/no-such-page.md) leads to no file",
        "README.md: (docs/setup.md#no-such-heading): setup.md has no heading #no-such-heading",
        "README.md: (#nowhere): README.md has no heading #nowhere",
    ]
    assert anchors("# A\n## Your own Gigaword: `sohsm s2s pairs`\n## A\n") == {
        "a", "your-own-gigaword-sohsm-s2s-pairs", "a-1"}
