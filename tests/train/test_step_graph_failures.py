"""The captured training step's failure paths on the CPU, under torch 2.13's behaviour as ``tests/graph_emulator.py``
keeps it: a capture that fails with a CUDA error (a host read) or a Python-level error, and what each leaves in the
allocator; a replay wrong in its output or only in what later steps read; a layout replaced behind the graph's back;
cuDNN's dropout re-seed of a multi-layer LSTM; a freeze of the self-organized head's clusters."""
from __future__ import annotations

import pytest
import torch

import graph_emulator
from sohsm.train import step_graph as step_graph_module
from step_graph_runs import _assert_same_weights, _static_eager, _train, _weights, corpus, emulated, native_lstm  # noqa: F401


def test_a_capture_that_fails_falls_back_to_eager_steps_with_one_warning(tmp_path, corpus, emulated, monkeypatch):
    """A step that reads a value back (here the full softmax's, made to) cannot be captured: one warning naming why,
    then the run goes on eagerly and trains as it would have."""
    from sohsm.heads.full import FullSoftmax

    forward = FullSoftmax.forward

    def reads_back(self, hidden, target):
        out = forward(self, hidden, target)
        float(out.loss)  # a host read: refused while capturing
        return out

    monkeypatch.setattr(FullSoftmax, "forward", reads_back)
    with pytest.warns(RuntimeWarning, match=r"could not be captured as a CUDA graph \(CaptureError: operation not "
                                            r"permitted when stream is capturing"):
        losses, _ = _train(tmp_path / "run", corpus, "full", "--max-tokens", str(20 * 24))
    (graph,) = emulated
    assert graph.failed and graph.captures == 0 and graph.replays == 0
    eager, _ = _static_eager(tmp_path / "eager", corpus, "full", "--max-tokens", str(20 * 24))
    assert losses == eager


@pytest.mark.parametrize("skipped", ["_fused_adagrad_", "_log_softmax"])
def test_a_wrong_replay_is_caught_by_its_check_and_the_run_trains_eagerly(tmp_path, corpus, monkeypatch, emulated,
                                                                          skipped):
    """A replay made wrong on purpose (it leaves out the optimizer's update, or one op of the forward, whose output
    then keeps its value of the capture: a stale op) differs from the eager step it is checked against at the capture:
    one warning with the measured difference, the graph given up, and the run ends with exactly the weights and losses
    of a run that never captured (``--step-graph off``)."""
    monkeypatch.setattr(step_graph_module, "GRAPH_API",
                        lambda device: graph_emulator.EmulatedGraphs(device, skip=lambda func: skipped in str(func)))
    extra = ["--max-tokens", str(20 * 24)]
    with pytest.warns(RuntimeWarning, match=r"the captured training step's replay differs from the eager step by "
                                            r"([0-9.e+-]+|inf) \(relative; at most 0.0001 expected\); the run goes on "
                                            r"with eager steps") as warned:
        losses, _ = _train(tmp_path / "graph", corpus, "full", *extra)
    assert len([w for w in warned if "CUDA graph" in str(w.message) or "replay" in str(w.message)]) == 1
    (graph,) = emulated
    assert graph.failed and graph.captures == 1 and graph.replays == 0 and graph.checks == 1
    assert graph.difference > 1e-2  # far past the tolerance: the check measures, it does not merely flag
    assert not graph.train_step.static  # the static form undone
    off, _ = _train(tmp_path / "off", corpus, "full", *extra, "--step-graph", "off")
    assert losses == off
    _assert_same_weights(_weights(tmp_path / "graph"), _weights(tmp_path / "off"))


def test_a_replay_wrong_only_in_what_later_steps_read_is_caught(tmp_path, corpus, monkeypatch, emulated):
    """A replay that leaves out the write of the waiting batch into the ring (the loss, the gradient norm and the
    weights all right: only a later fold would show it) differs from its eager step in the ring, which the check
    compares too: caught at the capture, the run eager from there on."""
    monkeypatch.setattr(step_graph_module, "GRAPH_API",
                        lambda device: graph_emulator.EmulatedGraphs(device, skip=lambda f: "index_copy" in str(f)))
    extra = ["--max-tokens", str(12 * 24), "--update-every", "100"]
    with pytest.warns(RuntimeWarning, match=r"the captured training step's replay differs from the eager step by inf"):
        _train(tmp_path / "graph", corpus, "self_organized-banded", *extra)
    (graph,) = emulated
    assert graph.failed and graph.captures == 1 and graph.checks == 1 and graph.replays == 0


