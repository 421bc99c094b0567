"""The progress bar of a training session: what it shows, and what it leaves in a log."""
from __future__ import annotations

import io
import re

import pytest

import sohsm.train.progress as progress
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


def test_the_early_loss_is_shown_at_a_few_steps_until_the_first_record_then_every_few_seconds(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    bar = _bar(io.StringIO())
    assert [k for k in range(1, 40) if bar.wants_loss(k)] == [1, 2, 4, 8, 16, 32]
    bar.show_loss(5.0, is_nll=True, record=False)
    assert bar.wants_loss(64) and "loss=5.000" in str(bar) and "ppl=148.4" in str(bar)
    bar.show_loss(4.0, is_nll=False)  # a train record's (a sampled objective: no perplexity)
    assert not bar.wants_loss(64) and "loss=4.000" in str(bar) and "ppl=-" in str(bar)
    now[0] += progress.LOSS_REFRESH_S / 2
    assert not any(bar.wants_loss(k) for k in range(65, 200))
    now[0] += progress.LOSS_REFRESH_S / 2  # between records, the loss moves every few seconds, not every record
    assert bar.wants_loss(201)
    bar.close()


def test_with_a_time_budget_the_bar_ends_where_the_budget_does():
    """A 60 s budget of a run planned for hours: the total is what 60 s reach, so the bar is not at 1%."""
    training = [0.0]
    bar = _EstimatingBar(total=10_000_000, file=io.StringIO(), mininterval=0, time_left=60.0,
                         clock=lambda: training[0])
    for _ in range(30):  # 1,000 tokens a second of training
        training[0] += 1.0
        bar.update(1000)
    assert bar.total == pytest.approx(30_000 + 30 * 1000, rel=0.01)
    assert 45 <= 100 * bar.n / bar.total <= 55
    bar.close()


def test_the_estimate_names_what_the_task_counts(capsys):
    """A word2vec run counts rows: its estimate says rows/s, as its summary does, not tok/s."""
    log = io.StringIO()
    bar = _EstimatingBar(total=100_000, file=log, mininterval=0, units=("rows", "rows"))
    for _ in range(progress.WARMUP_STEPS + progress.TIMED_STEPS):
        bar.update(100)
    bar.close()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("≈")]
    assert "for 100,000 rows at " in line and " rows/s" in line and "tok" not in line


def test_the_closing_line_gives_the_speed_of_training_time_alone():
    """Evaluations and checkpoints between steps (the clock paused) are not in the closing line's speed, which is
    the summary's: 2,000 tokens in 4 s of training, whatever the wall clock spent besides."""
    training, log = [10.0], io.StringIO()
    bar = _EstimatingBar(total=4000, initial=1000, file=log, mininterval=0, desc="train", unit="tok",
                         clock=lambda: training[0])
    bar.update(1000)
    training[0] += 2.0
    bar.update(1000)
    training[0] += 2.0
    bar.close()
    closing = re.split(r"[\r\n]", log.getvalue().strip())[-1]
    assert "[00:04<00:02, 500.00tok/s]" in closing, closing


def test_the_estimate_is_a_rate_of_training_time_without_the_steps_that_compiled(capsys):
    """The estimate's speed is the summary's: tokens over the training clock, a step that compiled left out of
    both (here the 5th: 40 s of wall time the clock never counted); 1,000 tokens a second of training."""
    training = [0.0]
    bar = _EstimatingBar(total=1_000_000, file=io.StringIO(), mininterval=0, clock=lambda: training[0])
    for step in range(1, progress.WARMUP_STEPS + progress.TIMED_STEPS + 1):
        if step == 5:
            bar.leave_out(1000)  # compiled: its seconds are not on the clock, its tokens not in the speed
        else:
            training[0] += 1.0
        bar.update(1000)
    bar.close()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("≈")]
    assert " at 1,000 tok/s (training time, compiling not counted; " in line, line
