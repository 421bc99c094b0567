"""`--threads`: said on the start line, checked before anything is written."""
from __future__ import annotations


def test_the_start_line_says_the_threads_and_a_bad_number_is_refused(tmp_path, ptb_slice, small, cli):
    loud = [option for option in small if option != "--quiet"]
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "a", *loud,
                       "--max-tokens", 160, "--threads", 1)
    assert code == 0 and "| 1 CPU thread (--threads)" in err.splitlines()[0], err
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "full", "--run-dir", tmp_path / "b", *small,
                       "--threads", 0)
    assert code != 0 and "threads" in err and "must be >= 1" in err and not (tmp_path / "b").exists()
