"""What the CPU tests of the captured training step share: the heads as the command line names them, a small run,
the emulator in place of torch.cuda's graphs (``graph_emulator``), and a run's losses and weights."""
from __future__ import annotations

import json

import pytest
import torch

import graph_emulator
from small_run import zipf_corpus
from sohsm.cli.main import main
from sohsm.train import step_graph as step_graph_module

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


def _weights(run_dir):
    return torch.load(run_dir / "last.pt", weights_only=True)


def _assert_same_weights(a, b) -> None:
    for part in ("model", "head"):
        for name, value in b[part].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(a[part][name], value), f"{part}.{name}"
