"""Weight tying with two-level heads: the embedding reads the head's rows through its layout (float64 reference)."""
from __future__ import annotations

import copy

import pytest
import torch

import sohsm
from sohsm.clustering import random_assignment
from sohsm.models import LSTMLanguageModel, TransformerLM
from tests.heads.reference import in_word_order, ref_params, two_level_parts

N, D = 40, 8


def reference_grads(model: LSTMLanguageModel, head, ids: torch.Tensor):
    """The tied loss computed densely from the equations: the word vectors in word order serve as both
    the embedding and the head's output vectors; returns (loss, grad of the word vectors in word order)."""
    params = ref_params(head)
    lstm = copy.deepcopy(model.lstm)
    hidden, _ = lstm(params.word_weight[ids[:-1]])
    hidden = hidden.reshape(-1, D)
    cluster_part, word_part = two_level_parts(params, hidden, ids[1:].reshape(-1))
    loss = -(cluster_part + word_part).mean()
    loss.backward()
    return loss.detach(), params.word_weight.grad


@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch"])
@pytest.mark.parametrize("name", ["two_level_random", "self_organized"])
def test_tied_gradient_matches_the_dense_reference_across_a_reclustering(name, backend):
    torch.manual_seed(0)
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D).double()
    head = sohsm.build_head(name, D, N, counts=torch.arange(N, 0, -1), backend=backend).double()
    if name == "self_organized":
        head.update_every = 0  # the test moves the clusters itself
    model.tie_weights(head)
    assert not any(p is head.weight for p in model.parameters())  # the model owns no copy
    for step in range(3):
        ids = torch.randint(0, N, (6, 5))
        expected_loss, expected_grad = reference_grads(model, head, ids)
        hidden, _ = model(ids[:-1])
        loss = head(hidden, ids[1:]).loss
        loss.backward()
        torch.testing.assert_close(loss.detach(), expected_loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(in_word_order(head, head.weight.grad), expected_grad, rtol=1e-9, atol=1e-12)
        for p in (*model.parameters(), head.weight, head.cluster_weight):
            p.grad = None
        vectors = head.word_vectors()
        head.set_assignment(random_assignment(N, head.n_clusters, torch.Generator().manual_seed(step)))
        torch.testing.assert_close(model.embedding(torch.arange(N)).detach(), vectors, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch"])
def test_tied_gradient_holds_over_steps_without_a_reclustering(backend):
    """The head zeroes only the rows it wrote at the step before; the embedding adds into the same buffer
    (rows of clusters the targets may not touch), and those rows must not leak into the next step."""
    torch.manual_seed(0)
    n = 400
    model = LSTMLanguageModel(n, emb_size=D, hidden_size=D).double()
    head = sohsm.build_head("self_organized", D, n, counts=torch.arange(n, 0, -1), backend=backend,
                            n_clusters=20, update_every=0).double()
    model.tie_weights(head)
    for _ in range(3):
        ids = torch.randint(0, n, (3, 2))  # 4 targets: most clusters absent, most input words outside them
        expected_loss, expected_grad = reference_grads(model, head, ids)
        hidden, _ = model(ids[:-1])
        head(hidden, ids[1:]).loss.backward()
        torch.testing.assert_close(in_word_order(head, head.weight.grad), expected_grad, rtol=1e-9, atol=1e-12)
        for p in (*model.parameters(), head.weight, head.cluster_weight):
            p.grad = None


def test_tying_refuses_heads_without_shareable_word_vectors():
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D)
    with pytest.raises(ValueError, match="has none to share"):
        model.tie_weights(sohsm.build_head("adaptive", D, N, div_value=2))
    with pytest.raises(ValueError, match="shaped like the embedding"):
        model.tie_weights(sohsm.build_head("self_organized", D, N, counts=torch.arange(N, 0, -1), word_dim=4))
    with pytest.raises(ValueError, match="emb_size == hidden_size"):
        LSTMLanguageModel(N, emb_size=4, hidden_size=D).tie_weights(sohsm.build_head("full", D, N))
    model.tie_weights(sohsm.build_head("self_organized", D, N, counts=torch.arange(N, 0, -1)))
    with pytest.raises(ValueError, match="tied already"):
        model.tie_weights(sohsm.build_head("full", D, N))


def test_transformer_ties_to_a_two_level_head():
    torch.manual_seed(0)
    model = TransformerLM(N, hidden_size=D, layers=1, attention_heads=2, context=16)
    head = sohsm.build_head("two_level_random", D, N)
    model.tie_weights(head)
    ids = torch.randint(0, N, (9, 2))
    hidden, _ = model(ids[:-1])
    head(hidden, ids[1:]).loss.backward()
    used = torch.zeros(N, dtype=torch.bool)
    used[ids[:-1].flatten()] = True
    grad = in_word_order(head, head.weight.grad)
    assert grad[used].abs().sum() > 0  # the embedding's share reached the head's rows
