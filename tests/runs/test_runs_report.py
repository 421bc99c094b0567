"""The results table of `sohsm lm compare` (sohsm.runs.report), on summaries made by hand."""
from __future__ import annotations

import pytest

from sohsm.runs.report import RunSummary, results_table, seconds_text


@pytest.mark.parametrize("seconds, text", [(0.0, "0.00"), (0.42, "0.42"), (7.349, "7.35"), (42.26, "42.3"),
                                           (1254.4, "1,254")])
def test_seconds_keep_the_digits_a_short_run_needs(seconds, text):
    assert seconds_text(seconds) == text


def test_a_short_runs_training_seconds_are_not_rounded_to_zero():
    rows = results_table([RunSummary(run="full", head="full", tokens=2_000, train_s=0.42, tokens_per_s=4762.0)])
    header, row = [[cell.strip() for cell in line.split("|")[1:-1]] for line in (rows[0], rows[2])]
    assert row[header.index("training s")] == "0.42"
