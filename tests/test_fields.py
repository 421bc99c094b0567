"""Errors that name settings: a field to the library, the flag the user typed to the command line."""
from __future__ import annotations

import pytest

from sohsm.cli.config_flags import Flag, render_error
from sohsm.fields import FieldError, has, suggest

FIELDS = {"hidden_size": "model.hidden_size", "batch_size": "batch_size", "eval_batch_size": "eval_batch_size",
          "text_mode": "data.text_mode", "update_every": "head.update_every", "head": "head.name"}


_FLAGS = [Flag(path, dest, int, False, None, "", {}) for dest, path in FIELDS.items()]


@pytest.mark.parametrize("error, typed, expected", [
    (FieldError.on("model.hidden_size", "must be >= 1, got 0"), ["hidden_size"], "--hidden-size must be >= 1, got 0"),
    (FieldError.on("model.hidden_size", "must be >= 1, got 0"), [], "model.hidden_size must be >= 1, got 0"),
    (FieldError("too few for {} (at most 4 columns)", has("eval_batch_size", 900)), ["eval_batch_size"],
     "too few for --eval-batch-size 900 (at most 4 columns)"),
    (FieldError("too few for {}", has("batch_size", 900)), ["eval_batch_size", "batch_size"],
     "too few for --batch-size 900"),
    (FieldError("a.txt: 1 line(s) is too few; give more text or use {}", suggest("text_mode", "running")), [],
     "a.txt: 1 line(s) is too few; give more text or use --text-mode running"),
    (ValueError("head 'full' does not accept the options ['update_every']"), ["update_every"],
     "head 'full' does not accept the options ['update_every']"),
    (FieldError.on("head.name", "is 'full' in the run, 'x' requested"), ["head"],
     "--head is 'full' in the run, 'x' requested"),
])
def test_errors_name_the_flags_the_user_typed(error, typed, expected):
    assert render_error(error, _FLAGS, {FIELDS[dest] for dest in typed}) == expected


def test_the_library_names_the_fields():
    assert str(FieldError("too few for {}", has("batch_size", 900))) == "too few for batch_size=900"
    assert str(FieldError("use {}", suggest("text_mode", "running"))) == "use text_mode='running'"
    assert str(FieldError.on("optim.lr", "must be positive, got {0}")) == "optim.lr must be positive, got {0}"
