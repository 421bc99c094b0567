"""TwoLevelSoftmax against a dense float64 reference, and its layout, gradient buffer and search."""
from __future__ import annotations

import copy

import pytest
import torch
from tests.heads.reference import in_word_order, ref_params, slot_of_word, two_level_log_prob, two_level_parts
from torch import nn

from sohsm.clustering import frequency_binning
from sohsm.heads import FullSoftmax, TwoLevelSoftmax

D, N = 6, 60
C = 8  # ceil(sqrt(60))


def _counts(n: int = N) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    zipf = 1000.0 / torch.arange(1, n + 1, dtype=torch.float64)
    return zipf[torch.randperm(n, generator=g)].round()


def _explicit_assignment() -> torch.Tensor:
    """Uneven clusters: a singleton, a large one (6 clusters, none empty)."""
    g = torch.Generator().manual_seed(7)
    sizes = [1, 20, 9, 12, 8, 10]
    a = torch.cat([torch.full((s,), c, dtype=torch.long) for c, s in enumerate(sizes)])
    return a[torch.randperm(N, generator=g)]


def make_head(variant: str, projection: bool, seed: int = 0) -> TwoLevelSoftmax:
    torch.manual_seed(seed)
    if variant == "random":
        return TwoLevelSoftmax(D, N, assignment="random", projection=projection, seed=seed)
    if variant == "frequency":
        return TwoLevelSoftmax(D, N, assignment="frequency", counts=_counts(), projection=projection)
    if variant == "explicit":
        return TwoLevelSoftmax(D, N, assignment=_explicit_assignment(), projection=projection)
    raise AssertionError(variant)


VARIANTS = [(v, p) for v in ("random", "frequency", "explicit") for p in (True, False)]
IDS = [f"{v}-{'proj' if p else 'noproj'}" for v, p in VARIANTS]


def _batch(seed: int, batch: int = 40, dtype=torch.float64, n: int = N):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, D, generator=g, dtype=dtype)
    target = torch.randint(0, n, (batch,), generator=g)
    quarter = batch // 4
    target[:quarter] = target[quarter : 2 * quarter]  # repeated words
    return hidden, target


def _reference_grads(head, hidden, target, row_weights=None):
    """Gradients of ``-mean(output)`` (or ``-sum(row_weights * output)``) by the dense reference."""
    params = ref_params(head)
    h = hidden.detach().to(torch.float64).clone().requires_grad_(True)
    cluster_part, word_part = two_level_parts(params, h, target)
    output = cluster_part + word_part
    loss = -output.mean() if row_weights is None else -(output * row_weights).sum()
    loss.backward()
    grads = {"hidden": h.grad, "cluster_weight": params.cluster_weight.grad, "weight": params.word_weight.grad}
    if params.projection is not None:
        grads["projection"] = params.projection.grad
    return output.detach(), grads


def _assert_grads(head, hidden, expected, atol=1e-10):
    torch.testing.assert_close(hidden.grad, expected["hidden"], rtol=0, atol=atol)
    torch.testing.assert_close(head.cluster_weight.grad, expected["cluster_weight"], rtol=0, atol=atol)
    torch.testing.assert_close(in_word_order(head, head.weight.grad), expected["weight"], rtol=0, atol=atol)
    if "projection" in expected:
        torch.testing.assert_close(head.projection.weight.grad, expected["projection"], rtol=0, atol=atol)


# -- exactness against the dense reference ----------------------------------------


@pytest.mark.parametrize("variant, projection", VARIANTS, ids=IDS)
def test_loss_and_gradients_match_dense_reference(variant, projection):
    head = make_head(variant, projection).double()
    hidden, target = _batch(1)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()
    expected_output, expected = _reference_grads(head, hidden, target)
    assert out.output.dtype == torch.float64
    torch.testing.assert_close(out.output, expected_output, rtol=0, atol=1e-10)
    torch.testing.assert_close(out.loss, -expected_output.mean(), rtol=0, atol=1e-10)
    _assert_grads(head, hidden, expected)


