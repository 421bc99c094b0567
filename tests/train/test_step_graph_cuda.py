"""The training step captured as a real CUDA graph (a GPU only; the CPU tests run the graph's contract emulated)."""
from __future__ import annotations

import json

import pytest
import torch

from small_run import zipf_corpus
from sohsm.cli.main import main
from sohsm.train import step_graph as step_graph_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a captured CUDA graph)")

HEADS = {
    "full": ["--head", "full"],
    "adaptive": ["--head", "adaptive"],
    "frequency": ["--head", "two_level_frequency"],
    "default": ["--head", "self_organized", "--head-option", "div_value=4", "--update-every", "12"],
    "every word at d": ["--head", "self_organized", "--head-option", "div_value=null", "--update-every", "12"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return zipf_corpus(tmp_path_factory.mktemp("zipf"))


def _train(run_dir, corpus, head, *extra):
    made = []
    original = step_graph_module.StepGraph.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_graph_module.StepGraph, "__init__", keep)
        assert main(["lm", "train", "--corpus", str(corpus), "--run-dir", str(run_dir), "--device", "cuda",
                     "--emb-size", "32", "--hidden-size", "32", "--batch-size", "8", "--bptt", "6", "--quiet",
                     "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "1", "--seed", "3",
                     "--max-tokens", str(40 * 48), *HEADS[head], *extra]) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["nll_nats"] for r in records if r["kind"] == "train"], made


@pytest.mark.parametrize("head", list(HEADS))
def test_a_captured_step_trains_as_the_eager_steps(tmp_path, corpus, head):
    """``--step-graph on`` captures the step once (again after each re-clustering) and replays it; the losses follow
    the eager static steps' (to rounding: some CUDA kernels add in any order)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_graph_module, "WARMUP_STEPS", 10**9)  # static steps, never captured
        eager, _ = _train(tmp_path / "eager", corpus, head)
    graphed, (graph,) = _train(tmp_path / "graph", corpus, head, "--step-graph", "on")
    assert graph.failed is None and graph.captures >= 1 and graph.replays >= 25, vars(graph)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-4)
