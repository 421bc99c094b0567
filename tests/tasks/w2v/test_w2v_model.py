"""The CBOW / skip-gram model and word2vec's SGD against dense float64 references."""
import pytest
import torch
from torch import nn

from sohsm.heads import build_head
from sohsm.tasks.w2v.data import W2VBatch
from sohsm.tasks.w2v.model import LinearDecaySGD, Word2Vec, capped_rows


def cbow_batch():
    inputs = torch.tensor([1, 2, 3, 4, 4, 0])
    return W2VBatch(inputs, torch.tensor([0, 3, 5]), torch.tensor([3, 2, 1]), torch.tensor([5, 6, 7]), 6)


@pytest.mark.parametrize("exact", [False, True])
def test_cbow_is_the_context_mean_and_word2vec_passes_the_gradient_undivided(exact):
    model = Word2Vec(8, 4, "cbow", exact_mean_gradient=exact).double()
    batch = cbow_batch()
    weight = model.embedding.weight
    hidden = model(batch)
    reference = torch.stack([weight[[1, 2, 3]].mean(0), weight[[4, 4]].mean(0), weight[[0]].mean(0)])
    torch.testing.assert_close(hidden, reference)
    upstream = torch.randn(3, 4, dtype=torch.float64)
    (hidden * upstream).sum().backward()
    grad = weight.grad.to_dense()
    share = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64) if exact else torch.ones(3, dtype=torch.float64)
    expected = torch.zeros(8, 4, dtype=torch.float64)
    for row, words in enumerate([[1, 2, 3], [4, 4], [0]]):
        for w in words:
            expected[w] += upstream[row] / share[row]
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("init_range", [0.5, 1.0])
def test_the_vectors_start_uniform_in_init_range_over_dim(init_range):
    """gensim's start by default (+-1/d); word2vec.c's is 0.5/d: the same draws, scaled."""
    torch.manual_seed(0)
    weight = Word2Vec(2000, 50, init_range=init_range).embedding.weight.detach()
    bound = init_range / 50
    assert float(weight.abs().max()) <= bound and float(weight.abs().max()) > 0.99 * bound
    assert abs(float(weight.mean())) < 0.01 * bound
    torch.manual_seed(0)
    torch.testing.assert_close(Word2Vec(2000, 50).embedding.weight.detach(), weight / init_range)  # draws, scaled
    with pytest.raises(ValueError, match="init_range must be positive, got 0"):
        Word2Vec(4, 2, init_range=0)


def test_skipgram_hidden_is_the_context_word_vector():
    model = Word2Vec(8, 4, "skipgram")
    batch = W2VBatch(torch.tensor([3, 1]), None, None, torch.tensor([0, 2]), 2)
    torch.testing.assert_close(model(batch), model.embedding.weight[[3, 1]])


def test_start_is_gensims_by_default_and_word2vecs_on_request():
    model = Word2Vec(50, 10)  # gensim: +-1/d
    assert model.vectors.abs().max() <= 0.1 and model.vectors.abs().max() > 0.05
    model = Word2Vec(50, 10, init_range=0.5)  # word2vec.c: +-0.5/d
    assert model.vectors.abs().max() <= 0.05 and model.vectors.abs().max() > 0.02
    with pytest.raises(ValueError, match="architecture must be one of cbow, skipgram, got 'glove'"):
        Word2Vec(5, 2, "glove")


def test_rate_falls_linearly_and_resumes_exactly():
    w = nn.Parameter(torch.zeros(3))
    opt = LinearDecaySGD([w], lr=0.5, total_steps=10, rows=lambda: 2, min_ratio=0.05)
    rates = []
    for _ in range(12):
        w.grad = torch.ones(3)
        opt.step()
        rates.append(opt.param_groups[0]["lr"])
    assert rates[:10] == pytest.approx([0.5 * (1 - t / 10) if t < 10 else 0.025 for t in range(10)][:10])
    assert rates[-1] == pytest.approx(0.025)  # the floor
    assert -float(w.detach()[0]) == pytest.approx(2 * sum(rates))  # rows x rate x the mean gradient
    state = opt.state_dict()
    again = LinearDecaySGD([nn.Parameter(torch.zeros(3))], lr=0.5, total_steps=10, rows=lambda: 2, min_ratio=0.05)
    again.load_state_dict(state)
    assert again.param_groups[0]["steps_done"] == 12


def test_summed_step_equals_the_per_row_updates_at_one_point():
    """rows x mean gradient: the batch moves the head as its rows' single updates would, summed."""
    torch.manual_seed(0)
    head = build_head("tree_huffman", 6, 20, counts=torch.arange(20, 0, -1), sparse=True).double()
    hidden, target = torch.randn(5, 6, dtype=torch.float64), torch.randint(0, 20, (5,))
    start = head.weight.detach().clone()
    opt = LinearDecaySGD(head.parameters(), lr=0.1, total_steps=100, rows=lambda: 5)
    head(hidden, target).loss.backward()
    opt.step()
    expected = start.clone()
    for i in range(5):
        probe = build_head("tree_huffman", 6, 20, counts=torch.arange(20, 0, -1)).double()
        probe.weight.data.copy_(start)
        (-probe(hidden[i: i + 1], target[i: i + 1]).output.sum()).backward()
        expected -= 0.1 * probe.weight.grad
    torch.testing.assert_close(head.weight.detach(), expected)


def test_capped_rows_scale_rows_touched_more_than_cap():
    torch.manual_seed(1)
    index = torch.tensor([0, 0, 0, 0, 2, 3, 3, 1])
    values = torch.randn(8, 3, dtype=torch.float64)
    values[7] = 0.0  # a padding entry: not a touch
    grad = torch.sparse_coo_tensor(index[None], values, (5, 3), check_invariants=True)
    dense = torch.zeros(5, 3, dtype=torch.float64).index_add_(0, index, values)
    scale = torch.tensor([2 / 4, 1, 1, 1, 1], dtype=torch.float64)[:, None]  # row 0: 4 touches, cap 2
    torch.testing.assert_close(capped_rows(grad, 2.0).to_dense(), dense * scale)


def test_cap_on_dense_gradients_treats_every_row_as_touched_by_all():
    w = nn.Parameter(torch.zeros(2, 2))
    opt = LinearDecaySGD([w], lr=1.0, total_steps=1000, rows=lambda: 10, row_cap=4)
    w.grad = torch.ones(2, 2)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((2, 2), -4.0))  # 4 rows' worth, not 10


def test_bad_optimizer_arguments_are_refused():
    w = [nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match="total_steps must be >= 1, got 0"):
        LinearDecaySGD(w, lr=0.1, total_steps=0, rows=lambda: 1)
    with pytest.raises(ValueError, match="row_cap must be positive or None, got 0"):
        LinearDecaySGD(w, lr=0.1, total_steps=1, rows=lambda: 1, row_cap=0)


def test_the_config_refuses_a_start_range_that_is_not_positive():
    from sohsm.fields import FieldError
    from sohsm.tasks.w2v.config import W2VConfig, W2VModelConfig

    assert W2VConfig().model.init_range == 1.0
    with pytest.raises(FieldError, match="init_range"):
        W2VConfig(model=W2VModelConfig(init_range=0.0)).validate()
