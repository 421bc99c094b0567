"""`sohsm lm train` in the real world: signals, divergence, refused runs, locks, damaged files, odd text."""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sohsm.train.loop as loop
import sohsm.train.step as train_step
from sohsm.cli.main import main
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.train import read_metrics
from sohsm.train.lock import RunLock

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENS_PER_STEP = 16 * 10  # batch 16 x BPTT 10


def _one_line_error(code, err, expected_code=2):
    assert code == expected_code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    return lines[0]


def _train(cli, run_dir, corpus, small, *extra):
    return cli("lm", "train", "--corpus", corpus, "--head", "full", "--run-dir", run_dir, *small, *extra)


# -- signals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_a_checkpoint_and_exit_like_ctrl_c(signum, tmp_path, ptb_slice, small, cli):
    """A real process: the signal arrives mid-training, long before the first checkpoint would."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src"), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "sohsm", "lm", "train", "--corpus", str(ptb_slice), "--head", "self_organized",
            "--run-dir", str(run_dir), *small, "--log-every", "1", "--eval-every", "0", "--checkpoint-every", "0"]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "metrics.jsonl").is_file() or not read_metrics(run_dir / "metrics.jsonl"):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    assert f"interrupted ({name})" in out and "Traceback" not in err
    checkpoint = torch.load(run_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] >= 1 and not (run_dir / "best.pt").exists()
    assert "best.pt" not in out  # the summary lists only the checkpoints that exist
    steps = checkpoint["step"]
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet",
                         "--max-tokens", (steps + 2) * TOKENS_PER_STEP)
    assert code == 0 and f"step {steps + 2}" in out, err


def test_ctrl_c_before_any_evaluation_lists_no_best_checkpoint(tmp_path, ptb_slice, small, cli, monkeypatch):
    note = train_step.DivergenceWatch.note

    def interrupt_at_step_3(self, loss, norm, step):
        if step == 3:
            signal.raise_signal(signal.SIGINT)
        return note(self, loss, norm, step)

    monkeypatch.setattr(train_step.DivergenceWatch, "note", interrupt_at_step_3)
    code, out, err = _train(cli, tmp_path / "run", ptb_slice, small, "--eval-every", 0)
    assert code == 130 and "interrupted (SIGINT): step 3" in out
    assert f"checkpoints {tmp_path / 'run' / 'last.pt'}\n" in out and not (tmp_path / "run" / "best.pt").exists()


def test_a_run_stopped_before_its_first_step_can_be_started_again_or_resumed(tmp_path, ptb_slice, small, cli,
                                                                             monkeypatch):
    def killed(*args, **kwargs):
        raise SystemExit(143)  # what a SIGTERM during start-up leaves: config.json and vocab.json only

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(loop, "run_session", killed)
        assert _train(cli, run_dir, ptb_slice, small)[0] == 143
    assert {p.name for p in run_dir.iterdir()} >= {"config.json", "vocab.json"}
    assert not (run_dir / "last.pt").exists()
    code, out, err = _train(cli, run_dir, ptb_slice, small, "--max-tokens", 3 * TOKENS_PER_STEP)
    assert code == 0, err

    # a run that logged steps but died (kill -9) before its first checkpoint: --resume starts it again
    again = tmp_path / "again"
    assert _train(cli, again, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP, "--log-every", 1)[0] == 0
    (again / "last.pt").unlink()
    (again / "best.pt").unlink()
    code, out, err = cli("lm", "train", "--run-dir", again, "--resume", "--quiet", "--max-tokens",
                         3 * TOKENS_PER_STEP)
    assert code == 0 and "step 3" in out, err
    assert [r["step"] for r in read_metrics(again / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]


# -- divergence --------------------------------------------------------------------------------------------
def test_a_diverging_learning_rate_stops_with_one_line_and_saves_nothing(tmp_path, ptb_slice, small, cli):
    """A finite rate too large for float32 (an infinite one is refused before the run starts)."""
    run_dir = tmp_path / "run"
    line = _one_line_error(*_train(cli, run_dir, ptb_slice, small, "--lr", "1e300", "--checkpoint-every", 1,
                                   "--eval-every", 1)[::2])
    assert "diverged at step 1" in line
    assert not (run_dir / "last.pt").exists() and not (run_dir / "best.pt").exists()


def test_a_run_diverged_before_its_first_checkpoint_says_what_works(tmp_path, ptb_slice, small, cli):
    """No checkpoint to speak of, and no advice that cannot be followed: a resumed run keeps its rate, so the
    lower one it names (a tenth) goes to a new run, in another directory or in this one removed first."""
    run_dir = tmp_path / "run"
    line = _one_line_error(*_train(cli, run_dir, ptb_slice, small, "--lr", "1e300", "--clip", "none",
                                   "--log-every", 1)[::2])
    assert "nothing was saved: it diverged before its first checkpoint (due at step 1,000)" in line, line
    assert "left as they were" not in line
    assert ("train a new run with a lower learning rate (--lr 1e+299, a tenth of this run's) or gradient clipping "
            "(--clip 0.25) in another run directory (or in this one, removed first)") in line
    line = _one_line_error(*_train(cli, run_dir, ptb_slice, small, "--lr", "0.1")[::2])  # its records are there
    assert "holds the records of a run stopped before its first checkpoint" in line and "remove it" in line
    assert "--lr is 1e+300 in the run" in _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume",
                                                               "--lr", "0.1")[::2])  # why a new run is the way
    shutil.rmtree(run_dir)  # what it says, followed: the directory trains again
    assert _train(cli, run_dir, ptb_slice, small, "--lr", "0.1", "--max-tokens", TOKENS_PER_STEP)[0] == 0


@pytest.mark.parametrize("fused, log_every", [(True, 1), (True, 1000), (False, 1000)])
def test_divergence_keeps_the_last_good_checkpoints(tmp_path, ptb_slice, small, cli, monkeypatch, fused, log_every):
    """The flag is read at the next log line, evaluation or checkpoint (every step with --log-every 1; at step 10
    otherwise); the bad steps in between change nothing (the fused step skips on the device, the default one
    gets zero gradients) and the error names the first bad step."""
    run_dir = tmp_path / "run"
    options = ["--eval-every", 5, "--checkpoint-every", 5, "--log-every", log_every,
               "--fused" if fused else "--no-fused"]
    code, _, err = cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir", run_dir,
                       *small, *options, "--max-tokens", 5 * TOKENS_PER_STEP)
    assert code == 0, err
    before = {name: (run_dir / name).read_bytes() for name in ("last.pt", "best.pt")}
    forward = LSTMLanguageModel.forward

    def nan_from_step_7(self, *args, **kwargs):
        hidden, state = forward(self, *args, **kwargs)
        nan_from_step_7.calls += 1
        return (hidden * float("nan") if nan_from_step_7.calls >= 2 and self.training else hidden), state

    nan_from_step_7.calls = 0
    monkeypatch.setattr(LSTMLanguageModel, "forward", nan_from_step_7)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet",
                         "--max-tokens", 20 * TOKENS_PER_STEP)
    line = _one_line_error(code, err)
    assert "diverged at step 7: the loss is nan; last.pt and best.pt (step 5) were left as they were" in line
    assert "train a new run with a lower learning rate (--lr 0.01, a tenth of this run's) in another run" in line
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    monkeypatch.undo()
    assert cli("lm", "eval", run_dir)[0] == 0  # the good model still evaluates


# -- refused runs leave nothing behind -----------------------------------------------------------------------
@pytest.mark.parametrize("options, words", [
    (["--batch-size", 100_000], "--batch-size 100000"),
    (["--eval-batch-size", 5000], "--eval-batch-size 5000"),
    (["--hidden-size", 1_000_000], "--hidden-size 1000000"),
    (["--device", "meta"], "--device 'meta'"),
    (["--lr", "inf"], "--lr must be a finite number, got inf"),
])
def test_settings_that_cannot_train_are_refused_before_the_run_directory_exists(options, words, tmp_path,
                                                                                ptb_slice, small, cli):
    line = _one_line_error(*_train(cli, tmp_path / "run", ptb_slice, small, *options)[::2])
    assert words in line
    assert not (tmp_path / "run").exists()


def test_a_backend_the_device_cannot_run_is_refused_before_the_run_directory_exists(tmp_path, ptb_slice, small,
                                                                                    cli, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' interpreter would run Triton on the CPU
    line = _one_line_error(*cli("lm", "train", "--corpus", ptb_slice, "--head", "self_organized", "--run-dir",
                                tmp_path / "run", *small, "--head-option", "backend=triton")[::2])
    assert "backend='triton' runs on CUDA devices, not on cpu" in line
    assert not (tmp_path / "run").exists()


def test_a_whitespace_only_text_is_refused_before_the_run_directory_exists(tmp_path, small, cli):
    text = tmp_path / "blank.txt"
    text.write_text("   \n\t\n \n" * 50)
    line = _one_line_error(*_train(cli, tmp_path / "run", text, small)[::2])
    assert "no words" in line and not (tmp_path / "run").exists()


# -- one trainer per run directory ------------------------------------------------------------------------------
def test_a_second_trainer_on_a_locked_run_is_refused(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    assert _train(cli, run_dir, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    with RunLock(run_dir):  # as a first trainer would hold it
        line = _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 10_000)[::2])
    assert "in use by another trainer" in line and str(os.getpid()) in line
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


def test_a_run_another_trainer_writes_before_its_first_checkpoint_is_in_use(tmp_path, ptb_slice, small, cli):
    """best.pt and records, no last.pt yet: the run is live, not damaged; nothing to copy, nothing touched."""
    run_dir = tmp_path / "run"
    code, _, err = _train(cli, run_dir, ptb_slice, small, "--max-tokens", 4 * TOKENS_PER_STEP, "--eval-every", 2,
                          "--checkpoint-every", 2)
    assert code == 0, err
    (run_dir / "last.pt").unlink()  # as it stands before its first checkpoint
    kept = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    with RunLock(run_dir):  # its trainer holds the lock
        line = _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume", "--max-tokens", 10_000)[::2])
        assert "in use by another trainer" in line and "last.pt" not in line, line
        assert {path.name: path.read_bytes() for path in run_dir.iterdir() if path.name != ".lock"} == kept


def test_orphan_temporary_files_are_cleaned_at_the_next_start(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    assert _train(cli, run_dir, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    orphan = run_dir / ".last.pt.x8y7z6.tmp"  # what kill -9 during a checkpoint write leaves
    orphan.write_bytes(b"\0" * 1000)
    assert cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens", 3 * TOKENS_PER_STEP)[0] == 0
    assert not orphan.exists()


def test_relative_data_and_cache_directories_are_stored_absolute(tmp_path, ptb_slice, small, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _train(cli, "run", ptb_slice, small, "--max-tokens", TOKENS_PER_STEP, "--data-dir", "data",
                          "--cache-dir", "cache")
    assert code == 0, err
    data = json.loads((tmp_path / "run" / "config.json").read_text())["data"]
    assert data["data_dir"] == str(tmp_path / "data") and data["cache_dir"] == str(tmp_path / "cache")


# -- errors a user can act on ----------------------------------------------------------------------------------------
def test_a_full_disk_during_a_checkpoint_is_one_line(tmp_path, ptb_slice, small, cli, monkeypatch):
    def full_disk(obj, handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    code, _, err = _train(cli, tmp_path / "run", ptb_slice, small, "--max-tokens", TOKENS_PER_STEP)
    line = _one_line_error(code, err, expected_code=1)
    assert line.endswith(f"{tmp_path / 'run'}/best.pt: No space left on device")
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


@pytest.fixture()
def short_run(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    assert _train(cli, run_dir, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    return run_dir


@pytest.mark.parametrize("damage", ["drop the model", "wrong shape", "config", "nan weights"])
def test_a_hand_edited_checkpoint_is_one_line(damage, short_run, cli):
    path = short_run / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    if damage == "drop the model":
        del checkpoint["model"]
    elif damage == "wrong shape":
        checkpoint["model"]["embedding.weight"] = torch.zeros(3, 3)
    elif damage == "config":
        checkpoint["config"]["model"]["hidden_size"] = "big"
    else:  # what a diverged run saved before runs stopped on divergence
        checkpoint["model"]["embedding.weight"].fill_(float("nan"))
    torch.save(checkpoint, path)
    line = _one_line_error(*cli("lm", "eval", short_run, "--checkpoint", "last")[::2])
    assert str(path) in line
    line = _one_line_error(*cli("lm", "generate", short_run, "--checkpoint", "last", "--prompt", "the")[::2])
    assert str(path) in line
    if damage != "config":  # a resume reads the run's config.json, not the checkpoint's copy
        line = _one_line_error(*cli("lm", "train", "--run-dir", short_run, "--resume", "--quiet",
                                    "--max-tokens", 10_000)[::2])
        assert str(path) in line


class _ClosedPipe(io.StringIO):
    """Standard output whose reader has gone (`| head`): every write fails."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_broken_pipe_stops_training_with_a_checkpoint(tmp_path, ptb_slice, small, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    run_dir = tmp_path / "run"
    options = [o for o in small if o != "--quiet"]  # evaluation lines go to standard output
    code = main(["lm", "train", "--corpus", str(ptb_slice), "--head", "full", "--run-dir", str(run_dir),
                 *map(str, options), "--eval-every", "2", "--max-tokens", str(50 * TOKENS_PER_STEP)])
    assert code == 141
    assert torch.load(run_dir / "last.pt", weights_only=True)["step"] == 2  # stopped at the first line written


