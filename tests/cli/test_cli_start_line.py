"""What the start line says before a run trains: its threads (`--threads`), the size of its checkpoints, and its
peak memory (within 1.5x of the peak measured)."""
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


def test_the_memory_estimate_is_within_one_and_a_half_times_the_peak(tmp_path, ptb_slice):
    """The process's own maximum resident memory against what its start line says (the model at PTB's sizes, 512,
    so that the weights and activations weigh beside the runtime)."""
    import os
    import re
    import subprocess
    import sys

    command = [sys.executable, "-m", "sohsm", "lm", "train", "--corpus", str(ptb_slice), "--head", "full",
               "--run-dir", str(tmp_path / "run"), "--batch-size", "64", "--max-tokens", "2560", "--threads", "1"]
    with open(tmp_path / "err", "w+") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        err.seek(0)
        text = err.read()
    assert status == 0, text
    said = re.search(r"memory: about (.+?) at its peak", text)
    assert said is not None, text
    ratio = _bytes(said.group(1)) / (usage.ru_maxrss * 1024)
    assert 1 / 1.5 <= ratio <= 1.5, (said.group(0), usage.ru_maxrss)
