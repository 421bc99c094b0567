"""Every release in CHANGELOG.md names the commit a user checks out (tags do not reach every clone)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## (v\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d), commit ([0-9a-f]{7,40})\)$")


def releases() -> list[tuple[str, str, str]]:
    """(version, date, commit) of each ``## v...`` heading; a release heading that does not name them fails."""
    found = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            match = HEADING.match(line)
            assert match, f"CHANGELOG.md: {line!r} is not '## vX.Y.Z (YYYY-MM-DD, commit abc1234)'"
            found.append(match.groups())
    return found


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def test_every_release_heading_names_its_date_and_commit():
    found = releases()
    assert found, "CHANGELOG.md has no release heading"
    assert len({version for version, _, _ in found}) == len(found), "a version is listed twice"


def test_each_named_commit_is_in_the_history_and_sets_its_version():
    """Where the checkout has the history (a full clone), each commit exists, and the version file there says the
    release's version (v0.1.0 and v0.2.0 were tagged afterwards: both report 0.1.0)."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("a shallow clone or an exported tree holds no history to look in (the headings' form is checked)")
    for version, _, commit in releases():
        assert _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, f"{version}: no commit {commit}"
        text = _git("show", f"{commit}:src/sohsm/version.py").stdout
        said = re.search(r'__version__ = "([^"]+)"', text).group(1)
        assert said == version[1:] or version in ("v0.1.0", "v0.2.0") and said == "0.1.0", (version, commit, said)
