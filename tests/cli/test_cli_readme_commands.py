"""The documented shell commands that need no data set do what their page says they do."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

#: the page of the reverse task's command (it was README's)
HIERARCHIES = Path(__file__).resolve().parents[2] / "docs" / "hierarchies.md"


def test_the_reverse_task_command_learns_the_task(tmp_path, cli, one_thread):
    """The command a user copies shows the task learned: the page's own options, its accuracy line."""
    text = HIERARCHIES.read_text()
    line = re.search(r"^sohsm s2s train --dataset reverse .*$", text.replace("\\\n", ""), flags=re.M)
    assert line, "docs/hierarchies.md lost its reverse-task command"
    argv = shlex.split(line.group(0))[1:]
    argv[argv.index("--run-dir") + 1] = str(tmp_path / "rev")
    code, out, err = cli(*argv, "--quiet")
    assert code == 0, err
    accuracy = float(re.search(r"accuracy\s+([\d.]+)% of 200 held-out strings", out).group(1))
    low, high = map(float, re.search(r"this command reverses ([\d.]+)-([\d.]+)% of its 200",
                                     text.replace("\n", " ")).groups())
    assert low <= accuracy <= high and low >= 90  # the range the page gives (CPUs round differently)
