"""Misuse of a head gets a ValueError that says what to do: attach(None), an optimizer that does not train the
head, hidden states in another dtype than the weights. float64 heads work, exactly, against float32 ones."""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import build_head, head_names

from .test_precision import D, N, make_head


@pytest.mark.parametrize("name", head_names())
def test_attach_needs_an_optimizer(name, tmp_path):
    head = make_head(name, tmp_path)
    with pytest.raises(ValueError, match="^attach needs the torch.optim.Optimizer that trains the head, got NoneType"):
        head.attach(None)


def test_a_self_organized_head_refuses_an_optimizer_that_does_not_train_it():
    head = build_head("self_organized", D, N, counts=torch.arange(N, 0, -1))
    lstm = torch.nn.LSTM(D, D)
    model_only = torch.optim.Adagrad(lstm.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"does not hold the head's parameters cluster_weight, weight: build it"):
        head.attach(model_only)
    both = torch.optim.Adagrad([*lstm.parameters(), *head.parameters()], lr=0.1)
    assert head.attach(both) is not None


@pytest.mark.parametrize("name", head_names())
def test_float64_hidden_states_on_a_float32_head_say_what_to_do(name, tmp_path):
    head = make_head(name, tmp_path)
    hidden, target = torch.randn(5, D, dtype=torch.float64), torch.randint(0, N, (5,))
    message = r"^hidden must have the dtype of the head's weights, torch.float32, got torch.float64: convert"
    with pytest.raises(ValueError, match=message):
        head(hidden, target)
    with pytest.raises(ValueError, match=message):
        head.log_prob(hidden)


@pytest.mark.parametrize("name", head_names())
def test_a_float64_head_scores_float64_hidden_states(name, tmp_path):
    head = make_head(name, tmp_path).eval()
    hidden, target = torch.randn(5, D), torch.randint(0, N, (5,))
    expected = head.log_prob(hidden).double()
    double = head.double()
    log_probs = double.log_prob(hidden.double())
    assert log_probs.dtype == torch.float64
    torch.testing.assert_close(log_probs, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(log_probs.logsumexp(1), torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(double(hidden.double(), target).output, log_probs.gather(1, target[:, None])[:, 0])
    values, ids = double.topk(hidden.double(), 3)
    torch.testing.assert_close(values, log_probs.gather(1, ids))


@pytest.mark.parametrize("n_clusters", [0, -3, N + 1])
def test_a_bad_number_of_clusters_is_named_as_such(n_clusters):
    with pytest.raises(ValueError, match=r"n_clusters must be an integer in \[1, 60\]"):
        build_head("self_organized", D, N, counts=torch.arange(N, 0, -1), n_clusters=n_clusters)
