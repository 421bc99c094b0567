"""Weight tying: the embedding reads a two-level head's rows through its layout, an adaptive softmax's through
adaptive input (float64 references)."""
from __future__ import annotations

import copy

import pytest
import torch
from tests.heads.reference import (
    adaptive_input_matrix,
    adaptive_log_prob,
    in_word_order,
    ref_params,
    shuffled_zipf_counts,
    two_level_parts,
)

import sohsm
from sohsm.clustering import random_assignment
from sohsm.models import LSTMLanguageModel, TransformerLM

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


class DenseLookup(torch.nn.Module):
    """An embedding that reads rows of a given ``[N, d]`` matrix (a function of other tensors, not a parameter)."""

    matrix: torch.Tensor

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.matrix[ids]


def adaptive_leaves(head):
    """Float64 leaf copies of an adaptive head's parameters: (head weight, head bias, [(projection, vectors)])."""
    def leaf(t):
        return t.detach().clone().requires_grad_(True)

    bias = leaf(head.head.bias) if head.head.bias is not None else None
    return leaf(head.head.weight), bias, [(leaf(p.weight), leaf(o.weight)) for p, o in head.tail]


@pytest.mark.parametrize("architecture", ["lstm", "transformer"])
def test_tied_adaptive_gradients_match_the_dense_reference(architecture):
    """Adaptive input: the loss of a tied model and its gradient w.r.t. every shared parameter (the shortlist rows,
    the tails' vectors and projections), and the model's own, equal those of the dense float64 construction."""
    torch.manual_seed(0)
    n, cutoffs = 60, [6, 20]
    if architecture == "lstm":
        model = LSTMLanguageModel(n, emb_size=D, hidden_size=D, dropout=0.0).double()
    else:
        model = TransformerLM(n, hidden_size=D, layers=1, attention_heads=2, context=16, dropout=0.0).double()
    head = sohsm.build_head("adaptive", D, n, counts=shuffled_zipf_counts(n), cutoffs=cutoffs, div_value=2,
                            head_bias=True).double()
    model.tie_weights(head)
    assert not any(p is head.head.weight for p in model.parameters())  # the model owns no copy
    reference = copy.deepcopy(model)
    reference.embedding = DenseLookup()  # reads the matrix built from the leaves below
    head_weight, bias, tails = adaptive_leaves(head)
    for _ in range(2):
        ids = torch.randint(0, n, (7, 4))
        hidden, _ = model(ids[:-1])
        loss = head(hidden, ids[1:]).loss
        loss.backward()

        matrix = adaptive_input_matrix(head_weight, tails, cutoffs, head.word_of_rank)  # [N, d]
        reference.embedding.matrix = matrix
        ref_hidden, _ = reference(ids[:-1])
        log_prob = adaptive_log_prob(head_weight, bias, tails, cutoffs, head.word_of_rank, ref_hidden.reshape(-1, D))
        expected = -log_prob.gather(1, ids[1:].reshape(-1, 1)).mean()
        expected.backward()

        torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(head.head.weight.grad, head_weight.grad, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(head.head.bias.grad, bias.grad, rtol=1e-9, atol=1e-12)
        for (p, o), (p_ref, o_ref) in zip(head.tail, tails):
            torch.testing.assert_close(p.weight.grad, p_ref.grad, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(o.weight.grad, o_ref.grad, rtol=1e-9, atol=1e-12)
        own = [(name, p) for name, p in model.named_parameters()]
        for (name, p), q in zip(own, reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)
        with torch.no_grad():  # one plain SGD step on both, then again
            for p in (*model.parameters(), *head.parameters()):
                p -= 0.5 * p.grad
            for p in (*reference.parameters(), head_weight, bias, *(t for pair in tails for t in pair)):
                if p.grad is not None:
                    p -= 0.5 * p.grad
        for p in (*model.parameters(), *head.parameters(), *reference.parameters(), head_weight, bias,
                  *(t for pair in tails for t in pair)):
            p.grad = None


@pytest.mark.parametrize("name, options, reason", [
    ("tree_huffman", {}, "no word vectors"),
    ("importance_sampling", {}, "sampled"),
    ("dsoftmax", {}, "segment"),
    ("self_organized", {"word_dim": 4}, "4 entries"),
])
def test_tying_refuses_heads_without_shareable_word_vectors(name, options, reason):
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D)
    head = sohsm.build_head(name, D, N, counts=torch.arange(N, 0, -1), **options)
    with pytest.raises(ValueError, match=reason):
        model.tie_weights(head)
    assert sohsm.heads.tying_refusal(name, D, options) is not None  # asked of the name, before any head is built


def test_tying_checks_the_sizes_and_ties_once():
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D)
    with pytest.raises(ValueError, match="emb_size == hidden_size"):
        LSTMLanguageModel(N, emb_size=4, hidden_size=D).tie_weights(sohsm.build_head("full", D, N))
    with pytest.raises(ValueError, match="to match the embedding"):
        model.tie_weights(sohsm.build_head("full", D, N + 1))
    model.tie_weights(sohsm.build_head("adaptive", D, N, div_value=2))
    with pytest.raises(ValueError, match="tied already"):
        model.tie_weights(sohsm.build_head("full", D, N))


