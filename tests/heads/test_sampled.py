"""Sampled heads (importance sampling, NCE, PMI-LM): the objectives against their formulas in float64,
exact normalised log-probabilities at evaluation, and noise that survives a checkpoint."""
from __future__ import annotations

import io
import math

import pytest
import torch

from sohsm.heads import ImportanceSamplingSoftmax, NCESoftmax, PMISoftmax, build_head
from sohsm.heads.sampled import noise_distribution

from .reference import importance_sampling_output, nce_output, negative_sampling_output

D, N, B, K = 6, 40, 12, 7
NAMES = ["importance_sampling", "nce", "pmi"]
OBJECTIVES = {"importance_sampling": "importance_sampling", "nce": "nce", "pmi": "negative_sampling"}


def _counts() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return (500.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()[torch.randperm(N, generator=g)]


def _batch(seed: int, batch: int = B, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, D, generator=g, dtype=dtype), torch.randint(0, N, (batch,), generator=g)


def make_head(name: str, seed: int = 0, **options):
    torch.manual_seed(seed)
    head = build_head(name, D, N, counts=_counts(), seed=seed, n_samples=K, **options).double()
    if getattr(head, "bias", None) is not None:
        with torch.no_grad():
            head.bias.add_(torch.randn(N, dtype=torch.float64) * 0.3)
    return head


def _reference(head, hidden, target, noise):
    weight = head.weight.detach().clone().requires_grad_(True)
    bias = head.bias.detach().clone().requires_grad_(True) if head.bias is not None else None
    log_q = noise_distribution(_counts(), N).log()
    if head.objective == "importance_sampling":
        output = importance_sampling_output(weight, bias, log_q, hidden, target, noise, head.remove_accidental_hits)
    elif head.objective == "nce":
        output = nce_output(weight, bias, log_q, hidden, target, noise)
    else:
        output = negative_sampling_output(weight, hidden, target, noise, -math.log(K) if head.shift else 0.0)
    return output, weight, bias


@pytest.mark.parametrize("options", [{}, {"bias": True}, {"remove_accidental_hits": False}],
                         ids=["plain", "bias", "hits"])
def test_importance_sampling_variants_match_formula(options):
    _check_objective_and_gradients("importance_sampling", options)


@pytest.mark.parametrize("name", ["nce", "pmi"])
def test_objective_and_gradients_match_formula(name):
    _check_objective_and_gradients(name, {})


def test_the_papers_unshifted_pmi_matches_formula():
    _check_objective_and_gradients("pmi", {"shift": False})


def _check_objective_and_gradients(name, options):
    head = make_head(name, seed=1, **options)
    hidden, target = _batch(1)
    noise = head.noise_samples()
    noise[0] = target[0]  # an accidental hit
    hidden.requires_grad_(True)
    output = head.sampled_output(hidden, target, noise)
    (-output.mean()).backward()
    h = hidden.detach().clone().requires_grad_(True)
    expected, weight, bias = _reference(head, h, target, noise)
    (-expected.mean()).backward()
    torch.testing.assert_close(output, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=0, atol=1e-12)
    if bias is not None:
        torch.testing.assert_close(head.bias.grad, bias.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_training_forward_uses_the_next_noise_samples(name):
    head = make_head(name, seed=2)
    hidden, target = _batch(2)
    state = head.generator.get_state()
    out = head(hidden, target)
    head.generator.set_state(state)
    noise = head.noise_samples()
    assert noise.shape == (K,)
    torch.testing.assert_close(out.output, head.sampled_output(hidden, target, noise), rtol=0, atol=0)
    torch.testing.assert_close(out.loss, -out.output.mean(), rtol=0, atol=0)
    assert head.objective == OBJECTIVES[name] and not head.loss_is_nll


@pytest.mark.parametrize("name", NAMES)
def test_eval_is_exact_and_normalised(name):
    head = make_head(name, seed=3).eval()
    assert head.loss_is_nll
    hidden, target = _batch(3)
    hidden = hidden * 3
    log_prob = head.log_prob(hidden)
    assert log_prob.shape == (B, N) and log_prob.logsumexp(1).abs().max() < 1e-12
    state = head.generator.get_state()
    out = head(hidden, target)
    assert torch.equal(head.generator.get_state(), state)  # evaluation draws no noise
    torch.testing.assert_close(out.output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.loss, -out.output.mean(), rtol=0, atol=0)
    # the papers' test-time estimates, written out
    scores = hidden @ head.weight.detach().t()
    if name == "pmi":  # p(w|c) ∝ exp(w.c) p(w)
        unnormalised = scores.exp() * noise_distribution(_counts(), N)
    else:
        unnormalised = (scores + (head.bias.detach() if head.bias is not None else 0.0)).exp()
    expected = (unnormalised / unnormalised.sum(1, keepdim=True)).log()
    torch.testing.assert_close(log_prob, expected, rtol=0, atol=1e-12)
    assert head.score_parts(hidden, target) is None


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("name", NAMES)
def test_topk_and_predict_equal_log_prob_topk(name, k):
    head = make_head(name, seed=4)
    hidden, _ = _batch(4, batch=32)
    ref_values, ref_indices = head.log_prob(hidden).topk(k, dim=1)
    values, indices = head.topk(hidden, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-12)
    assert torch.equal(indices, ref_indices)
    if k == 1:
        assert torch.equal(head.predict(hidden), ref_indices[:, 0])


@pytest.mark.parametrize("name", NAMES)
def test_generator_state_survives_a_state_dict_round_trip(name):
    head = make_head(name, seed=5)
    hidden, target = _batch(5)
    head(hidden, target)  # advance the generator
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    expected = [head.noise_samples() for _ in range(3)]
    restored = make_head(name, seed=99)
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert all(torch.equal(restored.noise_samples(), e) for e in expected)
    restored.load_state_dict(head.state_dict())  # the state after those draws
    assert torch.equal(restored.noise_samples(), head.noise_samples())


def test_samples_follow_the_noise_distribution_and_the_seed():
    counts = torch.tensor([600.0, 300.0, 100.0] + [0.0] * 7, dtype=torch.float64)
    head = NCESoftmax(D, 10, counts=counts, n_samples=20000, seed=1)
    samples = head.noise_samples()
    frequency = torch.bincount(samples, minlength=10).double() / samples.numel()
    torch.testing.assert_close(frequency, noise_distribution(counts, 10), rtol=0, atol=0.01)
    assert torch.equal(NCESoftmax(D, 10, counts=counts, n_samples=50, seed=1).noise_samples(), samples[:50])
    assert not torch.equal(NCESoftmax(D, 10, counts=counts, n_samples=50, seed=2).noise_samples(), samples[:50])
    assert noise_distribution(None, 4).tolist() == [0.25] * 4
    smoothed = noise_distribution(counts, 10, power=0.75)
    torch.testing.assert_close(smoothed, counts.clamp(min=1) ** 0.75 / (counts.clamp(min=1) ** 0.75).sum())


def test_nce_initialisation_and_pmi_has_no_bias():
    nce = NCESoftmax(D, N, counts=_counts(), bias_init="uniform")  # the papers' start
    assert torch.allclose(nce.bias.detach(), torch.full((N,), -math.log(N)))
    nce.reset_parameters()
    assert torch.allclose(nce.bias.detach(), torch.full((N,), -math.log(N)))
    unigram = NCESoftmax(D, N, counts=_counts())  # the default
    assert torch.allclose(unigram.bias.detach().double(), noise_distribution(_counts(), N).log())
    unigram.reset_parameters()
    assert torch.allclose(unigram.bias.detach().double(), noise_distribution(_counts(), N).log())
    with pytest.raises(ValueError, match="bias_init"):
        NCESoftmax(D, N, bias_init="zeros")
    assert PMISoftmax(D, N).bias is None
    assert ImportanceSamplingSoftmax(D, N).bias is None and ImportanceSamplingSoftmax(D, N, bias=True).bias is not None


@pytest.mark.parametrize("name", NAMES)
def test_sparse_gradient_equals_dense(name):
    dense, sparse = make_head(name, seed=6), make_head(name, seed=6, sparse=True)
    hidden, target = _batch(6)
    dense(hidden, target).loss.backward()
    sparse(hidden, target).loss.backward()
    assert sparse.weight.grad.is_sparse and not dense.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_training_step_on_a_learnable_task_lowers_the_exact_nll(name):
    """A few steps of the sampled objective make the exact evaluation NLL fall (each head learns)."""
    torch.manual_seed(7)
    head = build_head(name, 16, N, counts=_counts(), seed=7, n_samples=10)
    prototypes = torch.randn(N, 16, generator=torch.Generator().manual_seed(1))
    target = torch.arange(N)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.2)

    def exact_nll():
        head.eval()
        with torch.no_grad():
            value = float(head(prototypes, target).loss)
        head.train()
        return value

    before = exact_nll()
    for _ in range(100):
        optimizer.zero_grad()
        head(prototypes, target).loss.backward()
        optimizer.step()
    assert exact_nll() < before - 0.5


def test_bad_arguments():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n_samples must be a positive integer"):
            NCESoftmax(D, N, n_samples=bad)
    with pytest.raises(ValueError, match="noise_power"):
        PMISoftmax(D, N, noise_power=-1)
    with pytest.raises(ValueError, match=r"counts must have shape \[40\]"):
        ImportanceSamplingSoftmax(D, N, counts=torch.ones(3))
    with pytest.raises(ValueError, match="target values"):
        NCESoftmax(D, N)(torch.randn(2, D), torch.tensor([0, N]))


def _bigram_language(seed: int, n: int = 30):
    """A random peaked bigram language: transition matrix, stationary distribution, true perplexity."""
    g = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(torch.randn(n, n, generator=g) * 2.5, dim=1)
    stationary = torch.full((n,), 1.0 / n)
    for _ in range(200):
        stationary = stationary @ transitions
    entropy = -(stationary[:, None] * transitions * transitions.log()).sum()
    return transitions, stationary, math.exp(float(entropy)), g


@pytest.mark.parametrize("name, options", [(name, {}) for name in NAMES]
                         + [("pmi", {"shift": False}), ("nce", {"bias_init": "uniform"})],
                         ids=[*NAMES, "pmi-paper", "nce-paper"])
def test_converged_sampled_heads_reach_the_true_perplexity_of_a_bigram_language(name, options):
    """Trained to convergence, each sampled objective's exact test-time distribution is the right one.

    Over three seeds, each with its own language, a head fed the previous word's embedding reaches
    within 15% of the language's true perplexity (threshold fixed before running).
    """
    n, d = 30, 16
    for seed in (1, 2, 3):
        transitions, stationary, true_ppl, g = _bigram_language(seed, n)

        def sample(batch):
            prev = torch.multinomial(stationary, batch, replacement=True, generator=g)
            return prev, torch.multinomial(transitions[prev], 1, generator=g).squeeze(1)

        torch.manual_seed(seed)
        embedding = torch.nn.Embedding(n, d)
        head = build_head(name, d, n, counts=(stationary * 1e6).round(), seed=seed, n_samples=20, **options)
        optimizer = torch.optim.Adam([*embedding.parameters(), *head.parameters()], lr=0.02)
        for _ in range(800):
            prev, nxt = sample(256)
            optimizer.zero_grad()
            head(embedding(prev), nxt).loss.backward()
            optimizer.step()
        head.eval()
        prev, nxt = sample(20000)
        with torch.no_grad():
            nll = -head.log_prob(embedding(prev)).gather(1, nxt[:, None]).mean()
        assert math.exp(float(nll)) < 1.15 * true_ppl, (name, seed, math.exp(float(nll)), true_ppl)
