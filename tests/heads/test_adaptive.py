"""AdaptiveSoftmax: torch's module behind the head interface, against the adaptive softmax's equations."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sohsm.heads import AdaptiveSoftmax, build_head
from sohsm.heads.adaptive import default_cutoffs

from .reference import adaptive_input_matrix, adaptive_log_prob

D, N, B = 16, 60, 40
CUTOFFS = [5, 20]


def _counts() -> torch.Tensor:
    """Zipf counts in a shuffled id order, so frequency ranks differ from word ids."""
    g = torch.Generator().manual_seed(11)
    zipf = (1000.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()
    return zipf[torch.randperm(N, generator=g)]


def _batch(seed: int, batch: int = B, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, D, generator=g, dtype=dtype), torch.randint(0, N, (batch,), generator=g)


def _head(seed: int = 0, head_bias: bool = False, counts=True) -> AdaptiveSoftmax:
    torch.manual_seed(seed)
    head = AdaptiveSoftmax(D, N, cutoffs=CUTOFFS, div_value=2.0, head_bias=head_bias,
                           counts=_counts() if counts else None).double()
    if head_bias:
        with torch.no_grad():
            head.head.bias.normal_()
    return head


def _leaves(head: AdaptiveSoftmax):
    def leaf(t):
        return t.detach().clone().requires_grad_(True)

    head_weight = leaf(head.head.weight)
    head_bias = leaf(head.head.bias) if head.head.bias is not None else None
    tails = [(leaf(p.weight), leaf(o.weight)) for p, o in head.tail]
    return head_weight, head_bias, tails


def test_default_cutoffs_scale_the_text8_setting():
    assert default_cutoffs(44000) == [2000, 10000]
    assert default_cutoffs(300000) == [13636, 68182]
    assert default_cutoffs(2) == [1]
    for n in (2, 3, 10, 25, 1000):
        cutoffs = default_cutoffs(n)
        assert cutoffs == sorted(set(cutoffs)) and 1 <= cutoffs[0] and cutoffs[-1] <= n - 1
        AdaptiveSoftmax(64, n)  # torch accepts them


@pytest.mark.parametrize("head_bias", [False, True])
def test_loss_and_gradients_match_dense_float64_reference(head_bias):
    head = _head(1, head_bias)
    hidden, target = _batch(1)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()

    head_weight, bias, tails = _leaves(head)
    h = hidden.detach().clone().requires_grad_(True)
    log_prob = adaptive_log_prob(head_weight, bias, tails, CUTOFFS, head.word_of_rank, h)
    expected = log_prob.gather(1, target[:, None]).squeeze(1)
    (-expected.mean()).backward()

    assert out.output.dtype == torch.float64
    torch.testing.assert_close(out.output, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.loss, -expected.mean().detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.head.weight.grad, head_weight.grad, rtol=0, atol=1e-12)
    if head_bias:
        torch.testing.assert_close(head.head.bias.grad, bias.grad, rtol=0, atol=1e-12)
    for (p, o), (p_ref, o_ref) in zip(head.tail, tails):
        torch.testing.assert_close(p.weight.grad, p_ref.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(o.weight.grad, o_ref.grad, rtol=0, atol=1e-12)


def test_log_prob_normalised_equals_reference_and_output():
    head = _head(2)
    hidden, target = _batch(2)
    hidden = hidden * 3
    log_prob = head.log_prob(hidden)
    assert log_prob.shape == (B, N)
    assert log_prob.logsumexp(1).abs().max() < 1e-12
    expected = adaptive_log_prob(*_leaves(head), CUTOFFS, head.word_of_rank, hidden)
    torch.testing.assert_close(log_prob, expected.detach(), rtol=0, atol=1e-12)
    output = head(hidden, target).output
    torch.testing.assert_close(output, log_prob.gather(1, target[:, None]).squeeze(1), rtol=0, atol=1e-12)
    assert head.score_parts(hidden, target) is None


@pytest.mark.parametrize("k", [1, 5])
def test_topk_and_predict_equal_log_prob_topk(k):
    head = _head(3)
    hidden, _ = _batch(3, batch=64)
    hidden = hidden * 3  # rows whose best word is in the shortlist and rows whose best is in a tail
    ref_values, ref_indices = head.log_prob(hidden).topk(k, dim=1)
    values, indices = head.topk(hidden, k)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=1e-12)
    assert torch.equal(indices, ref_indices)
    if k == 1:
        predicted = head.predict(hidden)
        assert torch.equal(predicted, ref_indices[:, 0])
        ranks = head.rank_of_word[predicted]
        assert (ranks < CUTOFFS[0]).any() and (ranks >= CUTOFFS[0]).any()  # both of torch's predict paths ran


def test_same_as_torch_module_on_frequency_ranks():
    """With counts the head is torch's module on ranks; without, ids are the ranks."""
    head = _head(4)
    hidden, target = _batch(4)
    torch_module = nn.AdaptiveLogSoftmaxWithLoss(D, N, CUTOFFS, div_value=2.0).double()
    torch_module.load_state_dict({k: v for k, v in head.state_dict().items() if "rank" not in k})  # counts' order
    expected = torch_module(hidden, head.rank_of_word[target])
    out = head(hidden, target)
    torch.testing.assert_close(out.output, expected.output, rtol=0, atol=0)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
    plain = _head(4, counts=False)
    assert torch.equal(plain.word_of_rank, torch.arange(N))
    torch.testing.assert_close(plain.log_prob(hidden), torch_module.log_prob(hidden), rtol=0, atol=0)
    # frequent words are in the shortlist
    counts = _counts()
    assert counts[head.word_of_rank[: CUTOFFS[0]]].min() >= counts[head.word_of_rank[CUTOFFS[0]:]].max()


