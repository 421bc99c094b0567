"""The project's files speak of the project alone: no path of the machine a page or a result was written on."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the home and work folders of the machines results are measured on: a page that names one was written there
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home/[\w.-]+)/")


def _tracked() -> list[Path]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the project's files")
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_a_path_of_the_machine_it_was_written_on():
    found = []
    for path in _tracked():
        if path.name == Path(__file__).name or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
                  for m in MACHINE_PATH.finditer(text)]
    assert not found, "machine paths in the project's files:\n" + "\n".join(found[:20])
