"""The LSTM language model and decoding with it."""
from __future__ import annotations

import pytest
import torch

import sohsm
from sohsm.clustering import random_tree, save_tree
from sohsm.models import LSTMLanguageModel, detach_state, generate

N, D = 50, 16


@pytest.fixture
def model():
    torch.manual_seed(0)
    return LSTMLanguageModel(N, emb_size=D, hidden_size=D, layers=2, dropout=0.0).eval()


def test_shapes_and_state(model):
    ids = torch.randint(0, N, (7, 3))
    hidden, (h, c) = model(ids)
    assert hidden.shape == (7, 3, D) and h.shape == c.shape == (2, 3, D)


def test_carried_state_continues_the_text(model):
    """Two windows with the state carried == one long window (what truncated BPTT relies on)."""
    ids = torch.randint(0, N, (12, 4))
    whole, _ = model(ids)
    first, state = model(ids[:5])
    second, _ = model(ids[5:], detach_state(state))
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=0, atol=1e-6)


def test_hidden_states_feed_any_head(model, tmp_path):
    ids = torch.randint(0, N, (6, 2))
    hidden, _ = model(ids[:-1])
    save_tree(tmp_path / "tree.pt", random_tree(N))
    needed = {"tree_file": {"path": str(tmp_path / "tree.pt")}}  # heads with a required option
    for name in sohsm.head_names():
        head = sohsm.build_head(name, D, N, counts=torch.arange(N, 0, -1), **needed.get(name, {}))
        out = head.eval()(hidden, ids[1:])
        assert out.output.shape == (5 * 2,) and out.loss.ndim == 0


def test_weight_tying_shares_the_full_softmax_weight(model):
    """(Two-level heads: tests/models/test_tying.py.)"""
    full = sohsm.build_head("full", D, N)
    model.tie_weights(full)
    assert full.weight is model.embedding.weight
    with pytest.raises(ValueError, match="emb_size == hidden_size"):
        LSTMLanguageModel(N, emb_size=8, hidden_size=D).tie_weights(sohsm.build_head("full", D, N))


def test_lstm_parameters_are_the_lstm_only(model):
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].startswith("lstm.") for p in model.lstm_parameters())
    assert "embedding.weight" not in {names[id(p)] for p in model.lstm_parameters()}


@pytest.mark.parametrize("tied", [False, True])
def test_word_vectors_start_in_the_init_range(tied):
    torch.manual_seed(0)
    model = LSTMLanguageModel(400, emb_size=D, hidden_size=D, init_range=0.03)
    if tied:
        model.tie_weights(sohsm.build_head("full", D, 400))
    weight = model.embedding.weight
    assert weight.abs().max() <= 0.03 and weight.abs().max() > 0.029  # drawn again at the new scale when tied


@pytest.mark.parametrize("bad", [dict(vocab_size=1), dict(emb_size=0), dict(layers=0), dict(dropout=1.0),
                                 dict(hidden_size=2.5), dict(init_range=0.0)])
def test_constructor_checks(bad):
    kwargs = dict(vocab_size=N, emb_size=D, hidden_size=D)
    kwargs.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        LSTMLanguageModel(**kwargs)


def test_input_checks(model):
    with pytest.raises(ValueError, match=r"\[T, B\] long tensor"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[T, B\] long tensor"):
        model(torch.zeros(5, 2))
    with pytest.raises(ValueError, match="state must be"):
        model(torch.zeros(5, 2, dtype=torch.long), (torch.zeros(2, 3, D), torch.zeros(2, 3, D)))


# -- generate -------------------------------------------------------------------------------------
@pytest.fixture
def head():
    torch.manual_seed(1)
    return sohsm.build_head("two_level_random", D, N)


def test_greedy_generation_takes_the_argmax(model, head):
    prompt = torch.tensor([3, 4, 5])
    out = generate(model, head, prompt, 6, greedy=True)
    # the same by hand: re-read the whole text each time, take the argmax of the exact log-probabilities
    text = prompt.tolist()
    with torch.no_grad():
        for _ in range(6):
            hidden, _ = model(torch.tensor(text)[:, None])
            text.append(int(head.log_prob(hidden[-1]).argmax(1)))
    assert out.tolist() == text[3:]


def test_sampling_is_reproducible_and_leaves_modes(model, head):
    model.train()
    prompt = torch.tensor([1, 2])
    a = generate(model, head, prompt, 20, generator=torch.Generator().manual_seed(5))
    b = generate(model, head, prompt, 20, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == (20,) and int(a.min()) >= 0 and int(a.max()) < N
    assert model.training and head.training  # modes restored
    cold = generate(model, head, prompt, 20, temperature=1e-4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(cold, generate(model, head, prompt, 20, greedy=True))  # T -> 0 is greedy


def test_generate_checks(model, head):
    with pytest.raises(ValueError, match="prompt"):
        generate(model, head, torch.tensor([], dtype=torch.long), 3)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, head, torch.tensor([1]), 3, temperature=0.0)
    with pytest.raises(ValueError, match="length"):
        generate(model, head, torch.tensor([1]), -1)
    with pytest.raises(ValueError, match="length must be an integer in \\[0, 100000\\]"):
        generate(model, head, torch.tensor([1]), 100_001)
    assert generate(model, head, torch.tensor([1]), 0).numel() == 0


def test_the_generate_function_is_what_the_package_gives_after_its_module_was_imported():
    """The function's module is named otherwise (``generation``): importing it never shadows the function."""
    import sohsm.models.generation  # noqa: F401
    from sohsm.models import generate as again

    assert callable(again) and again is generate and not isinstance(again, type(sohsm))
