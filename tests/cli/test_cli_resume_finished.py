"""`--resume` on a run whose budgets are spent: one line that says so and which flags ask for more; exit 0."""
from __future__ import annotations

import pytest

from small_run import run_files
from sohsm.tasks.lm import LMConfig
from sohsm.train.rundir import NothingToTrain, check_budget_left


@pytest.fixture
def tiny_corpus(tmp_path, ptb_slice):
    """The first 150 lines of the PTB slice: an epoch of a few steps."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    for name, lines in (("train.txt", 150), ("valid.txt", 40), ("test.txt", 40)):
        text = (ptb_slice / name).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (folder / name).write_text("".join(text), encoding="utf-8")
    return folder


def test_resuming_a_finished_run_says_there_is_nothing_left_and_how_to_ask_for_more(tmp_path, tiny_corpus, small,
                                                                                   cli):
    run_dir = tmp_path / "run"
    code, out, err = cli("lm", "train", "--corpus", tiny_corpus, "--head", "full", "--run-dir", run_dir, *small,
                         "--epochs", 1)
    assert code == 0 and "all epochs done" in out, err
    before = run_files(run_dir)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume")  # not --quiet
    lines = out.splitlines()
    assert code == 0 and len(lines) == 1 and err == "", (out, err)  # no start-up lines, bar or summary
    assert lines[0].startswith(f"nothing left to train in {run_dir}: its one epoch done (step ")
    assert lines[0].endswith("to train on, ask for more: --epochs 2")
    assert run_files(run_dir) == before
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--epochs", 2)
    assert code == 0 and "all epochs done" in out and "epoch 2.00" in out, err


def test_every_spent_budget_is_named_with_a_larger_value(tmp_path, monkeypatch):
    import sohsm.train.rundir as rundir

    (tmp_path / "last.pt").write_bytes(b"")
    monkeypatch.setattr(rundir, "read_progress", lambda path: {"step": 90, "epoch": 2, "tokens": 5000,
                                                               "elapsed_s": 61.0})
    config = LMConfig(epochs=2, max_tokens=5000, time_budget=60.0)
    with pytest.raises(NothingToTrain) as info:
        check_budget_left(tmp_path, config)
    assert str(info.value).endswith("all 2 epochs done and its 5,000 tokens read and its 60 s of training spent "
                                    "(step 90); to train on, ask for more: epochs=3 and max_tokens=10000 and "
                                    "time_budget=120.0")
    check_budget_left(tmp_path, LMConfig(epochs=3, max_tokens=None, time_budget=None))  # some left: no error


def test_the_tokens_read_are_the_runs_own_count_as_its_summary_gave_it(tmp_path, monkeypatch):
    """A run stops after the step that reaches its budget: 30,720 tokens read of 30,000, as its summary said."""
    import sohsm.train.rundir as rundir

    (tmp_path / "last.pt").write_bytes(b"")
    monkeypatch.setattr(rundir, "read_progress", lambda path: {"step": 12, "epoch": 0, "tokens": 30_720,
                                                               "elapsed_s": 9.0})
    with pytest.raises(NothingToTrain) as info:
        check_budget_left(tmp_path, LMConfig(max_tokens=30_000))
    assert ": 30,720 tokens read of a 30,000-token budget (step 12); to train on, ask for more: max_tokens=60000" \
        in str(info.value)
