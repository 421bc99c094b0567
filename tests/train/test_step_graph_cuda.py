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


def _graphs_of(args: list[str]) -> list:
    """``sohsm lm train`` with ``args`` (it must succeed); the StepGraphs its session made."""
    made = []
    original = step_graph_module.StepGraph.__init__

    def keep(self, *a, **k):
        original(self, *a, **k)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_graph_module.StepGraph, "__init__", keep)
        assert main(["lm", *args]) == 0
    return made


def _train(run_dir, corpus, head, *extra):
    made = _graphs_of(["train", "--corpus", str(corpus), "--run-dir", str(run_dir), "--device", "cuda",
                       "--emb-size", "32", "--hidden-size", "32", "--batch-size", "8", "--bptt", "6", "--quiet",
                       "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "1", "--seed", "3",
                       "--max-tokens", str(40 * 48), *HEADS[head], *extra])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["nll_nats"] for r in records if r["kind"] == "train"], made


@pytest.mark.parametrize("head", list(HEADS))
def test_a_captured_step_trains_as_the_eager_steps(tmp_path, corpus, head):
    """``--step-graph on`` captures the step once (a re-clustering rewrites what it reads in place) and replays it; the
    losses follow the eager static steps' (to rounding: some CUDA kernels add in any order)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_graph_module, "WARMUP_STEPS", 10**9)  # static steps, never captured
        eager, _ = _train(tmp_path / "eager", corpus, head)
    graphed, (graph,) = _train(tmp_path / "graph", corpus, head, "--step-graph", "on")
    assert graph.failed is None and graph.captures >= 1 and graph.replays >= 25, vars(graph)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-4)


def test_the_replay_checks_against_eager_steps_at_real_shapes(tmp_path):
    """WikiText-2, LSTM 512, bf16, batch 128 x 20, 60 steps, a re-clustering every 25: one capture, the replay checked
    against an eager step at the capture and after each re-clustering (rewritten in place), within 1e-3."""
    from needs import need_corpus

    need_corpus("wikitext-2")
    (graph,) = _graphs_of(["train", "--corpus", "wikitext-2", "--run-dir", str(tmp_path / "run"), "--device", "cuda",
                           "--amp", "bf16", "--emb-size", "512", "--hidden-size", "512", "--batch-size", "128",
                           "--bptt", "20", "--max-tokens", str(60 * 128 * 20), "--update-every", "25",
                           "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "20", "--quiet",
                           "--step-graph", "on"])
    print(f"captures {graph.captures}, checks {graph.checks}, replays {graph.replays}, "
          f"largest difference {graph.difference:.3g}")
    assert graph.failed is None and graph.captures == 1 and graph.checks == 3 and graph.replays >= 50, vars(graph)
    assert graph.difference <= 1e-3


def test_a_capture_that_fails_half_way_leaves_a_clean_eager_run_on_cuda(tmp_path, corpus, monkeypatch):
    """A head that reads a value back only while capturing, dropout 0.2, 30 steps: the run finishes (the generator
    usable again: the eager dropouts after it run), its one warning names the read, the current stream is the default
    one again, and the losses follow a run with ``--step-graph off``."""
    from sohsm.heads.full import FullSoftmax

    forward = FullSoftmax.forward

    def reads_back_while_capturing(self, hidden, target):
        out = forward(self, hidden, target)
        if torch.cuda.is_current_stream_capturing():
            float(out.loss.detach())  # a host read: refused while capturing
        return out

    monkeypatch.setattr(FullSoftmax, "forward", reads_back_while_capturing)
    extra = ["--dropout", "0.2", "--max-tokens", str(30 * 48)]
    with pytest.warns(RuntimeWarning, match=r"could not be captured as a CUDA graph") as warned:
        losses, (graph,) = _train(tmp_path / "graph", corpus, "full", *extra)
    messages = [str(w.message) for w in warned if "CUDA graph" in str(w.message)]
    print(messages)
    assert len(messages) == 1 and "capture_end" not in messages[0]
    assert graph.failed and graph.captures == 0 and len(losses) == 30
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5)  # the generator is not left capturing
    off, _ = _train(tmp_path / "off", corpus, "full", *extra, "--step-graph", "off")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(off), rtol=1e-4, atol=1e-4)
