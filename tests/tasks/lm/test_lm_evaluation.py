"""Dev evaluation: perplexity and its cluster / in-cluster parts against a dense reference."""
from __future__ import annotations

import math

import pytest
import torch

import sohsm
from sohsm.data import batchify
from sohsm.models import LSTMLanguageModel
from sohsm.tasks.lm import evaluate_stream as evaluate

N, D = 40, 12


def _setup(name):
    torch.manual_seed(0)
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D, dropout=0.3)
    head = sohsm.build_head(name, D, N, counts=torch.arange(N, 0, -1))
    ids = torch.randint(0, N, (203,))
    return model, head, ids


def _reference(model, head, ids, batch_size):
    """Every column read in one go, every log-probability from the dense [B, N] table, in float64."""
    with torch.no_grad():
        model.eval()
        head.eval()
        data = batchify(ids, batch_size)
        hidden, _ = model(data[:-1])
        log_probs = head.log_prob(hidden.reshape(-1, D)).double()
        target = data[1:].reshape(-1)
        return -log_probs.gather(1, target[:, None]).mean().item(), target.numel()


@pytest.mark.parametrize("name", ["two_level_random", "self_organized", "two_level_frequency"])
def test_two_level_heads_against_dense_reference(name):
    model, head, ids = _setup(name)
    nll, tokens = _reference(model, head, ids, 4)
    model.train()
    head.train()
    result = evaluate(model, head, ids, batch_size=4, bptt=7)
    assert result.tokens == tokens
    assert math.isclose(result.nll_nats, nll, rel_tol=1e-5)
    assert math.isclose(result.ppl, math.exp(nll), rel_tol=1e-5)
    assert math.isclose(result.ppl, result.ppl_cluster * result.ppl_in_cluster, rel_tol=1e-9)
    assert 1 < result.ppl_cluster < head.n_clusters * 10 and result.ppl_in_cluster > 1
    assert model.training and head.training  # modes restored


def test_full_softmax_has_no_cluster_parts():
    model, head, ids = _setup("full")
    nll, _ = _reference(model, head, ids, 5)
    result = evaluate(model, head, ids, batch_size=5, bptt=50)
    assert math.isclose(result.nll_nats, nll, rel_tol=1e-5)
    assert result.ppl_cluster is None and result.ppl_in_cluster is None
    assert result.tokens_per_s > 0 and set(result.to_dict()) >= {"ppl", "ppl_cluster", "ppl_in_cluster"}


def test_window_length_does_not_change_the_result_nor_the_random_state():
    model, head, ids = _setup("two_level_random")
    state = torch.get_rng_state()
    a = evaluate(model, head, ids, batch_size=3, bptt=2)
    b = evaluate(model, head, ids, batch_size=3, bptt=64)
    assert math.isclose(a.nll_nats, b.nll_nats, rel_tol=1e-6)
    assert torch.equal(torch.get_rng_state(), state)  # evaluation never perturbs training's randomness


def test_too_short_a_stream():
    model, head, _ = _setup("full")
    with pytest.raises(ValueError, match="two tokens per column"):
        evaluate(model, head, torch.arange(5), batch_size=4)
