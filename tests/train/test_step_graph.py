"""The training step as one CUDA graph (sohsm.train.step_graph), tested on the CPU as far as a CPU can.

A CPU has no CUDA graphs, so the graph's contract is kept by ``tests/graph_emulator.py``: ops recorded once
and replayed on the same tensors with the same scalars, a host read refused while capturing, a capture that
changes nothing. Under it a run whose ordinary step is static trains exactly as its eager steps do; these
tests check that for every head a graph takes, tied and untied, banded and not, and the loop's bookkeeping:
warm-up, capture, replay, re-capture after a re-clustering, eager short batches, the fallback, the refusals.
"""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import graph_emulator
from needs import need_bf16_lstm
from small_run import zipf_corpus
from sohsm.cli.main import main
from sohsm.train import step_graph as step_graph_module
from sohsm.train.step import TrainStep

#: heads as the command line names them, each with what makes it capturable on the CPU (the sync-free path)
SYNC_FREE = ["--head-option", "backend=grouped_torch"]
HEADS = {
    "full": ["--head", "full"],
    "full-untied": ["--head", "full", "--no-tie-weights"],
    "adaptive": ["--head", "adaptive"],
    "adaptive-untied": ["--head", "adaptive", "--no-tie-weights"],
    "frequency": ["--head", "two_level_frequency", *SYNC_FREE],
    "frequency-banded": ["--head", "two_level_frequency", *SYNC_FREE, "--head-option", "div_value=4"],
    "self_organized": ["--head", "self_organized", *SYNC_FREE, "--head-option", "div_value=null"],
    "self_organized-untied": ["--head", "self_organized", *SYNC_FREE, "--head-option", "div_value=null",
                              "--no-tie-weights"],
    "self_organized-banded": ["--head", "self_organized", *SYNC_FREE, "--head-option", "div_value=4"],
    "self_organized-banded-untied": ["--head", "self_organized", *SYNC_FREE, "--head-option", "div_value=4",
                                     "--no-tie-weights"],
    # the path CUDA takes: Triton's kernels (here under its interpreter), registered as torch operators
    "self_organized-banded-triton": ["--head", "self_organized", "--head-option", "backend=triton",
                                     "--head-option", "div_value=4"],
    "frequency-triton": ["--head", "two_level_frequency", "--head-option", "backend=triton"],
}
SMALL = ["--emb-size", "16", "--hidden-size", "16", "--batch-size", "4", "--bptt", "6", "--quiet",
         "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A made-up corpus: 300 word types drawn by Zipf's law, 5,000 training tokens."""
    return zipf_corpus(tmp_path_factory.mktemp("zipf"))


@pytest.fixture(autouse=True)
def native_lstm():
    """oneDNN's CPU LSTM keeps state between its forward and backward calls beyond their tensors, which the emulator
    cannot record (a CUDA graph records cuDNN's kernels, which it can): the emulated runs use torch's own LSTM."""
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    yield
    torch._C._set_mkldnn_enabled(enabled)


@pytest.fixture
def emulated(monkeypatch):
    """Graphs on the CPU: the emulator in place of torch.cuda's, and no refusal for the device alone."""
    monkeypatch.setattr(step_graph_module, "GRAPH_API", graph_emulator.EmulatedGraphs)
    monkeypatch.setattr(step_graph_module, "device_refusal", lambda device: None)
    made = []
    original = step_graph_module.StepGraph.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(step_graph_module.StepGraph, "__init__", keep)
    return made


def _static_eager(run_dir, corpus, head, *extra):
    """The reference of a graphed run: the same static steps, never captured (a warm-up that never ends)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_graph_module, "WARMUP_STEPS", 10**9)
        return _train(run_dir, corpus, head, *extra)


def _train(run_dir, corpus, head, *extra):
    code = main(["lm", "train", "--corpus", str(corpus), "--run-dir", str(run_dir), *SMALL, *HEADS[head], *extra])
    assert code == 0
    losses = [r["nll_nats"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "train"]
    return losses, torch.load(run_dir / "last.pt", weights_only=True)


@pytest.mark.parametrize("head", list(HEADS))
def test_a_replayed_step_trains_exactly_as_the_eager_one(tmp_path, corpus, head, emulated):
    """Every ordinary step replays the one captured graph, and the losses and weights are the eager run's, bit for bit:
    the step is static (the same ops on the same storage, nothing read back), or a replay would drift."""
    extra = ["--max-tokens", str(40 * 24)]
    if head.startswith("self_organized"):
        extra += ["--update-every", "12"]  # re-clusterings inside the run: the graph is captured again after each
    eager_losses, eager = _static_eager(tmp_path / "eager", corpus, head, *extra)
    assert emulated[0].captures == 0 and emulated[0].replays == 0
    graph_losses, graphed = _train(tmp_path / "graph", corpus, head, *extra)  # auto: on, where CUDA is emulated
    graph = emulated[1]
    assert graph.failed is None and graph.captures >= 1 and graph.replays >= 20, vars(graph)
    assert graph_losses == eager_losses
    for name, value in eager["model"].items():
        assert torch.equal(graphed["model"][name], value), name
    for name, value in eager["head"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(graphed["head"][name], value), name
    if head.startswith("self_organized"):
        # three re-clusterings (after steps 12, 24, 36) rewrite the layout in place: one capture serves the run, and
        # the first replay after each is checked against an eager step
        assert graph.captures == 1 and graph.checks == 4 and graph.difference == 0, vars(graph)
        assert len(graphed["head"]["history"]) == 3 if "history" in graphed["head"] else True
        assert graphed["head"]["steps"] == eager["head"]["steps"] == 40
    else:
        assert graph.captures == 1 and graph.checks == 1 and graph.difference == 0, vars(graph)


def test_short_batches_and_epoch_starts_run_eagerly(tmp_path, corpus, emulated):
    """Two epochs: an epoch's first window (no carried state) and its short last batch are not replayed."""
    losses, _ = _train(tmp_path / "run", corpus, "full", "--epochs", "2")
    (graph,) = emulated
    # eager: the first step and three of warm-up, each epoch's short last batch (1,249 targets a column, windows of
    # 6) and the second epoch's first window; one capture serves both epochs
    assert graph.captures == 1 and graph.eager_steps == 4 + 2 + 1 and graph.replays > 400
    eager, _ = _static_eager(tmp_path / "eager", corpus, "full", "--epochs", "2")
    assert losses == eager


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


def _weights(run_dir):
    return torch.load(run_dir / "last.pt", weights_only=True)


def _assert_same_weights(a, b) -> None:
    for part in ("model", "head"):
        for name, value in b[part].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(a[part][name], value), f"{part}.{name}"


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
                                            r"([0-9.e+-]+|inf) \(relative; at most 0.0001 expected\); the run goes on with "
                                            r"eager steps") as warned:
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
    assert not graph.train_step.static and not graph.train_step.precision.cache_enabled is False
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


