"""The parts that keep a run's work safe, one by one: lock, orphans, divergence checks, preflight, flags."""
from __future__ import annotations

import errno
import os
import signal

import pytest
import torch

from sohsm.cli.config_flags import Flag, render_error
from sohsm.fields import FieldError, has, suggest
from sohsm.data.vocab import Vocabulary
from sohsm.tasks.lm import LMConfig as TrainConfig
from sohsm.train import apply_overrides
from sohsm.train.checkpoint import remove_orphans, save_checkpoint, write_atomic
from sohsm.train import guard
from sohsm.train.guard import DivergenceError, StopSignals, check_finite_parameters, check_step, gradient_norm
from sohsm.train.lock import RunLock
from sohsm.data.vocab import vocabulary_difference as _vocabulary_difference
from sohsm.tasks.lm.preflight import check_memory, estimate_bytes, format_bytes


# -- lock --------------------------------------------------------------------------------------------
def test_a_second_lock_on_a_run_directory_is_refused(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(ValueError, match=rf"in use by another trainer \(process {os.getpid()}\)"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):  # released on exit: the next trainer may go
        pass


# -- orphans -----------------------------------------------------------------------------------------
def test_orphan_temporary_files_are_removed_and_nothing_else(tmp_path):
    orphans = [tmp_path / ".last.pt.k2j3.tmp", tmp_path / ".best.pt.x.tmp", tmp_path / ".vocab.json.q1.part"]
    kept = [tmp_path / "last.pt", tmp_path / "notes.tmp", tmp_path / ".other.x.tmp"]
    for path in orphans + kept:
        path.write_bytes(b"x" * 10)
    assert sorted(remove_orphans(tmp_path)) == sorted(orphans)
    assert all(not p.exists() for p in orphans) and all(p.exists() for p in kept)


def test_a_failed_checkpoint_write_names_the_checkpoint_and_leaves_no_temporary(tmp_path, monkeypatch):
    def full_disk(obj, handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path / "last.pt", {"format": "x"})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as info:
        write_atomic(tmp_path / "missing-dir" / "last.pt", lambda handle: None)
    assert info.value.filename.endswith("last.pt")


# -- divergence ----------------------------------------------------------------------------------------
def test_check_step_names_the_step_and_what_is_not_finite():
    check_step(torch.tensor(2.5), torch.tensor(1.0), 3)
    with pytest.raises(DivergenceError, match="diverged at step 7: the loss is nan"):
        check_step(torch.tensor(float("nan")), torch.tensor(1.0), 7)
    with pytest.raises(DivergenceError, match="step 8: the gradient norm is inf"):
        check_step(torch.tensor(1.0), torch.tensor(float("inf")), 8)


def test_gradient_norm_equals_clip_grad_norm_and_finite_parameters_check():
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2, 2))
    (a.sum() * 2 + (b ** 2).sum()).backward()
    expected = torch.nn.utils.clip_grad_norm_([a, b], float("inf"))
    assert torch.allclose(gradient_norm([a, b]), expected)
    module = torch.nn.Linear(2, 2)
    check_finite_parameters([module], 1)
    with torch.no_grad():
        module.bias[0] = float("inf")
    with pytest.raises(DivergenceError, match="step 4: parameter bias"):
        check_finite_parameters([module], 4)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_stop_signals_ask_for_a_stop_and_a_second_one_aborts(signum, monkeypatch):
    monkeypatch.setattr(guard, "silence_terminal", lambda: None)  # keep a `pytest -s` terminal alive
    with StopSignals() as stop:
        signal.raise_signal(signum)
        assert stop.requested and stop.signum == signum
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signum)
    assert signal.getsignal(signum) is not stop._handle  # the previous handlers are back


# -- preflight ---------------------------------------------------------------------------------------------
def test_memory_estimate_counts_parameters_gradients_and_optimizer_state():
    config = apply_overrides(TrainConfig(), {"head.name": "two_level_random", "model.emb_size": 10,
                                             "model.hidden_size": 20, "optim.optimizer": "adam"})
    n = 100
    params = n * 10 + (4 * 20 * (10 + 20) + 8 * 20) + n * 20 + 10 * 20
    assert estimate_bytes(config, n) == (params * 4 * 4, "parameters, gradients and optimizer state")


def test_an_impossible_model_is_refused_before_anything_is_allocated():
    config = apply_overrides(TrainConfig(), {"model.hidden_size": 1_000_000})
    with pytest.raises(ValueError, match=r"does not fit: .* TB, more than .* model.hidden_size=1000000"):
        check_memory(config, 10_000, torch.device("cpu"))
    check_memory(TrainConfig(), 10_000, torch.device("cpu"))  # the paper's model fits
    assert format_bytes(16.4e12) == "16.4 TB" and format_bytes(512) == "512 B"


# -- messages -----------------------------------------------------------------------------------------------
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


def test_vocabularies_of_one_size_are_told_apart_by_a_word_or_a_count():
    a = Vocabulary(["<unk>", "the", "cat"], [0, 5, 2])
    assert "word 2 is 'cat' in the checkpoint and 'dog' now" in _vocabulary_difference(
        a, Vocabulary(["<unk>", "the", "dog"], [0, 5, 2]))
    assert "'the' was seen 5 times then and 6 times now" in _vocabulary_difference(
        a, Vocabulary(["<unk>", "the", "cat"], [0, 6, 2]))
    assert "3 words in the checkpoint, 2 now" in _vocabulary_difference(a, Vocabulary(["<unk>", "the"], [0, 5]))


def test_clip_gradients_scales_row_sparse_gradients_as_their_dense_form():
    """Sparse heads train under clipping: the norm and the clipped values equal torch's on dense copies."""
    from sohsm.train.guard import clip_gradients

    torch.manual_seed(0)
    dense_a, sparse_b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(6, 3))
    ref_a, ref_b = torch.nn.Parameter(dense_a.detach().clone()), torch.nn.Parameter(sparse_b.detach().clone())
    grad_a, grad_b = torch.randn(4, 3), torch.zeros(6, 3)
    grad_b[[1, 4]] = torch.randn(2, 3)
    dense_a.grad, ref_a.grad, ref_b.grad = grad_a.clone(), grad_a.clone(), grad_b.clone()
    sparse_b.grad = grad_b.to_sparse()
    norm = clip_gradients([dense_a, sparse_b], 0.5)
    expected = torch.nn.utils.clip_grad_norm_([ref_a, ref_b], 0.5)
    torch.testing.assert_close(norm, expected)
    torch.testing.assert_close(dense_a.grad, ref_a.grad)
    torch.testing.assert_close(sparse_b.grad.to_dense(), ref_b.grad)
