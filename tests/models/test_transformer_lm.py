"""The transformer language model: shapes, causality, every head on top, sizes refused, decoding."""
from __future__ import annotations

import pytest
import torch

import sohsm
from sohsm.clustering import random_tree, save_tree
from sohsm.models import TransformerLM, generate

N, D = 50, 16


def make(positions="learned", **options):
    torch.manual_seed(0)
    settings = dict(hidden_size=D, layers=2, attention_heads=4, context=12, dropout=0.0, positions=positions)
    return TransformerLM(N, **{**settings, **options}).eval()


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_shapes_time_first_and_batch_first(positions):
    ids = torch.randint(0, N, (7, 3))
    hidden, state = make(positions)(ids)
    assert hidden.shape == (7, 3, D) and state is None
    batch_first = make(positions, batch_first=True)  # the same weights (same seed), ids [B, T]
    torch.testing.assert_close(batch_first(ids.t())[0], hidden.transpose(0, 1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_a_later_token_never_changes_an_earlier_output(positions):
    """Causality: changing token t + 1 leaves the hidden states of tokens 0 .. t as they were."""
    model = make(positions)
    ids = torch.randint(0, N, (10, 2))
    hidden, _ = model(ids)
    for t in (0, 4, 8):
        changed = ids.clone()
        changed[t + 1 :] = (changed[t + 1 :] + 1 + torch.arange(10 - t - 1)[:, None]) % N
        other, _ = model(changed)
        torch.testing.assert_close(other[: t + 1], hidden[: t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(other[t + 1], hidden[t + 1])  # while the changed token's own output moves


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_word_order_matters(positions):
    """Without positions, causal attention reads the words before the last as a set; with them, their order counts."""
    model = make(positions)
    a, b = model(torch.tensor([[3], [7], [9]]))[0], model(torch.tensor([[7], [3], [9]]))[0]
    assert not torch.allclose(a[-1], b[-1], atol=1e-4)


def test_each_window_is_read_on_its_own():
    model = make()
    ids = torch.randint(0, N, (8, 2))
    whole, _ = model(ids)
    second, _ = model(ids[4:])
    assert not torch.allclose(second[0], whole[4])  # no context carried from the first window
    with pytest.raises(ValueError, match="carries no state"):
        model(ids, (torch.zeros(1), torch.zeros(1)))


def test_hidden_states_feed_any_head(tmp_path):
    model = make()
    ids = torch.randint(0, N, (6, 2))
    save_tree(tmp_path / "tree.pt", random_tree(N))
    needed = {"tree_file": {"path": str(tmp_path / "tree.pt")}}  # heads with a required option
    for name in sohsm.head_names():
        head = sohsm.build_head(name, D, N, counts=torch.arange(N, 0, -1), **needed.get(name, {}))
        hidden, _ = model(ids[:-1])
        out = head.eval()(hidden, ids[1:])
        assert out.output.shape == (5 * 2,) and out.loss.ndim == 0 and torch.isfinite(out.loss), name
        out.loss.backward()
        assert model.embedding.weight.grad is not None, name
        model.zero_grad()


def test_a_few_adamw_steps_lower_the_loss():
    torch.manual_seed(1)
    model = TransformerLM(N, hidden_size=D, layers=2, attention_heads=2, context=8).train()
    head = sohsm.build_head("self_organized", D, N, counts=torch.arange(N, 0, -1))
    optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-2)
    head.attach(optimizer)
    ids = torch.randint(0, N, (9, 4))  # one batch learned by heart
    losses = []
    for _ in range(30):
        loss = head(model(ids[:-1])[0], ids[1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.parametrize("options, message", [
    (dict(hidden_size=30, attention_heads=4), r"hidden_size \(30\) must be a multiple of attention_heads \(4\)"),
    (dict(hidden_size=12, attention_heads=4, positions="rotary"), "rotary positions need an even head size"),
    (dict(positions="absolute"), "positions must be one of learned, rotary"),
    (dict(layers=0), "layers must be an integer >= 1"),
    (dict(context=0), "context must be an integer >= 1"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
])
def test_bad_sizes_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as caught:
        TransformerLM(N, **{"hidden_size": D, "attention_heads": 4, **options})
    assert "\n" not in str(caught.value)


def test_learned_positions_bound_the_window():
    with pytest.raises(ValueError, match="longer than the 12 learned positions"):
        make()(torch.zeros(13, 1, dtype=torch.long))
    hidden, _ = make("rotary")(torch.zeros(13, 1, dtype=torch.long))  # rotary has no table to run out of
    assert hidden.shape == (13, 1, D)


def test_weight_tying_shares_the_full_softmax_weight():
    model = make()
    full = sohsm.build_head("full", D, N)
    model.tie_weights(full)
    assert full.weight is model.embedding.weight


def test_weight_decay_takes_the_linear_maps_only():
    model = make()
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in model.decayed_parameters()}
    assert decayed == {n for n in names.values() if n.startswith("blocks.") and n.endswith("weight")
                       and "norm" not in n}
    assert len(decayed) == 2 * 4  # qkv, out, and the MLP's two maps, in each of 2 blocks


def test_generation_reads_the_last_context_words():
    """Each new word comes from the hidden state of the last `context` words, as in training."""
    model = make()
    head = sohsm.build_head("full", D, N).eval()
    prompt = torch.randint(0, N, (20,))  # longer than the context (12)
    out = generate(model, head, prompt, 5, greedy=True)
    text = prompt.tolist()
    for word in out.tolist():
        hidden, _ = model(torch.tensor(text[-12:])[:, None])
        assert word == head.predict(hidden[-1]).item()
        text.append(word)