def test_every_capture_replay_and_eager_step_runs_on_the_runs_device(tmp_path, corpus, emulated):
    """``--device cuda:1``: the side stream, the capture and every replay run under ``torch.cuda.device`` of the run's
    device (else kernels could go to another device's stream and the graph capture nothing)."""
    _train(tmp_path / "run", corpus, "self_organized-banded", "--max-tokens", str(30 * 24), "--update-every", "12")
    (graph,) = emulated
    kinds = {what for what, _ in graph.graphs.log}
    assert kinds == {"eager", "capture", "replay"} and all(inside for _, inside in graph.graphs.log)
    context = step_graph_module.CudaGraphs(torch.device("cuda", 1)).device_context()
    assert isinstance(context, torch.cuda.device) and context.idx == 1


def test_the_triton_probe_runs_in_the_steps_dtype(monkeypatch):
    """``auto`` takes Triton's kernels only where they run in the dtype the step computes in: a probe that fails in
    bf16 alone refuses the bf16 step (its fallback reads back) and not the float32 one."""
    from sohsm import build_head
    from sohsm.heads.two_level.ops import backends

    monkeypatch.setattr(step_graph_module, "device_refusal", lambda device: None)
    monkeypatch.setitem(backends._triton_problems, ("cuda", torch.float32), None)
    monkeypatch.setitem(backends._triton_problems, ("cuda", torch.bfloat16), "no bf16 kernel here")
    head = build_head("self_organized", 8, 100)
    cuda = torch.device("cuda")
    with pytest.warns(RuntimeWarning, match="no bf16 kernel here"):
        assert "reads its batch back" in step_graph_module.graph_refusal(cuda, head, amp="bf16")
    assert step_graph_module.graph_refusal(cuda, head) is None


