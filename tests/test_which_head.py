"""README's "Which head to pick" and its long form, docs/results/which-head-table.md, are what
``benchmarks/which_head.py`` writes from the committed runs; the rules it writes them by (level, pick, one seed,
stale) do what its docstring says.

The comparison is the check CI runs: a run added, a page regenerated, or a commit that changes a head's or the
loop's code and so turns a row stale makes it fail until ``python benchmarks/which_head.py`` is run and its output
committed. The mutation tests show it catches a pick and its runner-up swapped, a figure, a sign or a k of n changed
(as tests/test_claims.py's row check does too, without the history; its figure check alone let these pass).
"""
import re
import subprocess
from pathlib import Path

import pytest

from benchmark_scripts import load_script as _script
from test_claims import mutations, readme_section

ROOT = Path(__file__).resolve().parents[1]
which_head = _script("which_head")
Form = which_head.runs.Form


def _texts() -> dict[Path, str]:
    return {path: path.read_text() if path.exists() else "" for path in (which_head.README, which_head.TABLE)}


def _full_history() -> None:
    """Staleness reads the history: a shallow clone or an exported tree cannot write the same pages."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                          text=True, check=False)
    if done.stdout.strip() != "false":
        pytest.skip("a shallow clone or an exported tree: no history to tell a stale run by")


@pytest.fixture(scope="module")
def written() -> dict[Path, str]:
    _full_history()
    return which_head.written(_texts())


def test_readme_and_the_table_page_are_what_the_script_writes(written):
    problems = which_head.differences(_texts())
    assert not problems, "\n".join(problems)


def _section_changed(texts: dict[Path, str], section: str, changed: str) -> dict[Path, str]:
    readme = texts[which_head.README]
    return {**texts, which_head.README: readme.replace(section, changed, 1)}


def test_a_pick_swapped_with_its_runner_up_fails_the_check(written):
    """Each row that names a pick and a runner-up, the two names swapped: the figure checks let this pass."""
    texts = _texts()
    section = readme_section(texts[which_head.README])
    rows = [line for line in section.splitlines() if line.startswith("| [")]
    swapped = 0
    for row in rows:
        cells = row.split(" | ")
        pick, runner_up = re.findall(r"--head (\w+)", cells[1]), re.findall(r"`(\w+?)(?:-tied|-untied)?`:", cells[2])
        if not pick or not runner_up or pick[0] == runner_up[0]:
            continue
        a, b = pick[0], runner_up[0]
        new = row.replace(a, "\0").replace(b, a).replace("\0", b)
        assert which_head.differences(_section_changed(texts, section, section.replace(row, new))), new
        swapped += 1
    assert swapped >= 2, "no row names a pick and a runner-up of another head"


def test_any_changed_figure_sign_or_k_of_n_of_the_section_fails_the_check(written):
    texts = _texts()
    section = readme_section(texts[which_head.README])
    changes = list(mutations(section))
    assert len(changes) >= 30, "the section's figures were not found"
    want = written[which_head.README]
    passed = [what for what, changed in changes
              if _section_changed(texts, section, changed)[which_head.README] == want]
    assert not passed, f"these changes of README's section pass the check: {passed}"


def test_a_row_is_short_enough_to_read():
    """Under 200 characters as shown (a link's target is not shown)."""
    section = readme_section(_texts()[which_head.README])
    for row in (line for line in section.splitlines() if line.startswith("| [")):
        shown = re.sub(r"\]\([^)]*\)", "]", row)
        assert len(shown) < 200, shown


def _form(label: str, figures: dict[int, float]) -> Form:
    return Form(label, label, f"--head {label}", (label,), figures, dict.fromkeys(figures))


def test_a_pick_is_lower_on_every_seed_by_more_than_the_gap_moves():
    top, other = _form("a", {1: 100.0, 2: 110.0, 3: 105.0}), _form("b", {1: 103.0, 2: 113.4, 3: 108.0})
    verdict = which_head.decide([other, top])
    assert verdict.status == "pick" and verdict.named == [top] and verdict.runner_up == other
    # -2.90%: the geometric mean of the three ratios (their arithmetic mean would read -2.91%)
    assert verdict.pair.lower == 3 and verdict.pair.seeds == 3 and round(verdict.pair.gap, 2) == -2.90


def test_seeds_that_disagree_or_a_gap_within_its_spread_are_level():
    top = _form("a", {1: 100.0, 2: 100.0, 3: 100.0})
    disagree = _form("b", {1: 105.0, 2: 105.0, 3: 99.0})
    within = _form("c", {1: 100.2, 2: 101.5, 3: 100.1})   # lower on 3 of 3, gaps -0.20% to -1.48%
    far = _form("d", {1: 110.0, 2: 111.0, 3: 110.5})
    verdict = which_head.decide([far, within, disagree, top])
    assert verdict.status == "level" and [f.label for f in verdict.named] == ["a", "c", "b"]
    assert which_head.level(which_head.pair(top, within)) and not which_head.level(which_head.pair(top, far))


def test_one_seed_names_no_pick_and_fewer_seeds_are_not_ranked():
    one = which_head.decide([_form("a", {1: 100.0}), _form("b", {1: 120.0})])
    assert one.status == "one seed" and one.pair.spread is None
    mixed = which_head.decide([_form("a", {1: 100.0, 2: 100.0}), _form("b", {1: 120.0, 2: 121.0}),
                               _form("c", {1: 90.0})])
    assert [f.label for f in mixed.ranked] == ["a", "b"] and [f.label for f in mixed.fewer] == ["c"]
    assert mixed.status == "pick"


def _commit(repo: Path, file: str, text: str) -> str:
    path = repo / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", file], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_a_run_is_stale_after_a_change_to_its_head_or_the_loop_and_unknown_without_its_commit(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    first = _commit(tmp_path, "src/sohsm/heads/full.py", "1")
    _commit(tmp_path, "src/sohsm/train/loop.py", "1")
    loop = _commit(tmp_path, "src/sohsm/heads/adaptive.py", "1")  # the last change to any head or the loop here
    _commit(tmp_path, "README.md", "words")
    monkeypatch.setattr(which_head, "ROOT", tmp_path)
    which_head.last_change.cache_clear(), which_head.contains.cache_clear()
    try:
        assert which_head.staleness(first[:7], ("full",), which_head.runs.LOOP) == {"loop"}
        assert which_head.staleness(first, ("adaptive",), which_head.runs.LOOP) == {"loop", "adaptive"}
        assert which_head.staleness(loop, ("full", "adaptive"), which_head.runs.LOOP) == set()
        assert which_head.staleness("0123456", ("full",), which_head.runs.LOOP) == {"unknown"}
        assert which_head.staleness(None, ("full",), which_head.runs.LOOP) == {"unknown"}
        assert which_head.state({"loop", "unknown"}) == "stale" and which_head.state({"unknown"}) == "unknown"
    finally:
        which_head.last_change.cache_clear(), which_head.contains.cache_clear()


def test_a_commit_listed_as_reformatting_only_leaves_a_run_current(tmp_path, monkeypatch):
    """``.git-blame-ignore-revs``: a lint or formatting commit after a run does not make it stale; any other does."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    run = _commit(tmp_path, "src/sohsm/heads/full.py", "1")
    lint = _commit(tmp_path, "src/sohsm/heads/full.py", "1  ")
    monkeypatch.setattr(which_head, "ROOT", tmp_path)
    monkeypatch.setattr(which_head, "IGNORED_REVS", tmp_path / ".git-blame-ignore-revs")
    which_head.last_change.cache_clear(), which_head.contains.cache_clear()
    try:
        assert which_head.staleness(run, ("full",), ()) == {"full"}
        which_head.IGNORED_REVS.write_text(f"# formatting\n{lint}\n")
        which_head.last_change.cache_clear()
        assert which_head.staleness(run, ("full",), ()) == set()
        _commit(tmp_path, "src/sohsm/heads/full.py", "2")
        which_head.last_change.cache_clear()
        assert which_head.staleness(run, ("full",), ()) == {"full"}
    finally:
        which_head.last_change.cache_clear(), which_head.contains.cache_clear()
