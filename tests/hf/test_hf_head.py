"""sohsm.hf.use_head: a sohsm head in place of a Hugging Face causal LM's lm_head, for its loss and its generate."""
import copy

import pytest
import torch
import torch.nn.functional as F

from needs import HF_HOW, need_packages

need_packages("transformers", how=HF_HOW)

from torch import nn  # noqa: E402
from transformers import GPT2Model  # noqa: E402

import sohsm.hf  # noqa: E402
from sohsm.heads.tying import HeadEmbedding  # noqa: E402
from tiny import MODELS, VOCAB, WIDTH, counts, gpt2, llama, token_ids  # noqa: E402


def _padded_batch():
    """Three rows, the last padded at its end (attention mask 0, label -100), the first with its start ignored."""
    ids = token_ids(3, 12)
    mask = torch.ones_like(ids)
    mask[2, -4:] = 0
    labels = ids.clone()
    labels[2, -4:] = -100
    labels[0, :5] = -100
    return ids, mask, labels


def _reference_loss(logits, labels, num_items=None):
    """Cross-entropy of each position's logits against the next label, -100 ignored (what HF's loss computes)."""
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="mean" if num_items is None else "sum")
    return loss if num_items is None else loss / num_items


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_full_head_gives_the_loss_and_gradients_of_the_models_own_lm_head(kind):
    reference = MODELS[kind]().double()
    model = copy.deepcopy(reference)
    head = sohsm.hf.use_head(model, "full")
    assert model.config.tie_word_embeddings == (kind == "gpt2")
    assert (head.weight is model.get_input_embeddings().weight) == (kind == "gpt2")  # tied as HF ties: one parameter
    ids, mask, labels = _padded_batch()

    expected = _reference_loss(reference(ids, attention_mask=mask).logits, labels)
    expected.backward()
    output = model(ids, attention_mask=mask, labels=labels)
    output.loss.backward()

    assert output.logits is None  # with labels the vocabulary is not scored twice
    torch.testing.assert_close(output.loss, expected, rtol=1e-12, atol=1e-12)
    hf_loss = reference(ids, attention_mask=mask, labels=labels).loss  # HF's own loss, which it computes in float32
    torch.testing.assert_close(output.loss, hf_loss.double(), rtol=1e-6, atol=1e-6)
    names = dict(model.named_parameters())
    compared = 0
    for name, parameter in reference.named_parameters():
        mine = names[name.replace("lm_head.", "lm_head.head.")]
        torch.testing.assert_close(mine.grad, parameter.grad, rtol=1e-10, atol=1e-12, msg=name)
        compared += 1
    assert compared == len(names)


def test_the_full_head_keeps_the_untied_lm_heads_weight_and_the_tied_embeddings_parameter():
    model = llama()
    weight = model.lm_head.weight.detach().clone()
    head = sohsm.hf.use_head(model, "full")
    assert torch.equal(head.weight, weight)
    tied = gpt2()
    embedding = tied.get_input_embeddings()
    before = embedding.weight.detach().clone()
    head = sohsm.hf.use_head(tied, "full")
    assert tied.get_input_embeddings() is embedding and head.weight is embedding.weight
    assert torch.equal(head.weight, before)


def test_num_items_in_batch_divides_the_summed_loss_as_hfs_loss_does():
    reference = gpt2().double()
    model = copy.deepcopy(reference)
    sohsm.hf.use_head(model, "full")
    ids, mask, labels = _padded_batch()
    loss = model(ids, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    torch.testing.assert_close(loss, _reference_loss(reference(ids, attention_mask=mask).logits, labels, 40))


def test_labels_given_by_position_and_tuple_outputs_work_as_in_the_model():
    reference = gpt2().double()
    model = copy.deepcopy(reference)
    sohsm.hf.use_head(model, "full")
    ids, _, labels = _padded_batch()
    expected = _reference_loss(reference(ids).logits, labels)
    # GPT2LMHeadModel.forward(input_ids, cache, attention_mask, token_type_ids, position_ids, inputs_embeds,
    #                         encoder_hidden_states, encoder_attention_mask, labels, ...)
    positional = model(ids, None, None, None, None, None, None, None, labels)
    torch.testing.assert_close(positional.loss, expected)
    as_tuple = model(ids, labels=labels, return_dict=False)
    torch.testing.assert_close(as_tuple[0], expected)
    assert not any(isinstance(item, torch.Tensor) and item.shape[-1:] == (0,) for item in as_tuple)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_without_labels_the_logits_are_the_heads_log_probabilities(kind):
    model = MODELS[kind]().double()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts())
    ids = token_ids(2, 9)
    logits = model(ids).logits
    hidden = model.base_model(ids).last_hidden_state
    assert logits.shape == (2, 9, VOCAB)
    torch.testing.assert_close(logits, head.log_prob(hidden).view(2, 9, VOCAB))
    torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(2, 9, dtype=torch.float64))
    last = model(ids, logits_to_keep=1).logits
    assert last.shape == (2, 1, VOCAB)
    torch.testing.assert_close(last[:, 0], logits[:, -1])


