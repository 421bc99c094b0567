"""The progress bar of a training session: what it shows, and what it leaves in a log."""
from __future__ import annotations

import io
import re

from sohsm.train.progress import _EstimatingBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bar(stream: io.StringIO) -> _EstimatingBar:
    bar = _EstimatingBar(total=1000, file=stream, mininterval=0, desc="train")
    bar.update(100)
    return bar


def test_a_line_beside_the_bar_leaves_no_line_of_spaces_in_a_log():
    log = io.StringIO()
    bar = _bar(log)
    bar.write("a line", file=log)
    bar.update(100)
    bar.close()
    parts = re.split(r"[\r\n]", log.getvalue())
    assert "a line" in parts and not [part for part in parts if part and not part.strip()], parts


def test_on_a_terminal_the_bar_is_overwritten_as_tqdm_does():
    terminal = _Terminal()
    bar = _bar(terminal)
    bar.write("a line", file=terminal)
    bar.close()
    assert re.search(r"\r {10,}\ra line\n", terminal.getvalue())  # cleared in place, no line break of its own


def test_the_early_loss_is_shown_at_a_few_steps_until_the_first_record():
    bar = _bar(io.StringIO())
    assert [k for k in range(1, 40) if bar.wants_early_loss(k)] == [1, 2, 4, 8, 16, 32]
    bar.show_loss(5.0, is_nll=True, record=False)
    assert bar.wants_early_loss(64) and "loss=5.000" in str(bar) and "ppl=148.4" in str(bar)
    bar.show_loss(4.0, is_nll=False)  # a train record's (a sampled objective: no perplexity)
    assert not bar.wants_early_loss(64) and "loss=4.000" in str(bar) and "ppl=-" in str(bar)
    bar.close()
