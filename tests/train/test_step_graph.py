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
    monkeypatch.setattr(step_graph_module, "GRAPH_API",
                        (graph_emulator.EmulatedGraph, graph_emulator.emulated_capture, graph_emulator.no_sync))
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
        assert graph.captures >= 3  # captured again after each re-clustering (at steps 12, 24, 36)
        assert graphed["head"]["steps"] == eager["head"]["steps"] == 40


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
    assert graph.failed is None and graph.captures >= 2 and graph.replays >= 15, vars(graph)
    assert graph_losses == eager_losses