def test_a_capture_that_fails_half_way_leaves_a_clean_eager_run(tmp_path, corpus, monkeypatch, emulated):
    """A head that reads a value back only while capturing (a CUDA error: the capture is invalidated), dropout 0.2, 30
    steps: torch's capture then ends by raising an error of its own before the allocator leaves the capture's pool,
    and leaves the capture's stream current (the emulator models both; an eager step raises on that stream). The run
    finishes, its one warning names the first cause (the read, not the capture's end), the stream is put back, the
    pool ended and released by hand (nothing left capturing: ``empty_cache`` frees it), the static form is undone,
    and the run trains as ``--step-graph off`` does, bit for bit."""
    from sohsm.heads.full import FullSoftmax

    forward = FullSoftmax.forward

    def reads_back_while_capturing(self, hidden, target):
        out = forward(self, hidden, target)
        if graph_emulator.capturing():
            float(out.loss.detach())  # a host read: refused while capturing
        return out

    monkeypatch.setattr(FullSoftmax, "forward", reads_back_while_capturing)
    extra = ["--max-tokens", str(30 * 24), "--dropout", "0.2"]
    with pytest.warns(RuntimeWarning, match=r"could not be captured as a CUDA graph \(CaptureError: operation not "
                                            r"permitted when stream is capturing \(aten._local_scalar_dense") as warned:
        losses, _ = _train(tmp_path / "graph", corpus, "full", *extra)
    assert not any("capture_end" in str(w.message) for w in warned)
    (graph,) = emulated
    assert graph.failed and graph.captures == 0 and graph.replays == 0 and graph.eager_steps == 30
    allocator = graph.graphs.allocator  # the pool ended and released by hand: nothing left capturing, nothing kept
    assert graph.graphs.stream == "default" and not allocator.underway and not allocator.aborts
    allocator.empty_cache()
    assert not allocator.pools and allocator.kept == 0
    assert not graph.train_step.static and graph.train_step.precision.cache_enabled is not False
    assert all(not isinstance(g["lr"], torch.Tensor) for g in graph.optimizer.param_groups)
    off, _ = _train(tmp_path / "off", corpus, "full", *extra, "--step-graph", "off")
    assert losses == off
    _assert_same_weights(_weights(tmp_path / "graph"), _weights(tmp_path / "off"))


def test_a_capture_that_raises_a_python_error_releases_its_pool_once(tmp_path, corpus, monkeypatch, emulated):
    """A head that raises a Python-level error while capturing (as an op's argument check, an out-of-memory error or a
    Triton compile error do): torch's capture then ends successfully and the error goes on. The pool is released once,
    by the graph's ``reset()``, not by hand as well (a second release fails torch's use-count assert and the third,
    in the graph's destructor, aborts the process at the next garbage collection): no abort, nothing left capturing,
    ``empty_cache`` frees the pool, and the run trains as ``--step-graph off``."""
    import gc

    from sohsm.heads.full import FullSoftmax

    forward = FullSoftmax.forward

    def raises_while_capturing(self, hidden, target):
        if graph_emulator.capturing():
            raise ValueError("a check that fails only while capturing")
        return forward(self, hidden, target)

    monkeypatch.setattr(FullSoftmax, "forward", raises_while_capturing)
    extra = ["--max-tokens", str(20 * 24), "--dropout", "0.2"]
    with pytest.warns(RuntimeWarning, match=r"could not be captured as a CUDA graph \(ValueError: a check that fails "
                                            r"only while capturing\)"):
        losses, _ = _train(tmp_path / "graph", corpus, "full", *extra)
    (graph,) = emulated
    assert graph.failed and graph.captures == 0 and graph.eager_steps == 20
    gc.collect()  # the failed graph's destructor (kept alive by the error's traceback until now)
    allocator = graph.graphs.allocator
    assert not allocator.aborts and not allocator.underway and graph.graphs.stream == "default"
    allocator.empty_cache()
    assert not allocator.pools
    off, _ = _train(tmp_path / "off", corpus, "full", *extra, "--step-graph", "off")
    assert losses == off