def test_logits_with_loss_returns_both():
    model = gpt2().double()
    head = sohsm.hf.use_head(model, "two_level_frequency", counts=counts(), logits_with_loss=True)
    ids, mask, labels = _padded_batch()
    output = model(ids, attention_mask=mask, labels=labels)
    hidden = model.base_model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(output.logits, head.log_prob(hidden).view(*ids.shape, VOCAB))
    torch.testing.assert_close(output.loss, _reference_loss(output.logits, labels))  # the exact NLL of those


def test_ignored_tokens_never_reach_the_head():
    model = gpt2()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=0)
    seen = []
    head.register_forward_pre_hook(lambda module, args: seen.append(args[1].clone()))
    ids, mask, labels = _padded_batch()
    model(ids, attention_mask=mask, labels=labels)
    assert torch.equal(seen[0], labels[:, 1:][labels[:, 1:] != -100])
    nothing = model(ids, labels=torch.full_like(ids, -100)).loss
    assert nothing.item() == 0.0 and nothing.requires_grad


def test_a_mixture_of_experts_adds_its_router_loss_as_its_own_forward_does():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=True, router_aux_loss_coef=0.5, bos_token_id=None,
                           eos_token_id=None, pad_token_id=None)
    reference = MixtralForCausalLM(config)
    model = copy.deepcopy(reference)
    sohsm.hf.use_head(model, "full")
    ids, _, labels = _padded_batch()
    expected = reference(ids, labels=labels)
    output = model(ids, labels=labels)
    assert output.aux_loss is not None and output.aux_loss.item() > 0
    torch.testing.assert_close(output.loss, expected.loss)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_generate_is_greedy_decoding_over_the_heads_log_probabilities(kind):
    model = MODELS[kind]().double()
    # stay_margin=0: every word free to move (a take-over's default margin keeps this untrained model's words put)
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=2, stay_margin=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    head.attach(optimizer)
    ids = token_ids(4, 16, seed=2)
    for _ in range(6):  # train a little, re-clustering every 2 steps: decoding reads the clusters as they are now
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert len(head.history) == 3 and any(record["change_rate"] > 0 for record in head.history)
    model.eval()
    prompt = ids[:, :3]
    generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                               pad_token_id=0)
    tokens = prompt
    with torch.no_grad():
        for _ in range(8):
            hidden = model.base_model(tokens).last_hidden_state[:, -1]
            tokens = torch.cat([tokens, head.log_prob(hidden).argmax(1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


# -- tying -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["self_organized", "two_level_frequency", "two_level_random"])
def test_a_tied_two_level_head_keeps_the_embeddings_rows_and_follows_its_clusters(name):
    model = gpt2()
    before = model.get_input_embeddings().weight.detach().clone()
    head = sohsm.hf.use_head(model, name, counts=counts())
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, HeadEmbedding) and embedding.head is head
    ids = torch.arange(VOCAB)
    assert torch.equal(embedding(ids), before)
    moved = head.set_assignment(torch.roll(head.assignment, 1))  # words change clusters: their rows move
    assert bool(moved.any()) and torch.equal(embedding(ids), before)
    assert not any(name.startswith("transformer.wte") for name, _ in model.named_parameters())


def test_adaptive_softmax_ties_through_adaptive_input_only_with_new_vectors():
    with pytest.raises(ValueError, match=r"head 'adaptive'.*keep_weights=False.*tie_word_embeddings=False"):
        sohsm.hf.use_head(gpt2(), "adaptive", counts=counts(), cutoffs=[10])
    model = gpt2()
    head = sohsm.hf.use_head(model, "adaptive", counts=counts(), cutoffs=[10], keep_weights=False)
    assert isinstance(model.get_input_embeddings(), HeadEmbedding)
    ids = token_ids()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in head.parameters())


def test_a_two_level_head_with_bands_ties_through_their_projections_with_new_vectors():
    """div_value with keep_weights=False: the model's input reads every word through its band (adaptive input) and
    every parameter learns (with the embedding's weights kept: tests/hf/test_hf_pretrained.py)."""
    model = gpt2()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), div_value=2, cutoffs=[10], keep_weights=False)
    assert isinstance(model.get_input_embeddings(), HeadEmbedding)
    ids = token_ids()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in head.parameters())