def _reachable_tensors(roots, skip) -> list:
    """Every tensor reachable from ``roots`` through attributes, dicts, lists and tuples (not through ``skip``)."""
    found, seen, stack = [], set(), list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or any(obj is s for s in skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.split(".")[0] in (
                "sohsm", "torch"):
            stack.extend(vars(obj).values())
    return found


@pytest.mark.parametrize("head", ["self_organized-banded", "self_organized-banded-triton", "adaptive"])
def test_nothing_kept_for_later_was_made_inside_the_capture(tmp_path, corpus, head, emulated, monkeypatch):
    """A tensor made while capturing lives in the graph's memory, which holds nothing until a replay writes it (and is
    overwritten by each replay): nothing the model, head, optimizer, task or step keeps may be one, but the step's
    own outputs (its loss, gradient norm and the carried state, which each replay writes)."""
    release = step_graph_module.StepGraph.release

    def keep_last(self):  # the session releases its graph at the end: what it released is looked at here
        self.last = self.captured
        release(self)

    monkeypatch.setattr(step_graph_module.StepGraph, "release", keep_last)
    _train(tmp_path / "run", corpus, head, "--max-tokens", str(12 * 24),
           *(["--update-every", "100"] if head.startswith("self_organized") else []))
    (graph,) = emulated
    captured = graph.last
    assert graph.failed is None and graph.captures == 1 and captured is not None
    allowed = {t.untyped_storage().data_ptr() for t in [*captured.result, *(captured.state_out or ())]
               if isinstance(t, torch.Tensor)}
    roots = [graph.train_step, graph.task, graph.optimizer, graph.head]
    kept = [t for t in _reachable_tensors(roots, skip=[graph, captured, captured.graph])
            if t.untyped_storage().data_ptr() in captured.graph.made - allowed]
    assert not kept, [tuple(t.shape) for t in kept]


def test_resume_with_a_graph_equals_an_uninterrupted_run(tmp_path, corpus, emulated):
    whole, _ = _train(tmp_path / "whole", corpus, "self_organized-banded", "--max-tokens", str(30 * 24),
                      "--update-every", "10")
    _train(tmp_path / "part", corpus, "self_organized-banded", "--max-tokens", str(16 * 24), "--update-every", "10")
    assert main(["lm", "train", "--run-dir", str(tmp_path / "part"), "--resume", "--quiet",
                 "--max-tokens", str(30 * 24)]) == 0
    records = [json.loads(line) for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [r["nll_nats"] for r in records if r["kind"] == "train"] == whole


def test_on_is_refused_on_the_cpu_in_one_line_and_writes_nothing(tmp_path, corpus, capsys):
    code = main(["lm", "train", "--corpus", str(corpus), "--run-dir", str(tmp_path / "run"), *SMALL,
                 "--head", "full", "--step-graph", "on"])
    err = capsys.readouterr().err
    assert code != 0 and "step-graph" in err and "CUDA" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2
    assert not (tmp_path / "run").exists()


def test_on_is_refused_for_a_step_that_reads_back(monkeypatch):
    """The per-cluster backend reads its batch's clusters back, fp16's scaler its flag: ``on`` says so in one line."""
    from sohsm import build_head

    monkeypatch.setattr(step_graph_module, "device_refusal", lambda device: None)
    cuda = torch.device("cuda")
    head = build_head("self_organized", 8, 100, backend="per_cluster")
    with pytest.raises(ValueError, match=r"^step_graph 'on' cannot capture this run's step: .*'per_cluster' backend "
                                         r"reads its batch back"):
        step_graph_module.resolve_step_graph("on", step_graph_module.graph_refusal(cuda, head))
    assert not step_graph_module.resolve_step_graph("auto", step_graph_module.graph_refusal(cuda, head))
    full = build_head("full", 8, 100)
    assert step_graph_module.graph_refusal(cuda, full) is None
    assert "fp16" in step_graph_module.graph_refusal(cuda, full, amp="fp16")
    assert "several processes" in step_graph_module.graph_refusal(cuda, full, world=2)
    adagrad = torch.optim.Adagrad(full.parameters(), lr=0.1)  # torch's own, unfused: reads its step counts
    assert "not fused" in step_graph_module.graph_refusal(cuda, full, optimizer=adagrad)


def test_auto_is_off_on_the_cpu(tmp_path, corpus, monkeypatch):
    made = []
    monkeypatch.setattr(step_graph_module.StepGraph, "__init__", lambda self, *a, **k: made.append(1))
    _train(tmp_path / "run", corpus, "full", "--max-tokens", str(4 * 24))
    assert not made


# -- the static step, op by op -------------------------------------------------------------------------------------
class _Signature(TorchDispatchMode):
    """Each op of a step with where its tensors live: ``("p", storage, offset)`` for a tensor that existed before the
    step (a weight, a gradient, a buffer, optimizer state), ``("l", k)`` for one the step's own op ``k`` made; and its
    other arguments (a scalar that changed from step to step would be frozen by a graph)."""

    def __init__(self, inputs) -> None:
        super().__init__()
        self.ops, self.made = [], {}
        #: the batch and the carried state: what a graph copies into fixed buffers before each replay
        self.inputs = {t.untyped_storage().data_ptr(): i for i, t in enumerate(inputs)}

    def _label(self, value):
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr()
            if key in self.made:
                return ("l", self.made[key])
            if key in self.inputs:
                return ("in", self.inputs[key])  # the batch is a view of the corpus: where it starts moves
            return ("p", key, value.storage_offset())
        if isinstance(value, (list, tuple)):
            return tuple(self._label(v) for v in value)
        return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) else type(value).__name__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        signature = (str(func), self._label(list(args)), self._label(sorted(kwargs.items())))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.made[t.untyped_storage().data_ptr()] = len(self.ops)
        self.ops.append(signature)
        return out


@pytest.mark.parametrize("head", list(HEADS))
def test_two_ordinary_steps_issue_the_same_ops_on_the_same_storage(tmp_path, corpus, head, monkeypatch):
    """The static step itself, without any graph: steps 6 and 7 of a run (after the warm-up, before a re-clustering)
    dispatch the same ops, on the same weights, gradients, buffers and optimizer state, with the same scalars."""
    monkeypatch.setattr(step_graph_module, "device_refusal", lambda device: None)
    monkeypatch.setattr(step_graph_module, "GRAPH_API", graph_emulator.EmulatedGraphs)
    monkeypatch.setattr(step_graph_module.StepGraph, "__call__",
                        lambda self, batch, step: self.train_step(batch, step))  # static, eager
    original, seen = TrainStep.__call__, []

    def recorded(self, batch, step):
        if step not in (6, 7):
            return original(self, batch, step)
        inputs = [*torch.utils._pytree.tree_flatten(batch)[0], *(self.task.carried_state() or ())]
        with _Signature(inputs) as signature:
            out = original(self, batch, step)
        seen.append(signature.ops)
        return out

    monkeypatch.setattr(TrainStep, "__call__", recorded)
    _train(tmp_path / "run", corpus, head, "--max-tokens", str(8 * 24))
    first, second = seen
    assert len(first) > 20
    for k, (a, b) in enumerate(zip(first, second)):
        assert a == b, f"op {k} differs:\n{a}\n{b}"
    assert len(first) == len(second)


def test_a_replayed_bf16_step_trains_exactly_as_the_eager_one(tmp_path, corpus, emulated):
    """Under autocast (bf16; autocast's weight cache off in a static step) the banded default replays as it runs."""
    need_bf16_lstm()
    extra = ["--amp", "bf16", "--max-tokens", str(30 * 24), "--update-every", "12"]
    eager_losses, _ = _static_eager(tmp_path / "eager", corpus, "self_organized-banded", *extra)
    graph_losses, _ = _train(tmp_path / "graph", corpus, "self_organized-banded", *extra)
    graph = emulated[1]
    assert graph.failed is None and graph.captures == 1 and graph.checks == 3 and graph.replays >= 15, vars(graph)
    assert graph_losses == eager_losses


def test_auto_keeps_adaptive_softmax_eager_where_its_static_form_is_large(monkeypatch):
    """Adaptive softmax's static step scores every row against every tail: ``auto`` captures it while one copy of
    those scores stays within 1 GiB (33k words, 2,560 rows: 0.3 GiB), and keeps it eager beyond (256k: 2.3 GiB);
    ``on`` captures it anyway."""
    from types import SimpleNamespace

    from sohsm import build_head

    monkeypatch.setattr(step_graph_module, "device_refusal", lambda device: None)
    cuda, ranks = torch.device("cuda"), SimpleNamespace(world=1)

    def refusal(n, setting):
        head = build_head("adaptive", 32, n)
        config = SimpleNamespace(step_graph=setting, amp=None, compile=False)
        return step_graph_module.step_graph_refusal(config, head, None, ranks, cuda, rows=2560)

    assert refusal(33_278, "auto") is None
    reason = refusal(256_000, "auto")
    assert " GiB a copy" in reason and "--step-graph on captures it anyway" in reason
    assert not step_graph_module.resolve_step_graph("auto", reason)
    assert refusal(256_000, "on") is None


def test_the_memory_estimate_counts_what_a_captured_step_holds():
    """With the step captured (CUDA, not ``off``), the pre-flight estimate adds the check's copies (weights, gradients,
    optimizer state, the weights an eager step wrote) and a head's static buffers (adaptive softmax's tail scores)."""
    from sohsm.tasks.lm import LMConfig
    from sohsm.tasks.lm.preflight import estimate_bytes
    from sohsm.train import apply_overrides

    config = apply_overrides(LMConfig(), {"head.name": "adaptive", "batch_size": 128, "bptt": 20})
    eager, covers = estimate_bytes(config, 33_278)
    graphed, graph_covers = estimate_bytes(config, 33_278, graph=True)
    assert "captured step's check" in graph_covers and "check" not in covers
    static_scores = 3 * 2560 * (33_278 - 1513) * 4
    assert graphed - eager > static_scores


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