@pytest.mark.parametrize("variant, projection", VARIANTS, ids=IDS)
def test_gradients_with_non_uniform_row_weights(variant, projection):
    """The upstream gradient differs per row (as after a weighted or masked loss)."""
    head = make_head(variant, projection, seed=3).double()
    hidden, target = _batch(2, batch=33)
    hidden.requires_grad_(True)
    row_weights = torch.rand(33, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    row_weights[::5] = 0.0
    (-(head(hidden, target).output * row_weights).sum()).backward()
    _, expected = _reference_grads(head, hidden, target, row_weights)
    _assert_grads(head, hidden, expected)


def test_float32_head_close_to_float64_reference():
    head = make_head("random", True)
    hidden, target = _batch(4, dtype=torch.float32)
    hidden.requires_grad_(True)
    head(hidden, target).loss.backward()
    expected_output, expected = _reference_grads(head, hidden, target)
    torch.testing.assert_close(head(hidden, target).output.double(), expected_output, rtol=0, atol=1e-5)
    _assert_grads(head, hidden, {k: v.float() for k, v in expected.items()}, atol=1e-5)


@pytest.mark.parametrize("variant, projection", VARIANTS, ids=IDS)
def test_log_prob_normalised_equals_reference_and_output(variant, projection):
    head = make_head(variant, projection, seed=5).double()
    hidden, target = _batch(5)
    hidden = hidden * 3
    log_prob = head.log_prob(hidden)
    assert log_prob.shape == (hidden.size(0), N)
    assert log_prob.logsumexp(1).abs().max() < 1e-5
    torch.testing.assert_close(log_prob, two_level_log_prob(ref_params(head), hidden).detach(), rtol=0, atol=1e-10)
    output = head(hidden, target).output
    torch.testing.assert_close(output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-10)


@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch"])
def test_a_cluster_bias_matches_the_dense_reference(backend):
    """``cluster_bias=True``: ``P(c | h) = softmax(U^C h + b)`` in the loss, its gradients (the bias's too),
    ``log_prob``, top-k and sampling, on both CPU backends."""
    torch.manual_seed(11)
    head = TwoLevelSoftmax(D, N, assignment=_explicit_assignment(), cluster_bias=True, backend=backend).double()
    assert head.cluster_bias.shape == (6,) and torch.equal(head.cluster_bias, torch.zeros(6, dtype=torch.float64))
    with torch.no_grad():
        head.cluster_bias.copy_(torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2)
    hidden, target = _batch(6)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()
    params = ref_params(head)
    h = hidden.detach().clone().requires_grad_(True)
    expected = sum(two_level_parts(params, h, target))
    (-expected.mean()).backward()
    torch.testing.assert_close(out.output, expected.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(head.cluster_bias.grad, params.cluster_bias.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(head.cluster_weight.grad, params.cluster_weight.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-10)
    with torch.no_grad():
        log_prob = head.log_prob(hidden)
        torch.testing.assert_close(log_prob, two_level_log_prob(params, hidden), rtol=0, atol=1e-10)
        values, indices = head.topk(hidden, 5)
        torch.testing.assert_close(values, log_prob.topk(5).values, rtol=0, atol=1e-10)
        head.cluster_bias[2] = 1e4  # every draw from cluster 2, which the bias alone makes certain
        drawn = head.sample(hidden.detach(), generator=torch.Generator().manual_seed(0))
    assert bool((head.assignment[drawn] == 2).all())


def test_a_cluster_bias_must_be_a_bool():
    with pytest.raises(ValueError, match="cluster_bias must be True or False"):
        TwoLevelSoftmax(D, N, cluster_bias=1)


def test_log_prob_normalised_in_float32_with_large_logits():
    head = make_head("random", False)
    with torch.no_grad():
        head.weight.mul_(30)
        head.cluster_weight.mul_(30)
    hidden, _ = _batch(6, dtype=torch.float32)
    log_prob = head.log_prob(hidden)
    assert torch.isfinite(log_prob).all()
    assert log_prob.logsumexp(1).abs().max() < 1e-5


@pytest.mark.parametrize("variant, projection", VARIANTS, ids=IDS)
def test_score_parts_factor_the_probability(variant, projection):
    head = make_head(variant, projection, seed=6).double()
    hidden, target = _batch(7)
    parts = head.score_parts(hidden, target)
    output = head(hidden, target).output
    torch.testing.assert_close(parts.cluster + parts.in_cluster, output, rtol=0, atol=1e-12)
    ref_cluster, ref_word = two_level_parts(ref_params(head), hidden, target)
    torch.testing.assert_close(parts.cluster, ref_cluster.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(parts.in_cluster, ref_word.detach(), rtol=0, atol=1e-10)
    assert (parts.cluster <= 0).all() and (parts.in_cluster <= 1e-12).all()
    # Eq. 5-6: ppl = ppl_cluster * ppl_in-cluster
    ppl = torch.exp(-output.mean())
    ppl_cluster = torch.exp(-parts.cluster.mean())
    ppl_in_cluster = torch.exp(-parts.in_cluster.mean())
    torch.testing.assert_close(ppl, ppl_cluster * ppl_in_cluster, rtol=1e-10, atol=0)
    assert ppl_cluster > 1 and ppl_in_cluster > 1


# -- top-k --------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("variant, projection", VARIANTS, ids=IDS)
def test_topk_matches_log_prob_topk_tie_robust(variant, projection, k):
    """ReLU projections can zero a row's h_w, tying a cluster's words: compare values, not ids."""
    head = make_head(variant, projection, seed=8)
    hidden, _ = _batch(8, batch=50, dtype=torch.float32)
    hidden[0] = -hidden[0].abs()  # with a projection, some rows get many exact zeros
    hidden[1] = 0.0  # every cluster equally likely, every cluster's words tied
    log_prob = head.log_prob(hidden)
    ref_values = log_prob.topk(k, dim=1).values
    result = head.search_topk(hidden, k)
    values, indices = head.topk(hidden, k)
    assert torch.equal(values, result.values) and torch.equal(indices, result.indices)
    assert values.shape == indices.shape == (50, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_prob.gather(1, indices), values, rtol=0, atol=1e-5)
    assert (values[:, :-1] >= values[:, 1:] - 1e-6).all()  # best first
    assert all(len(set(row)) == k for row in indices.tolist())  # distinct words
    assert ((result.clusters_visited >= 1) & (result.clusters_visited <= head.n_clusters)).all()
    predicted = head.predict(hidden)
    torch.testing.assert_close(log_prob.gather(1, predicted[:, None]).squeeze(1), ref_values[:, 0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 5])
def test_topk_indices_exact_when_no_ties(k):
    head = make_head("frequency", False, seed=9).double()
    hidden, _ = _batch(9, batch=64)
    ref_values, ref_indices = head.log_prob(hidden).topk(k, dim=1)
    values, indices = head.topk(hidden, k)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-12)
    if k == 1:
        assert torch.equal(head.predict(hidden), ref_indices[:, 0])


def test_search_visits_few_clusters_when_cluster_distribution_is_peaked():
    head = make_head("random", False, seed=10)
    hidden, _ = _batch(10, batch=64, dtype=torch.float32)
    flat = head.search_topk(hidden, 1)
    with torch.no_grad():
        head.cluster_weight.mul_(40.0)
    peaked = head.search_topk(hidden, 1)
    assert ((peaked.clusters_visited >= 1) & (peaked.clusters_visited <= C)).all()
    assert peaked.clusters_visited.double().mean() < 2.0 < C
    assert peaked.clusters_visited.double().mean() < flat.clusters_visited.double().mean()
    ref_values, ref_indices = head.log_prob(hidden).topk(1, dim=1)
    torch.testing.assert_close(peaked.values, ref_values, rtol=0, atol=1e-5)


def test_search_visits_fewer_clusters_after_brief_training():
    """Contexts that each predict words of one cluster: a few Adam steps make P(c|h) peaked."""
    torch.manual_seed(11)
    head = TwoLevelSoftmax(D, N, assignment="random", projection=True, seed=11)
    contexts = torch.randn(C, D)
    assert head.search_topk(contexts, 3).clusters_visited.double().mean() > C / 2  # untrained: flat
    assignment = head.assignment
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(11)
    for _ in range(40):
        target = torch.randint(0, N, (64,), generator=g)
        ctx = assignment[target]  # context c predicts the words of cluster c
        optimizer.zero_grad()
        head(contexts[ctx], target).loss.backward()
        optimizer.step()
    result = head.search_topk(contexts, 3)
    assert ((result.clusters_visited >= 1) & (result.clusters_visited <= C)).all()
    assert result.clusters_visited.double().mean() < C / 2
    torch.testing.assert_close(result.values, head.log_prob(contexts).topk(3, dim=1).values, rtol=0, atol=1e-5)


# -- empty clusters (a self-organized head's re-assignment can empty clusters) ---------------


def _head_with_an_empty_cluster_ranked_first():
    """Explicit clusters 0-5 plus an empty cluster 6 whose P(c|h) is the highest for every row."""
    torch.manual_seed(12)
    head = TwoLevelSoftmax(D, N, assignment=_explicit_assignment(), n_clusters=7, projection=False)
    assert head.cluster_sizes()[6] == 0 and head.clusters()[6].numel() == 0
    hidden, target = _batch(12, batch=16, dtype=torch.float32)
    with torch.no_grad():
        direction = torch.randn(D)
        head.cluster_weight[6] = 2.0 * direction / direction.norm()
        hidden = 0.3 * hidden + 3.0 * direction / direction.norm()
    cluster_logits = hidden @ head.cluster_weight.detach().t()
    assert (cluster_logits.argmax(1) == 6).all()
    return head, hidden, target


def test_empty_cluster_log_prob_is_normalised():
    """A cluster without words can emit no word: the vocabulary's probabilities must still sum to one."""
    head, hidden, target = _head_with_an_empty_cluster_ranked_first()
    log_prob = head.log_prob(hidden)
    assert torch.isfinite(log_prob).all()
    assert log_prob.logsumexp(1).abs().max() < 1e-5
    output = head(hidden, target).output
    torch.testing.assert_close(output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_empty_cluster_search_topk_is_exact(k):
    """The search must skip an empty cluster, not score it (which gives NaN values and wrong ids)."""
    head, hidden, _ = _head_with_an_empty_cluster_ranked_first()
    log_prob = head.log_prob(hidden)
    result = head.search_topk(hidden, k)
    assert not torch.isnan(result.values).any()
    torch.testing.assert_close(result.values, log_prob.topk(k, dim=1).values, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_prob.gather(1, result.indices), result.values, rtol=0, atol=1e-5)
    assert torch.equal(head.predict(hidden), log_prob.argmax(1))


# -- structural properties -------------------------------------------------------------


def test_one_cluster_without_projection_is_the_full_softmax():
    torch.manual_seed(13)
    head = TwoLevelSoftmax(D, N, n_clusters=1, projection=False).double()
    full = FullSoftmax(D, N).double()
    with torch.no_grad():
        full.weight.copy_(head.word_vectors())
    hidden, target = _batch(13)
    h1 = hidden.clone().requires_grad_(True)
    h2 = hidden.clone().requires_grad_(True)
    out1, out2 = head(h1, target), full(h2, target)
    torch.testing.assert_close(out1.output, out2.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.log_prob(hidden), full.log_prob(hidden), rtol=0, atol=1e-12)
    out1.loss.backward()
    out2.loss.backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(in_word_order(head, head.weight.grad), full.weight.grad, rtol=0, atol=1e-12)
    assert head.cluster_weight.grad.abs().max() < 1e-12  # one cluster: log P(c|h) = 0
    v1, i1 = head.topk(hidden, 5)
    v2, i2 = full.topk(hidden, 5)
    assert torch.equal(i1, i2)
    torch.testing.assert_close(v1, v2, rtol=0, atol=1e-12)


@pytest.mark.parametrize("projection", [True, False])
def test_permuting_cluster_ids_changes_nothing(projection):
    base = make_head("explicit", projection, seed=14).double()
    perm = torch.tensor([3, 0, 5, 1, 4, 2])  # cluster c -> perm[c]
    other = TwoLevelSoftmax(D, N, assignment=perm[base.assignment], projection=projection).double()
    with torch.no_grad():
        other.cluster_weight[perm] = base.cluster_weight
        vectors = base.word_vectors()
        other.weight.copy_(vectors[torch.cat(other.clusters())])
        if projection:
            other.projection.weight.copy_(base.projection.weight)
    assert torch.equal(other.word_vectors(), base.word_vectors())
    assert not torch.equal(other.weight, base.weight)  # a different storage layout

    hidden, target = _batch(14)
    h1, h2 = hidden.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
    out1, out2 = base(h1, target), other(h2, target)
    torch.testing.assert_close(out1.output, out2.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(base.log_prob(hidden), other.log_prob(hidden), rtol=0, atol=1e-12)
    v1, i1 = base.topk(hidden, 5)
    v2, i2 = other.topk(hidden, 5)
    torch.testing.assert_close(v1, v2, rtol=0, atol=1e-12)
    assert torch.equal(i1, i2)
    out1.loss.backward()
    out2.loss.backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(other.cluster_weight.grad[perm], base.cluster_weight.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(in_word_order(other, other.weight.grad), in_word_order(base, base.weight.grad),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant, projection", [("random", True), ("explicit", False)])
def test_batch_loss_equals_sum_of_single_row_losses(variant, projection):
    head = make_head(variant, projection, seed=15).double()
    hidden, target = _batch(15, batch=12)
    out = head(hidden, target)
    singles = torch.stack([head(hidden[i : i + 1], target[i : i + 1]).loss for i in range(12)])
    torch.testing.assert_close(out.loss * 12, singles.sum(), rtol=0, atol=1e-12)
    torch.testing.assert_close(-out.output, singles, rtol=0, atol=1e-12)


def test_star_hidden_is_flattened():
    head = make_head("random", True, seed=16).double()
    hidden, target = _batch(16, batch=24)
    flat = head(hidden, target)
    shaped = head(hidden.reshape(2, 3, 4, D), target.reshape(2, 3, 4))
    assert shaped.output.shape == (24,)
    torch.testing.assert_close(shaped.output, flat.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.log_prob(hidden.reshape(4, 6, D)), head.log_prob(hidden), rtol=0, atol=1e-12)
    parts = head.score_parts(hidden.reshape(4, 6, D), target.reshape(4, 6))
    torch.testing.assert_close(parts.cluster + parts.in_cluster, flat.output, rtol=0, atol=1e-12)
    assert torch.equal(head.topk(hidden.reshape(6, 4, D), 2)[1], head.topk(hidden, 2)[1])


def test_clusters_partition_the_vocabulary():
    for variant in ("random", "frequency", "explicit"):
        head = make_head(variant, True)
        clusters = head.clusters()
        assert len(clusters) == head.n_clusters
        words = torch.cat(clusters)
        assert torch.equal(words.sort().values, torch.arange(N))
        for c, members in enumerate(clusters):
            assert (head.assignment[members] == c).all()
            assert torch.equal(members, members.sort().values)
        assert torch.equal(head.cluster_sizes(), torch.tensor([len(m) for m in clusters]))


def test_default_assignments():
    random_head = TwoLevelSoftmax(D, N, seed=3)
    assert random_head.n_clusters == C
    sizes = random_head.cluster_sizes()
    assert sizes.max() - sizes.min() <= 1
    assert torch.equal(TwoLevelSoftmax(D, N, seed=3).assignment, random_head.assignment)
    assert not torch.equal(TwoLevelSoftmax(D, N, seed=4).assignment, random_head.assignment)
    freq_head = TwoLevelSoftmax(D, N, assignment="frequency", counts=_counts())
    assert torch.equal(freq_head.assignment, frequency_binning(_counts(), C))
    explicit = _explicit_assignment()
    assert TwoLevelSoftmax(D, N, assignment=explicit).n_clusters == 6
    assert TwoLevelSoftmax(D, N, assignment=explicit, n_clusters=9).n_clusters == 9


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "hidden_shape, target, match",
    [
        ((4, D), torch.tensor([0, 1, N, 2]), "target values"),
        ((4, D), torch.tensor([0, -1, 3, 2]), "target values"),
        ((4, D - 1), torch.tensor([0, 1, 2, 3]), "hidden must have shape"),
        ((5, D), torch.tensor([0, 1, 2, 3]), "same number of rows"),
        ((4, D), torch.tensor([0, 1, 2, 3], dtype=torch.int32), "long"),
        ((4, D), torch.tensor([0.0, 1.0, 2.0, 3.0]), "long"),
    ],
)
def test_bad_forward_input_raises_value_error(hidden_shape, target, match):
    head = make_head("random", True)
    with pytest.raises(ValueError, match=match):
        head(torch.randn(*hidden_shape), target)
    with pytest.raises(ValueError, match=match):
        head.score_parts(torch.randn(*hidden_shape), target)


@pytest.mark.parametrize("k", [0, N + 1, -2])
def test_bad_k_raises_value_error(k):
    head = make_head("random", True)
    with pytest.raises(ValueError, match="k must be"):
        head.topk(torch.randn(3, D), k)
    with pytest.raises(ValueError, match="k must be"):
        head.search_topk(torch.randn(3, D), k)


def test_bad_hidden_in_evaluation_methods():
    head = make_head("random", True)
    for call in (head.log_prob, head.predict, lambda h: head.search_topk(h, 2)):
        with pytest.raises(ValueError, match="hidden must have shape"):
            call(torch.randn(3, D + 1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(assignment="kmeans"), "assignment must be"),
        (dict(assignment="frequency"), "counts"),
        (dict(assignment="random", n_clusters=0), "n_clusters"),
        (dict(assignment="random", n_clusters=N + 1), "n_clusters"),
        (dict(assignment=torch.zeros(N - 1, dtype=torch.long)), r"shape \[60\]"),
        (dict(assignment=torch.full((N,), 3, dtype=torch.long), n_clusters=3), "values must be in"),
        (dict(assignment=-torch.ones(N, dtype=torch.long)), "values must be in"),
        (dict(assignment=torch.zeros(N)), "integer"),
        (dict(assignment="frequency", counts=-torch.ones(N)), "non-negative"),
    ],
)
def test_bad_constructor_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoLevelSoftmax(D, N, **kwargs)


def test_bad_assignment_in_set_assignment():
    head = make_head("random", True)
    with pytest.raises(ValueError, match="values must be in"):
        head.set_assignment(torch.full((N,), C, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        head.set_assignment(torch.zeros(N + 1, dtype=torch.long))


# -- the gradient buffer the head writes itself ----------------------------------------


def _two_batches():
    """Batch A hits only clusters {0, 1, 2}, batch B only {4, 5} of the explicit head."""
    a = _explicit_assignment()
    g = torch.Generator().manual_seed(17)
    words_a = (a <= 2).nonzero().flatten()
    words_b = ((a == 4) | (a == 5)).nonzero().flatten()
    batch_a = (torch.randn(20, D, generator=g, dtype=torch.float64),
               words_a[torch.randint(0, len(words_a), (20,), generator=g)])
    batch_b = (torch.randn(14, D, generator=g, dtype=torch.float64),
               words_b[torch.randint(0, len(words_b), (14,), generator=g)])
    return batch_a, batch_b


def _backward(head, batch):
    hidden, target = batch
    head(hidden, target).loss.backward()
    return _reference_grads(head, hidden, target)[1]


def _check_grad(head, expected: dict):
    torch.testing.assert_close(head.cluster_weight.grad, expected["cluster_weight"], rtol=0, atol=1e-10)
    torch.testing.assert_close(in_word_order(head, head.weight.grad), expected["weight"], rtol=0, atol=1e-10)
    if "projection" in expected:
        torch.testing.assert_close(head.projection.weight.grad, expected["projection"], rtol=0, atol=1e-10)


def _sum(g1: dict, g2: dict) -> dict:
    return {k: g1[k] + g2[k] for k in g1 if k != "hidden"}


@pytest.mark.parametrize("projection", [True, False])
def test_gradients_accumulate_over_two_backward_calls(projection):
    head = make_head("explicit", projection, seed=18).double()
    batch_a, batch_b = _two_batches()
    grads_a = _backward(head, batch_a)
    _check_grad(head, grads_a)
    grads_b = _backward(head, batch_b)  # no zero_grad in between
    _check_grad(head, _sum(grads_a, grads_b))
    grads_a2 = _backward(head, batch_a)
    _check_grad(head, _sum(_sum(grads_a, grads_b), grads_a2))


@pytest.mark.parametrize("projection", [True, False])
def test_gradients_after_zero_grad_in_both_modes_and_changing_clusters(projection):
    head = make_head("explicit", projection, seed=19).double()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    batch_a, batch_b = _two_batches()
    slots = slot_of_word(head)
    rows_a = slots[(head.assignment <= 2).nonzero().flatten()]

    _check_grad(head, _backward(head, batch_a))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert head.weight.grad is None
    grads_b = _backward(head, batch_b)
    _check_grad(head, grads_b)  # rows of clusters 0-2, written by batch A, must be zero now
    assert head.weight.grad[rows_a].abs().max() == 0

    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _check_grad(head, _backward(head, batch_a))
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    assert head.weight.grad is not None and head.weight.grad.abs().max() == 0
    grads_b = _backward(head, batch_b)
    _check_grad(head, grads_b)
    grads_a = _backward(head, batch_a)  # accumulate on top of the zeroed buffer
    _check_grad(head, _sum(grads_b, grads_a))

    optimizer.zero_grad(set_to_none=True)
    _check_grad(head, _backward(head, batch_b))
    optimizer.zero_grad(set_to_none=False)
    optimizer.zero_grad(set_to_none=True)
    _check_grad(head, _backward(head, batch_a))
    optimizer.zero_grad(set_to_none=True)
    _check_grad(head, _backward(head, batch_b))


def test_gradient_follows_the_words_when_they_move():
    """A pending gradient is re-laid out with the rows; accumulation afterwards stays exact."""
    head = make_head("explicit", True, seed=20).double()
    batch_a, batch_b = _two_batches()
    grads_a = _backward(head, batch_a)
    vectors = head.word_vectors()
    new = head.assignment.clone()
    new[:10] = (new[:10] + 1) % 6
    moved = head.set_assignment(new)
    assert moved.sum() == 10 and torch.equal(moved, new != _explicit_assignment())
    assert torch.equal(head.assignment, new)
    assert torch.equal(head.word_vectors(), vectors)
    torch.testing.assert_close(in_word_order(head, head.weight.grad), grads_a["weight"], rtol=0, atol=1e-10)
    grads_b = _backward(head, batch_b)  # computed with the new clusters
    _check_grad(head, _sum(grads_a, grads_b))
    head.zero_grad(set_to_none=True)
    _check_grad(head, _backward(head, batch_a))


def test_set_assignment_moves_optimizer_state_given_explicitly():
    head = make_head("explicit", False, seed=21).double()
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    batch_a, batch_b = _two_batches()
    for batch in (batch_a, batch_b):
        optimizer.zero_grad()
        head(*batch).loss.backward()
        optimizer.step()
    state = optimizer.state[head.weight]
    before = {k: in_word_order(head, state[k]).clone() for k in ("exp_avg", "exp_avg_sq")}
    new = torch.roll(head.assignment, 7)
    head.set_assignment(new, optimizer)
    for k, v in before.items():
        assert torch.equal(in_word_order(head, state[k]), v)


def test_unchanged_assignment_changes_nothing():
    head = make_head("random", True, seed=22)
    hidden, target = _batch(22, dtype=torch.float32)
    head(hidden, target).loss.backward()
    weight, grad = head.weight.detach().clone(), head.weight.grad.clone()
    loss = head(hidden, target).loss
    moved = head.set_assignment(head.assignment.clone())
    assert moved.dtype == torch.bool and not moved.any()
    assert torch.equal(head.weight, weight) and torch.equal(head.weight.grad, grad)
    assert torch.equal(head(hidden, target).loss, loss)


# -- persistence and conversions ----------------------------------------------------------


def test_state_dict_carries_the_assignment():
    head = make_head("random", True, seed=23)
    with torch.no_grad():
        new = torch.roll(head.assignment, 3)
        head.set_assignment(new)
    fresh = TwoLevelSoftmax(D, N, assignment="random", projection=True, seed=99)
    assert not torch.equal(fresh.assignment, head.assignment)
    fresh.load_state_dict(head.state_dict())
    assert torch.equal(fresh.assignment, head.assignment)
    assert all(torch.equal(a, b) for a, b in zip(fresh.clusters(), head.clusters()))
    assert torch.equal(fresh.word_vectors(), head.word_vectors())
    hidden, target = _batch(23, dtype=torch.float32)
    assert torch.equal(fresh(hidden, target).output, head(hidden, target).output)
    assert torch.equal(fresh.log_prob(hidden), head.log_prob(hidden))
    assert torch.equal(fresh.topk(hidden, 5)[1], head.topk(hidden, 5)[1])
    # the loaded head trains correctly (its layout was rebuilt)
    fresh = fresh.double()
    hidden = hidden.double().requires_grad_(True)
    fresh(hidden, target).loss.backward()
    _assert_grads(fresh, hidden, _reference_grads(fresh, hidden, target)[1])


@pytest.mark.parametrize("convert", ["double", "to_dtype", "container"])
def test_dtype_conversion_keeps_everything_working(convert):
    head = make_head("explicit", True, seed=24)
    hidden32, target = _batch(24, dtype=torch.float32)
    head(hidden32, target).loss.backward()  # a float32 gradient buffer exists before converting
    head.zero_grad(set_to_none=True)
    if convert == "double":
        head = head.double()
    elif convert == "to_dtype":
        head = head.to(torch.float64)
    else:
        model = nn.ModuleDict({"head": head}).double()
        head = model["head"]
    assert head.weight.dtype == head.cluster_weight.dtype == torch.float64
    hidden, target = _batch(25)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()
    assert head.weight.grad.dtype == torch.float64
    expected_output, expected = _reference_grads(head, hidden, target)
    torch.testing.assert_close(out.output, expected_output, rtol=0, atol=1e-10)
    _assert_grads(head, hidden, expected)
    torch.testing.assert_close(head.log_prob(hidden).detach(), two_level_log_prob(ref_params(head), hidden).detach(),
                               rtol=0, atol=1e-10)
    # and back
    head = head.float()
    head.zero_grad(set_to_none=True)
    head(hidden32, target[: hidden32.size(0)]).loss.backward()
    assert head.weight.grad.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_moving_to_cuda_rebuilds_the_layout():
    head = make_head("explicit", True, seed=26)
    gpu = copy.deepcopy(head).to("cuda")
    assert gpu.assignment.device.type == "cuda" and gpu.word_vectors().device.type == "cuda"
    hidden, target = _batch(26, dtype=torch.float32)
    out_cpu = head(hidden, target)
    out_gpu = gpu(hidden.cuda(), target.cuda())
    torch.testing.assert_close(out_gpu.output.cpu(), out_cpu.output, rtol=0, atol=1e-4)
    out_cpu.loss.backward()
    out_gpu.loss.backward()
    torch.testing.assert_close(gpu.weight.grad.cpu(), head.weight.grad, rtol=0, atol=1e-4)
    log_prob = gpu.log_prob(hidden.cuda())
    values, indices = gpu.topk(hidden.cuda(), 5)
    torch.testing.assert_close(values, log_prob.topk(5, dim=1).values, rtol=0, atol=1e-4)
    moved = gpu.set_assignment(torch.roll(gpu.assignment, 1))
    assert moved.any()
    assert torch.equal(gpu.word_vectors().cpu(), head.word_vectors())


# -- word_dim: in-cluster scores in fewer dimensions --------------------------------------------------
@pytest.mark.parametrize("variant", ["random", "explicit"])
def test_word_dim_matches_a_dense_reference(variant):
    torch.manual_seed(4)
    assignment = "random" if variant == "random" else _explicit_assignment()
    head = TwoLevelSoftmax(D, N, assignment=assignment, word_dim=3).double()
    assert head.weight.shape == (N, 3) and head.word_projection.weight.shape == (3, D)
    hidden, target = _batch(5)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()
    # the reference, from the equations: cluster softmax on h, word softmax on P h inside the target's cluster
    leaf = lambda t: t.detach().clone().requires_grad_(True)  # noqa: E731
    h, cluster_w, word_w, proj = leaf(hidden), leaf(head.cluster_weight), leaf(head.word_vectors()), \
        leaf(head.word_projection.weight)
    assignment = head.assignment
    cluster_part = torch.log_softmax(h @ cluster_w.t(), dim=1).gather(1, assignment[target][:, None]).squeeze(1)
    logits = (h @ proj.t()) @ word_w.t()  # [B, N]
    same = assignment[None, :] == assignment[target][:, None]
    word_part = torch.log_softmax(logits.masked_fill(~same, float("-inf")), dim=1).gather(1, target[:, None]).squeeze(1)
    expected = cluster_part + word_part
    (-expected.mean()).backward()
    torch.testing.assert_close(out.output, expected.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(head.cluster_weight.grad, cluster_w.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(head.word_projection.weight.grad, proj.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(in_word_order(head, head.weight.grad), word_w.grad, rtol=0, atol=1e-10)
    log_probs = head.log_prob(hidden.detach())
    torch.testing.assert_close(log_probs.exp().sum(1), torch.ones(hidden.size(0), dtype=torch.float64))
    torch.testing.assert_close(head.topk(hidden.detach(), 4)[0], log_probs.topk(4).values, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    ({"word_dim": 0}, "word_dim must be an integer"),
    ({"word_dim": D + 1}, "word_dim must be an integer"),
    ({"word_dim": 2.5}, "word_dim must be an integer"),
    ({"word_dim": 3, "projection": True}, "cannot be combined"),
])
def test_bad_word_dim_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoLevelSoftmax(D, N, **kwargs)