def test_a_plot_that_cannot_be_written_is_one_line(short_run, tmp_path, cli):
    (tmp_path / "a-file").write_text("x")
    line = _one_line_error(*cli("plot", short_run, "-o", tmp_path / "a-file" / "figure.png")[::2])
    assert "cannot write the figure" in line


# -- your own text ----------------------------------------------------------------------------------------------------
def test_text_mode_flag_and_the_suggestion_that_names_it(tmp_path, small, cli, ptb_slice):
    one_line = tmp_path / "one.txt"
    one_line.write_text("a b c d e f g h " * 200 + "\n")
    line = _one_line_error(*_train(cli, tmp_path / "run", one_line, small)[::2])
    assert "--text-mode running" in line and not (tmp_path / "run").exists()
    code, _, err = _train(cli, tmp_path / "run", one_line, [*small[:4], "--batch-size", "4", "--bptt", "5",
                                                            "--quiet"], "--text-mode", "running",
                          "--max-tokens", 40, "--eval-batch-size", 4)
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["text_mode"] == "running"
    assert "<eos>" not in json.loads((tmp_path / "run" / "vocab.json").read_text())["itos"]


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path, small, cli):
    text = tmp_path / "bom.txt"
    text.write_bytes(b"\xef\xbb\xbfhello world\n" + b"hello there world\n" * 300)
    code, _, err = _train(cli, tmp_path / "run", text, small, "--max-tokens", TOKENS_PER_STEP)
    assert code == 0, err
    words = json.loads((tmp_path / "run" / "vocab.json").read_text())["itos"]
    assert "hello" in words and not any(w.startswith("\ufeff") for w in words)