@pytest.mark.parametrize("name", ["full", "two_level_frequency", "self_organized", "adaptive"])
@pytest.mark.parametrize("model_class", ["lstm", "transformer"])
def test_a_tied_weight_starts_as_the_models_embedding(name, model_class):
    """One rule for every head and model: tying re-draws the word vectors the embedding reads with the model's
    embedding initialisation (LSTM U(+-0.1), transformer N(0, 0.02)), not the head's U(+-d^-1/2)."""
    torch.manual_seed(0)
    n, d = 1000, 256  # the head's own bound would be d^-1/2 = 0.0625
    if model_class == "lstm":
        model = LSTMLanguageModel(n, emb_size=d, hidden_size=d)
    else:
        model = TransformerLM(n, hidden_size=d, layers=1, attention_heads=2, context=16)
    options = {"div_value": 2.0} if name == "adaptive" else {}
    head = sohsm.build_head(name, d, n, counts=torch.arange(n, 0, -1), **options)
    model.tie_weights(head)
    drawn = torch.cat([v.detach().reshape(-1) for v in head.tied_vectors()])
    assert drawn.numel() >= n * d // 4
    if model_class == "lstm":
        assert drawn.abs().max() <= 0.1 and drawn.abs().max() > 0.099 and drawn.abs().max() > d ** -0.5
        assert abs(drawn.std().item() - 0.1 / 3 ** 0.5) < 0.002
    else:
        assert abs(drawn.std().item() - 0.02) < 0.001 and drawn.abs().max() > 0.06  # normal, not uniform
    vectors = model.embedding(torch.arange(n)).detach()
    if name == "adaptive":  # the shortlist rows are the head's; tail words are read through their projections
        shortlist = head.word_of_rank[: head.cutoffs[0]]
        torch.testing.assert_close(vectors[shortlist], head.head.weight[: head.cutoffs[0]].detach())
    else:
        rows = head.weight.detach() if name == "full" else in_word_order(head, head.weight.detach())
        torch.testing.assert_close(vectors, rows, rtol=0, atol=0)  # the embedding reads exactly the re-drawn rows


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


def _banded_reference(head, ids):
    """The tied embedding of a banded two-level head from explicit float64 copies: a band-0 word's own d entries, a
    band-i word's d_i entries times that band's projection (adaptive input); and the copies, to take gradients."""
    weights = [w.detach().clone().requires_grad_() for w in head.band_weights]
    projections = [p.weight.detach().clone().requires_grad_() for p in head.band_projections]
    bands = head.words.band_rows(head._layout)
    rows = []
    for word in ids.reshape(-1).tolist():
        band, slot = int(head.band_of_word[word]), int(head._layout.slot_of_word[word])
        vector = weights[band][int(bands.row_of_slot[slot])]
        rows.append(vector if band == 0 else vector @ projections[band - 1])
    return torch.stack(rows).reshape(*ids.shape, -1), weights, projections


@pytest.mark.parametrize("name", ["self_organized", "two_level_frequency"])
def test_a_banded_two_level_head_ties_through_its_bands_projections_exactly(name):
    """div_value tied: each word read back up to d through its band's projection, against a float64 reference,
    values and gradients (each band's weight's own)."""
    torch.manual_seed(0)
    n, d = 200, 16
    head = sohsm.build_head(name, d, n, counts=torch.arange(n, 0, -1), div_value=2, cutoffs=[10, 60]).double()
    model = LSTMLanguageModel(n, emb_size=d, hidden_size=d).double()
    model.tie_weights(head)
    assert all(0.09 < w.abs().max() <= 0.1 for w in head.band_weights)  # the LSTM's U(+-0.1)
    ids = torch.cat([torch.arange(n), torch.randint(0, n, (40,))]).reshape(8, -1)
    upstream = torch.randn(*ids.shape, d, dtype=torch.float64)
    embedded = model.embedding(ids)
    reference, weights, projections = _banded_reference(head, ids)
    torch.testing.assert_close(embedded, reference, rtol=1e-12, atol=1e-12)
    (embedded * upstream).sum().backward()
    (reference * upstream).sum().backward()
    for mine, theirs in zip(head.band_weights, weights):  # row-sparse where the head's backend writes its own
        torch.testing.assert_close(mine.grad.to_dense(), theirs.grad, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(head.band_projections, projections):
        torch.testing.assert_close(mine.weight.grad, theirs.grad, rtol=1e-12, atol=1e-12)


def test_a_tied_banded_self_organized_head_trains_and_its_embedding_follows_each_reclustering():
    """A tied LSTM with div_value trains (Adagrad), re-clusters, resumes from its state dict: the zeros outside each
    word reads the same input vector before and after its row moves."""
    torch.manual_seed(0)
    n, d = 120, 16
    head = sohsm.build_head("self_organized", d, n, counts=torch.arange(n, 0, -1), div_value=2, cutoffs=[10, 40],
                            update_every=2, n_clusters=8)
    model = LSTMLanguageModel(n, emb_size=d, hidden_size=d)
    model.tie_weights(head)
    optimizer = torch.optim.Adagrad([*model.parameters(), *head.parameters()], lr=0.1)
    head.attach(optimizer)
    data = torch.randint(0, n, (9, 4))
    before, moved = None, 0.0
    for _ in range(6):
        hidden, _ = model(data[:-1])
        loss = head(hidden.reshape(-1, d), data[1:].reshape(-1)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            before = model.embedding(torch.arange(n))
            head.q.copy_(-3.0 * torch.rand(head.q.shape, dtype=head.q.dtype))  # a q that moves words
        moved += float(head.reassign(optimizer)["change_rate"])
        with torch.no_grad():
            torch.testing.assert_close(model.embedding(torch.arange(n)), before, rtol=0, atol=0)
    assert torch.isfinite(loss) and moved > 0  # words did move
    clone = sohsm.build_head("self_organized", d, n, counts=torch.arange(n, 0, -1), div_value=2, cutoffs=[10, 40],
                             update_every=2, n_clusters=8)
    clone.load_state_dict(head.state_dict())
    torch.testing.assert_close(clone.embed(torch.arange(n)), before, rtol=0, atol=0)
