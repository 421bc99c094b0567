"""save_pretrained and sohsm.hf.load: the head, its clusters, statistics, options and counts come back exactly."""
import json

import pytest
import torch

from needs import HF_HOW, need_packages

need_packages("transformers", "safetensors", how=HF_HOW)

from safetensors import safe_open  # noqa: E402
from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: E402

import sohsm.hf  # noqa: E402
from sohsm.heads.tying import HeadEmbedding  # noqa: E402
from sohsm.hf.extra_state import MAGIC, decode, encode  # noqa: E402
from tiny import counts, gpt2, llama, token_ids  # noqa: E402


def _train(model, steps, lr=0.05):
    head = sohsm.hf.head_of(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    head.attach(optimizer)
    ids = token_ids(4, 16, seed=3)
    for _ in range(steps):
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _same(a, b) -> bool:
    """Equal values, tensors in plain containers included."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _assert_same_state(model, loaded):
    """Every tensor of the two state dicts equal (dtype included); extra states equal once decoded."""
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for key, value in mine.items():
        if key.endswith("_extra_state"):
            assert _same(decode(value), decode(theirs[key])), key
        else:
            assert value.dtype == theirs[key].dtype and torch.equal(value, theirs[key]), key


def test_a_trained_self_organized_head_comes_back_exactly(tmp_path):
    model = gpt2().double()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=2, gamma=2.0)
    _train(model, 5)
    assert len(head.history) == 2 and int(head.steps) == 5
    model.save_pretrained(tmp_path)

    loaded = sohsm.hf.load(tmp_path)
    again = sohsm.hf.head_of(loaded)
    assert type(loaded) is GPT2LMHeadModel and not loaded.training
    assert type(again) is type(head) and again.weight.dtype == torch.float64
    assert loaded.config.sohsm_head == model.config.sohsm_head
    assert (again.update_every, again.reclustering.gamma, again.shortlist) == (2, 2.0, head.shortlist)
    assert torch.equal(again.assignment, head.assignment) and torch.equal(again.q, head.q)
    assert torch.equal(again.counts, head.counts) and int(again.steps) == 5
    assert again.history == head.history and again.tokens_seen == head.tokens_seen
    assert torch.equal(loaded.lm_head.counts, counts())
    embedding = loaded.get_input_embeddings()
    assert isinstance(embedding, HeadEmbedding) and embedding.head is again  # tied again, through the head
    _assert_same_state(model, loaded)
    model.eval()
    ids = token_ids(2, 10, seed=4)
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert torch.equal(loaded(ids, labels=ids).loss, model(ids, labels=ids).loss)


def test_the_tied_full_heads_weight_is_saved_once_and_tied_again(tmp_path):
    model = gpt2()
    sohsm.hf.use_head(model, "full")
    _train(model, 2)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as saved:
        keys = set(saved.keys())
    assert "transformer.wte.weight" in keys and not any(key.startswith("lm_head.head") for key in keys)
    loaded = sohsm.hf.load(tmp_path)
    assert sohsm.hf.head_of(loaded).weight is loaded.get_input_embeddings().weight
    _assert_same_state(model, loaded)


@pytest.mark.parametrize("name, options", [("full", {"bias": True}), ("importance_sampling", {"n_samples": 8}),
                                           ("adaptive", {"cutoffs": [10, 30]}), ("tree_huffman", {}),
                                           ("two_level_random", {"n_clusters": 5, "seed": 3})])
def test_an_untied_head_comes_back_with_its_options_and_state(tmp_path, name, options):
    model = llama()
    head = sohsm.hf.use_head(model, name, counts=counts(), **options)
    _train(model, 2)
    model.save_pretrained(tmp_path)
    kept = {**options, "cluster_bias": True} if name == "two_level_random" else options  # use_head's, for it
    assert json.loads((tmp_path / "config.json").read_text())["sohsm_head"]["options"] == kept
    loaded = sohsm.hf.load(tmp_path)
    assert type(loaded) is LlamaForCausalLM and type(sohsm.hf.head_of(loaded)) is type(head)
    _assert_same_state(model, loaded)
    ids = token_ids(2, 10, seed=4)
    assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)
    if name == "importance_sampling":  # the noise generator's state is the head's extra state: the same draws
        assert torch.equal(sohsm.hf.head_of(loaded).noise_samples(), head.noise_samples())


def test_a_sharded_save_loads_back(tmp_path):
    model = llama()
    sohsm.hf.use_head(model, "two_level_frequency", counts=counts())
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _assert_same_state(model, sohsm.hf.load(tmp_path))


def test_the_extra_state_travels_as_bytes_in_a_tensor():
    state = {"history": [{"step": 2, "change_rate": 0.25}], "update_every": None, "generator": torch.arange(3)}
    tensor = encode(state)
    assert tensor.dtype == torch.uint8 and tensor.dim() == 1 and bytes(tensor[:len(MAGIC)].tolist()) == MAGIC
    back = decode(tensor)
    assert back["history"] == state["history"] and back["update_every"] is None
    assert torch.equal(back["generator"], state["generator"])
    ordinary = torch.arange(5, dtype=torch.uint8)
    assert decode(ordinary) is ordinary


def test_load_refuses_what_is_not_a_saved_model_with_a_sohsm_head(tmp_path):
    with pytest.raises(ValueError, match="holds no saved model"):
        sohsm.hf.load(tmp_path)
    gpt2().save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="a model without a sohsm head .*from_pretrained"):
        sohsm.hf.load(tmp_path / "plain")
    model = gpt2()
    sohsm.hf.use_head(model, "full")
    model.save_pretrained(tmp_path / "bare")
    (tmp_path / "bare" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="holds no weights"):
        sohsm.hf.load(tmp_path / "bare")