def _cleanup_of_v040(graphs, graph, before) -> None:
    """v0.4.0's cleanup of a failed capture: the pool taken from ``graph.pool()`` and released by hand, then reset."""
    import contextlib

    pool = None
    with contextlib.suppress(Exception):
        pool = graph.pool()
    if pool is not None:
        with contextlib.suppress(Exception):
            graphs.end_allocating(pool)
        with contextlib.suppress(Exception):
            graphs.release_pool(pool)
    with contextlib.suppress(Exception):
        graph.reset()
    graphs.set_stream(before.stream)


@pytest.mark.parametrize("failure", ["python", "cuda"])
@pytest.mark.parametrize("cleanup", ["v0.4.0", "now"])
def test_the_emulated_allocator_catches_what_each_cleanup_leaves(failure, cleanup):
    """The emulator's model of torch 2.13 sees both faults of v0.4.0's cleanup (an abort after a Python-level error,
    the allocator left capturing after a CUDA error) and none of :meth:`CudaGraphs.after_failure`'s."""
    import gc

    graphs = graph_emulator.EmulatedGraphs("cpu")
    graph = graphs.new_graph()
    before = graphs.before_capture("side")
    error = ValueError if failure == "python" else graph_emulator.CaptureError
    with pytest.raises(error):
        with graphs.capture(graph, before):
            if failure == "python":
                raise ValueError("an op's argument check")
            torch.ones(2).sum().item()  # a host read
    assert graphs.stream == ("default" if failure == "python" else "side")
    if cleanup == "now":
        graphs.after_failure(graph, before)
    else:
        _cleanup_of_v040(graphs, graph, before)
    del graph
    gc.collect()
    allocator = graphs.allocator
    leaves = (bool(allocator.aborts), bool(allocator.underway))
    if cleanup == "now":
        assert leaves == (False, False) and graphs.stream == "default"
        allocator.empty_cache()
        assert not allocator.pools and allocator.emptied == 2
    elif failure == "python":
        assert leaves == (True, False) and "uc >= 0" in allocator.aborts[0]
    else:
        assert leaves == (False, True)
        allocator.empty_cache()
        assert allocator.kept == 1 and allocator.pools  # empty_cache a no-op, the pool never freed


def test_an_lstm_with_dropout_between_its_layers_is_not_captured(tmp_path, corpus, emulated):
    """``--layers 2`` with dropout: cuDNN re-seeds its inter-layer dropout with a value read back after every restore
    of the random state (modelled by ``graph_emulator.cudnn_rnn_dropout``), and the check restores it right before the
    capture. Without the refusal the capture fails on that read (and every check re-seeds, so the run would not train
    as ``--step-graph off``); with it, ``auto`` keeps the step eager and trains exactly as ``off``, and ``on`` is
    refused in one line."""
    extra = ["--max-tokens", str(16 * 24), "--layers", "2", "--dropout", "0.2"]
    with graph_emulator.cudnn_rnn_dropout():
        with pytest.MonkeyPatch.context() as patch:  # v0.4.0: no refusal, the capture meets the read
            patch.setattr(step_graph_module, "model_refusal", lambda model: None)
            with pytest.warns(RuntimeWarning, match=r"could not be captured.*CaptureError: operation not permitted"):
                _train(tmp_path / "v040", corpus, "full", *extra)
        assert emulated[0].failed and emulated[0].captures == 0
        auto, _ = _train(tmp_path / "auto", corpus, "full", *extra)
        assert len(emulated) == 1  # auto: no step graph made
        off, _ = _train(tmp_path / "off", corpus, "full", *extra, "--step-graph", "off")
    assert auto == off
    _assert_same_weights(_weights(tmp_path / "auto"), _weights(tmp_path / "off"))
    from sohsm import build_head
    from sohsm.models.lstm_lm import LSTMLanguageModel

    cuda, head = torch.device("cuda"), build_head("full", 8, 100)
    for layers, dropout, refused in ((2, 0.2, True), (2, 0.0, False), (1, 0.2, False)):
        model = LSTMLanguageModel(100, 8, 8, layers=layers, dropout=dropout)
        reason = step_graph_module.graph_refusal(cuda, head, model=model)
        assert (reason is not None) == refused, (layers, dropout, reason)
    with pytest.raises(ValueError, match=r"^step_graph 'on' cannot capture this run's step: cuDNN re-seeds the "
                                         r"dropout between the 2 LSTM layers .*\(--layers 1, or --dropout 0, can be "
                                         r"captured\)$"):
        step_graph_module.resolve_step_graph("on", step_graph_module.graph_refusal(
            cuda, head, model=LSTMLanguageModel(100, 8, 8, layers=2, dropout=0.2)))


