"""``sohsm lm generate`` says what it is doing when it is silent for over 2 s: one line, only then."""
from __future__ import annotations

import time

from sohsm.tasks.lm import run


def test_a_slow_block_says_what_it_is_doing_once(capsys):
    with run._notice_after(0.05, "generate: loading the run", enabled=True):
        time.sleep(0.3)
    assert capsys.readouterr().err == "generate: loading the run\n"


def test_a_quick_or_quiet_block_says_nothing(capsys):
    with run._notice_after(5.0, "generate: loading the run", enabled=True):
        pass
    with run._notice_after(0.0, "generate: loading the run", enabled=False):
        time.sleep(0.1)
    time.sleep(0.1)
    assert capsys.readouterr().err == ""
    assert run.SLOW_START_S == 2.0