def test_keep_weights_false_ties_the_full_head_in_the_models_own_embedding_with_new_vectors():
    model = gpt2()
    embedding = model.get_input_embeddings()
    before = embedding.weight.detach().clone()
    head = sohsm.hf.use_head(model, "full", keep_weights=False)
    assert model.get_input_embeddings() is embedding and head.weight is embedding.weight
    assert not torch.equal(embedding.weight, before)
    assert abs(embedding.weight.std().item() - model.config.initializer_range) < 0.005


@pytest.mark.parametrize("name, reason", [("importance_sampling", "sampled objective"),
                                          ("tree_huffman", "inner nodes"),
                                          ("dsoftmax", "segment")])
def test_a_head_that_cannot_be_tied_is_refused_while_the_config_ties(name, reason):
    with pytest.raises(ValueError, match=rf"head '{name}' cannot be tied .*tie_word_embeddings=True.*{reason}.*"
                                         r"tie_word_embeddings=False"):
        sohsm.hf.use_head(gpt2(), name, counts=counts())
    model = gpt2(tie_word_embeddings=False)  # untied, it takes any head
    sohsm.hf.use_head(model, name, counts=counts())
    ids = token_ids()
    assert torch.isfinite(model(ids, labels=ids).loss)


def test_a_two_level_head_with_narrower_word_vectors_is_refused_while_the_config_ties():
    with pytest.raises(ValueError, match=r"head 'self_organized' cannot be tied.*word_dim=8"):
        sohsm.hf.use_head(gpt2(), "self_organized", counts=counts(), word_dim=8)