def test_state_dict_round_trip_and_star_hidden():
    head = _head(5)
    other = AdaptiveSoftmax(D, N, cutoffs=CUTOFFS, div_value=2.0).double()  # id order, other weights
    other.load_state_dict(head.state_dict())
    hidden, target = _batch(5, batch=12)
    torch.testing.assert_close(other.log_prob(hidden), head.log_prob(hidden), rtol=0, atol=0)
    out_3d = head(hidden.reshape(3, 4, D), target.reshape(3, 4))
    torch.testing.assert_close(out_3d.output, head(hidden, target).output, rtol=0, atol=0)


@pytest.mark.parametrize("cutoffs", [[], [0, 10], [10, 5], [10, 10], [5, N], [2.5], [True]])
def test_bad_cutoffs_name_the_value(cutoffs):
    with pytest.raises(ValueError, match=r"cutoffs must be increasing integers in \[1, 59\], got"):
        AdaptiveSoftmax(D, N, cutoffs=cutoffs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="div_value"):
        AdaptiveSoftmax(D, N, div_value=0)
    with pytest.raises(ValueError, match="leaves tail cluster 2 no dimension"):
        AdaptiveSoftmax(8, N, cutoffs=[5, 20], div_value=4.0)
    with pytest.raises(ValueError, match=r"counts must have shape \[60\]"):
        AdaptiveSoftmax(D, N, counts=torch.ones(N + 1))
    with pytest.raises(ValueError, match="target values"):
        AdaptiveSoftmax(D, N)(torch.randn(2, D), torch.tensor([0, N]))


def test_build_head_passes_options():
    head = build_head("adaptive", D, N, counts=_counts(), cutoffs=[10, 30], div_value=2.0, head_bias=True)
    assert isinstance(head, AdaptiveSoftmax) and head.cutoffs == [10, 30, N] and head.head.bias is not None
    assert head.objective == "nll" and head.loss_is_nll


# -- adaptive input: the embedding a tied model reads ------------------------------------------
def test_adaptive_input_matches_the_dense_float64_construction():
    """Every word's input vector, and the gradient reaching every parameter, against the matrix built word by word."""
    head = _head(2, head_bias=True)
    ids = torch.randint(0, N, (7, 5), generator=torch.Generator().manual_seed(3))
    ids[0, :3] = torch.tensor([int(head.word_of_rank[0]), int(head.word_of_rank[CUTOFFS[0]]),
                               int(head.word_of_rank[N - 1])])  # the first word of each band, the rarest
    weights = torch.randn(7, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = head.embed(ids)
    (got * weights).sum().backward()

    head_weight, _, tails = _leaves(head)
    matrix = adaptive_input_matrix(head_weight, tails, CUTOFFS, head.word_of_rank)
    expected = matrix[ids]
    (expected * weights).sum().backward()

    assert got.shape == (7, 5, D) and got.dtype == torch.float64
    torch.testing.assert_close(got, expected.detach(), rtol=0, atol=1e-13)
    torch.testing.assert_close(head.embedding_matrix(), matrix.detach(), rtol=0, atol=1e-13)
    torch.testing.assert_close(head.head.weight.grad, head_weight.grad, rtol=0, atol=1e-12)
    assert head.head.bias.grad is None  # a bias is the head's own
    for (p, o), (p_ref, o_ref) in zip(head.tail, tails):
        torch.testing.assert_close(p.weight.grad, p_ref.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(o.weight.grad, o_ref.grad, rtol=0, atol=1e-12)
    assert head.head.weight.grad[CUTOFFS[0]:].abs().sum() == 0  # the cluster entries are no word's vector


def test_starts_as_torch_module_does_from_the_same_seed():
    """The word vectors start by init_word_vectors, with the values of torch's own initialisation."""
    torch.manual_seed(5)
    head = AdaptiveSoftmax(D, N, cutoffs=CUTOFFS, div_value=2.0)
    torch.manual_seed(5)
    reference = nn.AdaptiveLogSoftmaxWithLoss(D, N, CUTOFFS, div_value=2.0)
    for (name, p), (_, q) in zip(head.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), name
