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


def test_the_plan_says_the_size_of_the_checkpoints_it_will_write(tmp_path, ptb_slice, small, cli):
    """Said before the first is written, within 10% of what is written."""
    import re

    loud = [option for option in small if option != "--quiet"]
    run_dir = tmp_path / "run"
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir, *loud,
                       "--max-tokens", 320, "--eval-every", 1)
    assert code == 0, err
    said = re.search(r"checkpoints of about (.+?) \(last\.pt\) and (.+?) \(best\.pt\)", err)
    assert said is not None, err
    for name, text in zip(("last.pt", "best.pt"), said.groups()):
        written = (run_dir / name).stat().st_size
        assert abs(_bytes(text) - written) <= 0.1 * written, (name, text, written)


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20,
                            "GiB": 2**30}[unit]