def test_a_layout_replaced_instead_of_rewritten_is_caught_after_the_re_clustering(tmp_path, corpus, monkeypatch,
                                                                                  emulated):
    """The first replay after a re-clustering is checked against an eager step: a layout tensor replaced by a new one
    (the graph still reads the old storage, an eager step the new) is caught there, the graph given up with one
    warning, and the run goes on eagerly; until then it trained as its static eager steps."""
    from sohsm.heads.two_level.ops import layout as layout_module

    update = layout_module.ClusterLayout.update_from
    rewritten = tuple(n for n in layout_module._DEVICE_TENSORS if n != "cluster_and_position")

    def replaces_one(self, other):
        update(self, other)
        self.cluster_and_position = other.cluster_and_position  # new storage: what a captured graph does not read

    monkeypatch.setattr(layout_module, "_DEVICE_TENSORS", rewritten)
    monkeypatch.setattr(layout_module.ClusterLayout, "update_from", replaces_one)
    extra = ["--max-tokens", str(30 * 24), "--update-every", "12"]
    with pytest.warns(RuntimeWarning, match=r"replay differs from the eager step"):
        losses, _ = _train(tmp_path / "graph", corpus, "self_organized-banded", *extra)
    graph = emulated[0]
    assert graph.failed and graph.captures == 1 and graph.checks == 2, vars(graph)
    eager, _ = _static_eager(tmp_path / "eager", corpus, "self_organized-banded", *extra)
    assert losses[:12] == eager[:12] and len(losses) == 30


def test_freezing_the_clusters_recaptures_a_step_that_writes_no_ring(tmp_path, corpus, emulated):
    """``freeze_after_tokens`` with the step captured: a frozen head's eager step keeps no waiting batch, while the
    graph captured before the freeze writes one into the ring every replay, which the host no longer counts (within
    16 replays the write lands past the ring's end: a device-side assert on CUDA, an IndexError here). The freeze is
    part of the step's key, so the step is captured again without the write, and the run trains as its static eager
    steps."""
    extra = ["--max-tokens", str(40 * 24), "--update-every", "6", "--head-option", "freeze_after_tokens=300"]
    eager_losses, eager = _static_eager(tmp_path / "eager", corpus, "self_organized-banded", *extra)
    graph_losses, graphed = _train(tmp_path / "graph", corpus, "self_organized-banded", *extra)
    graph = emulated[1]
    assert graph.failed is None and graph.captures == 2 and graph.replays >= 20, vars(graph)
    assert graph.head.frozen
    assert graph_losses == eager_losses
    _assert_same_weights(graphed, eager)


def test_the_calls_of_the_cleanup_exist_in_this_torch():
    """``CudaGraphs`` cleans up through torch calls a CPU build has too: a pool handle, the allocator's end of a
    capture's allocation and its release of a pool, a graph's ``pool``/``reset``/``capture_end``, and ``pool=`` of
    ``torch.cuda.graph`` (a rename in a later torch fails here, on any machine)."""
    import inspect

    assert callable(torch.cuda.graph_pool_handle)
    for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        assert callable(getattr(torch._C, name)), name
    for name in ("pool", "reset", "capture_end", "capture_begin", "replay"):
        assert callable(getattr(torch.cuda.CUDAGraph, name)), name
    assert {"pool", "stream"} <= set(inspect.signature(torch.cuda.graph).parameters)