def test_an_embedding_that_does_more_than_look_up_rows_is_not_replaced():
    class Scaled(nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 2.0

    model = gpt2()
    model.set_input_embeddings(Scaled(VOCAB, WIDTH))
    model.tie_weights()
    with pytest.raises(ValueError, match="Scaled, which does more than look rows up"):
        sohsm.hf.use_head(model, "self_organized", counts=counts())
    model = gpt2()
    model.set_input_embeddings(Scaled(VOCAB, WIDTH))
    model.tie_weights()
    head = sohsm.hf.use_head(model, "full")  # the full head shares the weight and keeps the module
    assert isinstance(model.get_input_embeddings(), Scaled) and head.weight is model.get_input_embeddings().weight


# -- errors ----------------------------------------------------------------------------------------
def test_a_model_without_an_lm_head_is_refused():
    torch.manual_seed(0)
    base = GPT2Model(gpt2().config)
    with pytest.raises(ValueError, match="GPT2Model has no output embedding"):
        sohsm.hf.use_head(base, "full")
    with pytest.raises(ValueError, match="takes a transformers causal language model.*got Linear"):
        sohsm.hf.use_head(nn.Linear(4, 4), "full")


def test_an_unknown_head_name_is_refused_with_a_suggestion():
    with pytest.raises(ValueError, match="unknown head 'self_organised'; did you mean self_organized"):
        sohsm.hf.use_head(gpt2(), "self_organised")


def test_an_unknown_option_and_a_value_that_is_not_json_are_refused():
    with pytest.raises(ValueError, match="head 'full' has no option 'gamma'"):
        sohsm.hf.use_head(llama(), "full", gamma=2.0)
    with pytest.raises(ValueError, match="head 'adaptive': its options must be JSON values"):
        sohsm.hf.use_head(llama(), "adaptive", cutoffs=torch.tensor([10]))


def test_counts_must_have_one_entry_per_row_of_the_output_embedding():
    with pytest.raises(ValueError, match=r"counts has 48 entries but the model scores 50 tokens .*"
                                         r"config.vocab_size 50.*0 for the rows no token uses"):
        sohsm.hf.use_head(gpt2(), "self_organized", counts=counts(48))
    with pytest.raises(ValueError, match="counts must be non-negative"):
        sohsm.hf.use_head(gpt2(), "self_organized", counts=-counts())


def test_the_vocabulary_is_the_output_embeddings_rows_not_the_tokenizers():
    model = gpt2(vocab=64)  # a vocabulary padded to a multiple of 64, as HF checkpoints often are
    padded = torch.cat([counts(), torch.zeros(14, dtype=torch.long)])
    head = sohsm.hf.use_head(model, "self_organized", counts=padded)
    assert head.n_classes == 64


def test_a_tied_embedding_of_another_size_is_refused():
    model = gpt2()
    model.transformer.wte = nn.Embedding(VOCAB, WIDTH // 2)
    with pytest.raises(ValueError, match=r"input embedding of GPT2LMHeadModel is \(50, 8\).*hidden states of 16"):
        sohsm.hf.use_head(model, "full")


def test_a_model_takes_one_head_and_head_of_finds_it():
    model = gpt2()
    with pytest.raises(ValueError, match="GPT2LMHeadModel has no sohsm head: give it one with sohsm.hf.use_head"):
        sohsm.hf.head_of(model)
    head = sohsm.hf.use_head(model, "full")
    assert sohsm.hf.head_of(model) is head
    with pytest.raises(ValueError, match="has a sohsm head already"):
        sohsm.hf.use_head(model, "full")


def test_a_mismatched_hidden_state_is_refused_by_the_head():
    model = llama()
    sohsm.hf.use_head(model, "full")
    with pytest.raises(ValueError, match=r"hidden must have shape \[\*, 16\]"):
        model.lm_head(torch.zeros(2, 3, WIDTH + 1))


def test_the_config_records_the_head():
    model = gpt2()
    sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=5, cutoffs=None)
    assert model.config.sohsm_head == {"version": 1, "name": "self_organized",
                                       "options": {"update_every": 5, "cutoffs": None, "cluster_bias": True,
                                                   "stay_margin": 3.0},
                                       "counts": True, "logits_with_loss": False}
    model = gpt2()  # a head started afresh is the CLI's head: no cluster bias unless asked
    sohsm.hf.use_head(model, "self_organized", counts=counts(), keep_weights=False)
    assert model.config.sohsm_head["options"] == {} and sohsm.hf.head_of(model).cluster_bias is None


def test_a_copy_of_the_model_computes_with_its_own_head():
    model = gpt2().double()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=0)
    twin = copy.deepcopy(model)
    ids, mask, labels = _padded_batch()
    assert torch.equal(twin(ids, attention_mask=mask, labels=labels).loss,
                       model(ids, attention_mask=mask, labels=labels).loss)
    assert sohsm.hf.head_of(twin) is not head and twin.get_input_embeddings().head is sohsm.hf.head_of(twin)
    steps = int(head.steps)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    sohsm.hf.head_of(twin).attach(optimizer)
    twin(ids, labels=labels).loss.backward()
    optimizer.step()
    assert int(sohsm.hf.head_of(twin).steps) == steps + 1 and int(head.steps) == steps


def test_calling_forward_itself_skips_the_hooks_and_gives_the_same_nll_through_the_log_probabilities():
    model = llama().double()
    sohsm.hf.use_head(model, "two_level_frequency", counts=counts())
    ids, mask, labels = _padded_batch()
    direct = model.forward(ids, attention_mask=mask, labels=labels)
    hooked = model(ids, attention_mask=mask, labels=labels)
    assert direct.logits.shape == (*ids.shape, VOCAB)
    torch.testing.assert_close(direct.loss.double(), hooked.loss, rtol=1e-6, atol=1e-6)  # HF computes it in float32


def test_labels_that_do_not_fit_are_refused_and_a_failed_forward_leaves_no_state_behind():
    model = gpt2()
    sohsm.hf.use_head(model, "full")
    ids = token_ids(2, 12)
    with pytest.raises(ValueError, match=r"labels of shape \(2, 5\) do not cover the hidden states"):
        model(ids, labels=ids[:, :5])
    with pytest.raises(ValueError, match="no logits_to_keep with labels"):
        model(ids, labels=ids, logits_to_keep=1)
    with pytest.raises(IndexError):  # GPT-2 has 64 positions: its forward raises before lm_head
        model(token_ids(1, 80), labels=token_ids(1, 80))
    assert model(ids).logits.shape == (2, 12, VOCAB)  # the next call without labels scores the vocabulary
