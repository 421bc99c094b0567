"""The training step as one CUDA graph (sohsm.train.step_graph), tested on the CPU as far as a CPU can.

A CPU has no CUDA graphs, so the graph's contract is kept by ``tests/graph_emulator.py``: ops recorded once
and replayed on the same tensors with the same scalars, a host read refused while capturing, a capture that
changes nothing. Under it a run whose ordinary step is static trains exactly as its eager steps do; these
tests check that for every head a graph takes, tied and untied, banded and not, and the loop's bookkeeping:
warm-up, capture, replay, re-capture after a re-clustering, eager short batches, the refusals (a failed capture and
a wrong replay: ``test_step_graph_failures.py``).
"""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import graph_emulator
from needs import need_bf16_lstm
from sohsm.cli.main import main
from sohsm.train import step_graph as step_graph_module
from sohsm.train.step import TrainStep
from step_graph_runs import HEADS, SMALL, _static_eager, _train, corpus, emulated, native_lstm  # noqa: F401


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
