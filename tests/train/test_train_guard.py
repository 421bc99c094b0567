"""The parts that keep a run's work safe, one by one: lock, orphans, divergence checks, stop signals, clipping."""
from __future__ import annotations

import errno
import os
import signal

import pytest
import torch

import sohsm.train.lock as lock_module
from sohsm.train import guard
from sohsm.train.checkpoint import remove_orphans, save_checkpoint, write_atomic
from sohsm.train.guard import DivergenceError, StopSignals, check_finite_parameters, check_step, gradient_norm
from sohsm.train.lock import RunLock


# -- lock --------------------------------------------------------------------------------------------
def test_a_second_lock_on_a_run_directory_is_refused(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(ValueError, match=rf"in use by another trainer \(process {os.getpid()}\)"):
            RunLock(tmp_path).acquire()
    with RunLock(tmp_path):  # released on exit: the next trainer may go
        pass


def test_the_lock_file_goes_with_the_lock(tmp_path):
    """A finished run directory holds no .lock."""
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").is_file()
    assert not (tmp_path / ".lock").exists()


def test_a_lock_file_removed_as_it_was_opened_is_not_locked(tmp_path, monkeypatch):
    """A trainer that opened .lock just before its holder removed it takes the lock on the file there now (held by
    a third trainer: refused), not on the removed one, so two trainers never hold two files."""
    first = RunLock(tmp_path)
    first.acquire()
    stale = os.open(tmp_path / ".lock", os.O_RDWR)  # opened before the holder let go
    first.release()
    third = RunLock(tmp_path)
    third.acquire()  # a new .lock
    opened, real_open = [], os.open
    monkeypatch.setattr(lock_module.os, "open",
                        lambda path, *args: opened.append(path)
                        or (stale if len(opened) == 1 else real_open(path, *args)))
    with pytest.raises(ValueError, match="in use by another trainer"):
        RunLock(tmp_path).acquire()
    assert len(opened) == 2
    monkeypatch.undo()
    third.release()


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


def test_the_divergence_watch_keeps_the_first_bad_step_on_the_device():
    from sohsm.train.guard import DivergenceWatch

    watch = DivergenceWatch(torch.device("cpu"))
    assert not bool(watch.note(torch.tensor(2.0), torch.tensor(1.0), 1))
    watch.raise_if_diverged()  # nothing yet
    assert bool(watch.note(torch.tensor(1.0), torch.tensor(float("inf")), 4))
    watch.note(torch.tensor(float("nan")), torch.tensor(1.0), 5)  # a later bad step does not replace the first
    with pytest.raises(DivergenceError, match="diverged at step 4: the gradient norm is inf"):
        watch.raise_if_diverged()


@pytest.mark.parametrize("optimizer, fused", [("Adagrad", True), ("Adagrad", False), ("Adam", True)])
def test_a_bad_step_changes_no_weight(optimizer, fused):
    """What TrainStep does with the device flag: the fused step takes it as found_inf, another gets zero gradients."""
    from sohsm.train.step import TrainStep

    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = getattr(torch.optim, optimizer)([param], lr=0.1, fused=fused)
    step = TrainStep.__new__(TrainStep)
    step.optimizer, step.params, step.fused = opt, [param], fused
    param.grad = torch.tensor([0.5, 0.5, 0.5])
    opt.step()  # a good step: the state exists and the weights moved
    state = {k: v.clone() for k, v in opt.state[param].items()}
    before = param.detach().clone()
    param.grad = torch.tensor([float("nan"), 1.0, 1.0])
    step._skip_if(torch.tensor(True))
    opt.step()
    vars(opt).pop("found_inf", None)
    assert torch.equal(param.detach(), before)
    for key, value in opt.state[param].items():
        if key != "step" or fused:  # the default step counts a step it took with zero gradients
            assert torch.equal(value, state[key]), key
    param.grad = torch.tensor([0.5, 0.5, 0.5])
    step._skip_if(torch.tensor(False))  # a good step after it moves the weights again
    opt.step()
    assert not torch.equal(param.detach(), before)


def test_a_bad_step_changes_no_row_of_a_sparse_gradient():
    """Word vectors' embeddings hand out row-sparse gradients: their stored values are zeroed instead."""
    from sohsm.train.step import TrainStep

    embedding = torch.nn.Embedding(6, 3, sparse=True)
    opt = torch.optim.Adagrad(embedding.parameters(), lr=0.1)
    step = TrainStep.__new__(TrainStep)
    step.optimizer, step.params, step.fused = opt, [embedding.weight], False
    before = embedding.weight.detach().clone()
    (embedding(torch.tensor([1, 4])).sum() * float("nan")).backward()
    step._skip_if(torch.tensor(True))
    opt.step()
    assert torch.equal(embedding.weight.detach(), before)


@pytest.mark.parametrize("optimizer", ["Adagrad", "AdamW", "SGD"])
def test_clipping_inside_a_fused_step_equals_clipping_the_gradients(optimizer):
    """TrainStep hands a fused step ``grad_scale = max(1, (norm + 1e-6) / clip)`` instead of scaling the gradients
    by ``clip_grad_norm_``: the same update (float64 weights; the kernels take the factor in float32)."""
    from sohsm.train.guard import clip_scale, gradient_norm

    g = torch.Generator().manual_seed(7)
    ours = [torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64, generator=g)) for _ in range(2)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
    fused = getattr(torch.optim, optimizer)(ours, lr=0.1, fused=True, **kwargs)
    plain = getattr(torch.optim, optimizer)(theirs, lr=0.1, **kwargs)
    for _ in range(3):
        for a, b in zip(ours, theirs):
            b.grad = torch.randn(b.shape, dtype=torch.float64, generator=g) * 5
            a.grad = b.grad.clone()
        torch.nn.utils.clip_grad_norm_(theirs, 0.25)
        fused.grad_scale = clip_scale(gradient_norm(ours), 0.25)
        fused.step()
        plain.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