def test_resume_without_last_pt_refuses_rather_than_overwriting_the_run(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    code, _, err = _train(cli, run_dir, ptb_slice, small, "--max-tokens", 4 * TOKENS_PER_STEP, "--eval-every", 2,
                          "--checkpoint-every", 2, "--log-every", 1)
    assert code == 0, err
    (run_dir / "last.pt").unlink()
    kept = {name: (run_dir / name).read_bytes() for name in ("best.pt", "metrics.jsonl")}
    resume = ("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens", 6 * TOKENS_PER_STEP)
    line = _one_line_error(*cli(*resume)[::2])
    assert "holds best.pt but no last.pt: resuming would start again from step 0" in line
    assert f"copy it to {run_dir / 'last.pt'} and resume" in line
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept and not (run_dir / "last.pt").exists()

    (run_dir / "best.pt").unlink()  # records of steps past the first checkpoint say the same
    line = _one_line_error(*cli(*resume)[::2])
    assert "records up to step 4 in metrics.jsonl but no last.pt (checkpoints every 2 steps)" in line
    assert (run_dir / "metrics.jsonl").read_bytes() == kept["metrics.jsonl"]

    (run_dir / "last.pt").write_bytes(kept["best.pt"])  # what the message advises: continue from best.pt
    code, out, err = cli(*resume)
    assert code == 0 and "step 6" in out, err
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"] == list(range(1, 7))


def test_a_truncated_last_pt_says_best_pt_is_intact_and_how_to_continue_from_it(tmp_path, ptb_slice, small, cli):
    run_dir = tmp_path / "run"
    code, _, err = _train(cli, run_dir, ptb_slice, small, "--max-tokens", 4 * TOKENS_PER_STEP, "--eval-every", 2)
    assert code == 0, err
    data = (run_dir / "last.pt").read_bytes()
    (run_dir / "last.pt").write_bytes(data[: len(data) // 3])  # a copy cut short, a full disk
    resume = ("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens", 6 * TOKENS_PER_STEP)
    line = _one_line_error(*cli(*resume)[::2])
    assert "last.pt: not a readable checkpoint (the file is cut short or damaged: PytorchStreamReader" in line
    assert f"best.pt beside it is intact (step 4): to continue from best.pt, copy it to {run_dir / 'last.pt'}" in line
    assert "..." not in line
    line = _one_line_error(*cli("lm", "eval", run_dir, "--checkpoint", "last")[::2])
    assert line.endswith("; best.pt beside it is intact (step 4)")
    (run_dir / "last.pt").write_bytes((run_dir / "best.pt").read_bytes())  # as it says
    resume = (*resume, "--log-every", 1)
    with pytest.warns(UserWarning, match="holds no optimizer state .best.pt keeps none.: the optimizer starts afresh"
                                         ".* the rate warms up again over 30 steps"):
        code, out, err = cli(*resume)
    assert code == 0 and "step 6" in out, err
    # the fresh optimizer warms up again from step 4 over the run's warm-up (an LSTM's 30 steps), on top of the
    # first warm-up still under way: step s's rate is lr (s / 30) ((s - 4) / 30)
    rates = {r["step"]: r["lr"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}
    assert rates[5] / rates[4] == pytest.approx(5 / 4 / 30) and rates[6] / rates[5] == pytest.approx(6 * 2 / 5), rates


def test_a_warning_of_the_command_is_one_line(tmp_path, ptb_slice, small):
    """Python shows a warning as two lines (its source line under it); the command says it in one."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sohsm", "lm", "train", "--corpus", str(ptb_slice), "--run-dir", str(run_dir),
            "--head", "full", *small, "--max-tokens", str(4 * TOKENS_PER_STEP), "--eval-every", "2"]
    assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
    (run_dir / "last.pt").write_bytes((run_dir / "best.pt").read_bytes())
    done = subprocess.run([*argv[:3], "lm", "train", "--run-dir", str(run_dir), "--resume", "--quiet",
                           "--max-tokens", str(6 * TOKENS_PER_STEP)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "optimizer" in line or "warnings.warn" in line]
    assert len(lines) == 1 and lines[0].startswith("sohsm: warning: "), done.stderr


def test_best_pt_keeps_what_evaluation_needs_and_last_pt_what_a_resume_needs(tmp_path, ptb_slice, small, cli):
    """Adam's (or Adagrad's) state is for resuming, which reads last.pt: best.pt holds none (an s2s run's Adam
    moments were two thirds of each checkpoint)."""
    run_dir = tmp_path / "run"
    code, _, err = _train(cli, run_dir, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP, "--optimizer", "adam")
    assert code == 0, err
    last, best = (torch.load(run_dir / name, weights_only=True) for name in ("last.pt", "best.pt"))
    assert set(last) - set(best) == {"optimizer"} and last["optimizer"]["state"]
    assert (run_dir / "best.pt").stat().st_size < (run_dir / "last.pt").stat().st_size / 2
    for command in (("lm", "eval", run_dir), ("lm", "generate", run_dir, "--prompt", "the", "--length", 3)):
        assert cli(*command)[0] == 0


def test_ctrl_c_during_a_dev_evaluation_abandons_it_and_keeps_the_last_step(tmp_path, ptb_slice, small, cli,
                                                                             monkeypatch):
    import sohsm.train.session as session

    evaluate, asked = session.evaluate, []

    def evaluate_then_ctrl_c(*args, should_stop=None, **kwargs):
        assert should_stop is not None  # one process: a stop signal can end the evaluation

        def stop() -> bool:
            asked.append(1)
            if len(asked) == 2:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C while the second dev batch is up
            return should_stop()

        return evaluate(*args, should_stop=stop, **kwargs)

    monkeypatch.setattr(session, "evaluate", evaluate_then_ctrl_c)
    run_dir = tmp_path / "run"
    code, out, err = _train(cli, run_dir, ptb_slice, small, "--eval-every", 2, "--log-every", 1)
    assert code == 130 and "interrupted (SIGINT): step 2" in out, err
    assert len(asked) == 2  # the evaluation stopped at once, not after the whole dev set
    assert torch.load(run_dir / "last.pt", weights_only=True)["step"] == 2 and not (run_dir / "best.pt").exists()
    assert not [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    monkeypatch.setattr(session, "evaluate", evaluate)
    code, out, err = cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens",
                         3 * TOKENS_PER_STEP)
    assert code == 0 and "step 3" in out, err


def test_messages_name_the_problem_and_nothing_else(tmp_path, ptb_slice, small, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(*_train(cli, "", ptb_slice, small)[::2])
    assert "the run directory must be named, got ''" in line and list(tmp_path.iterdir()) == []

    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    assert "is a file, not a run directory" in _one_line_error(*cli("lm", "eval", a_file)[::2])

    run_dir = tmp_path / "run"
    assert _train(cli, run_dir, ptb_slice, small, "--max-tokens", 2 * TOKENS_PER_STEP)[0] == 0
    torch.save({"format": "sohsm.lm-checkpoint/1", "f": os.path.join}, run_dir / "best.pt")  # a pickled object
    line = _one_line_error(*cli("lm", "eval", run_dir)[::2])
    assert "holds Python objects (posixpath.join) besides tensors" in line and "weights_only" not in line

    (run_dir / "metrics.jsonl").write_bytes(b'{"kind": "train", "step": 1}\n\xff\xfe broken\n')
    line = _one_line_error(*cli("lm", "train", "--run-dir", run_dir, "--resume", "--quiet", "--max-tokens",
                                3 * TOKENS_PER_STEP)[::2])
    assert f"{run_dir / 'metrics.jsonl'}: not a metrics log (not UTF-8 text" in line
