"""A pretrained model keeps what its lm_head learned when sohsm.hf.use_head gives it a two-level head: the rows as word
vectors (a band's as the best low-rank fit of their scores), clusters of alike rows, cluster vectors fitted to the
frozen lm_head on the user's data; clear refusals of bad inputs; training, re-clustering and saving go on."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from needs import HF_HOW, need_packages

need_packages("transformers", "accelerate", how=HF_HOW)

from torch import nn  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import sohsm.hf  # noqa: E402
from sohsm.clustering import vector_assignment  # noqa: E402
from sohsm.heads import build_head  # noqa: E402
from sohsm.heads.two_level.takeover import keep_output_layer, low_rank_fit  # noqa: E402
from tiny import VOCAB, WIDTH, counts, gpt2, llama, token_ids  # noqa: E402

TWO_LEVEL = ["self_organized", "two_level_frequency", "two_level_random"]


def _pretrained(make=llama, scale=40.0, seed=0):
    """A tiny model whose lm_head scores words far apart, as a trained one does (a random one is near uniform)."""
    model = make(seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def _kl(reference: torch.Tensor, log_probs: torch.Tensor) -> float:
    return float((reference.exp() * (reference - log_probs)).sum(-1).mean())


def _log_probs(model, ids):
    with torch.no_grad():
        return F.log_softmax(model(ids).logits.double(), dim=-1)


# -- the parts, against dense float64 references -------------------------------------------------------------
def test_the_low_rank_fit_keeps_the_scores_as_well_as_the_rank_allows():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 12, generator=generator, dtype=torch.float64)
    mixing = torch.randn(12, 12, generator=generator, dtype=torch.float64)
    hidden = torch.randn(5000, 12, generator=generator, dtype=torch.float64) @ mixing  # correlated features
    moment = hidden.T @ hidden / hidden.size(0)

    def error(vectors, projection):
        return float(((hidden @ weight.T - hidden @ projection.T @ vectors.T) ** 2).sum(1).mean())

    vectors, projection = low_rank_fit(weight, 4, moment)
    assert vectors.shape == (40, 4) and projection.shape == (4, 12)
    root = torch.linalg.cholesky(moment)  # E||(W - AP) h||^2 = ||(W - AP) L||_F^2: Eckart-Young's bound
    singular = torch.linalg.svdvals(weight @ root)
    assert error(vectors, projection) == pytest.approx(float((singular[4:] ** 2).sum()), rel=1e-6)
    assert error(vectors, projection) < 0.95 * error(*low_rank_fit(weight, 4))  # the data's metric beats the plain SVD
    full_rank = low_rank_fit(weight, 12, moment)
    assert torch.allclose(full_rank[0] @ full_rank[1], weight, atol=1e-6)


def test_vector_assignment_finds_planted_directions_within_the_bounds():
    generator = torch.Generator().manual_seed(1)
    directions = F.normalize(torch.randn(5, 16, generator=generator), dim=1)
    truth = torch.arange(50) % 5
    vectors = directions[truth] * torch.rand(50, 1, generator=generator).add(0.5) \
        + 0.05 * torch.randn(50, 16, generator=generator)
    found = vector_assignment(vectors, 5, max_size=10, seed=3)
    assert torch.bincount(found, minlength=5).max() <= 10
    for c in range(5):  # every planted group is one found cluster
        assert found[truth == c].unique().numel() == 1
    tight = vector_assignment(vectors, 10, max_size=5)  # the bound holds where it splits the groups
    assert int(torch.bincount(tight).max()) <= 5
    with pytest.raises(ValueError, match="cannot hold 50 words"):
        vector_assignment(vectors, 4, max_size=10)


@pytest.mark.parametrize("name", TWO_LEVEL)
def test_kept_rows_give_the_trained_softmax_inside_every_cluster(name):
    """With the rows as word vectors, P(w | h, C(w)) is the trained layer's softmax restricted to C(w), exactly."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(VOCAB, WIDTH, generator=generator, dtype=torch.float64) * 3
    head = build_head(name, WIDTH, VOCAB, counts=counts()).double()
    assert keep_output_layer(head, weight, counts()) == []
    hidden = torch.randn(7, WIDTH, generator=generator, dtype=torch.float64)
    head_log_probs = head.log_prob(hidden)
    trained = hidden @ weight.T
    for cluster in head.clusters():
        if cluster.numel() == 0:
            continue
        inside = head_log_probs[:, cluster] - torch.logsumexp(head_log_probs[:, cluster], dim=1, keepdim=True)
        assert torch.allclose(inside, F.log_softmax(trained[:, cluster], dim=1), atol=1e-10)
        if cluster.numel() == 1:  # a word alone in its cluster: its cluster's vector is its row
            assert torch.allclose(head.cluster_weight[head.assignment[cluster[0]]], weight[cluster[0]])


# -- use_head on a pretrained model ---------------------------------------------------------------------------
@pytest.mark.parametrize("make", [llama, gpt2])
@pytest.mark.parametrize("name", TWO_LEVEL)
def test_use_head_with_data_keeps_the_pretrained_distribution(make, name):
    """The kept head's KL to the original is under a quarter of a fresh head's (a tiny model whose scaled random rows
    a few clusters of 16 dimensions follow less well than a trained layer's: the measured ratio is 0.01 to 0.13)."""
    data = [token_ids(8, 32, seed=s) for s in range(4)]
    reference = _log_probs(_pretrained(make), token_ids(4, 32, seed=9))
    naive = _pretrained(make)
    sohsm.hf.use_head(naive, name, counts=counts(), keep_weights=False)
    model = _pretrained(make)
    head = sohsm.hf.use_head(model, name, counts=counts(), data=data, fit_seconds=5, progress=False)
    report = model.get_output_embeddings().fit_report
    assert report is not None and report.tokens == 102 and report.kl <= report.kl_start
    assert report.perplexity_head is not None and report.perplexity_original is not None
    assert "nats/token" in str(report)
    kept, fresh = _kl(reference, _log_probs(model, token_ids(4, 32, seed=9))), \
        _kl(reference, _log_probs(naive, token_ids(4, 32, seed=9)))
    assert kept < 0.25 * fresh
    assert sohsm.hf.head_of(model) is head


def test_hidden_states_serve_as_data_and_without_data_nothing_is_fitted():
    model = _pretrained()
    with torch.no_grad():
        hidden = model.model(token_ids(8, 32)).last_hidden_state
    sohsm.hf.use_head(model, "self_organized", counts=counts(), data=[hidden], fit_seconds=5, progress=False)
    report = model.get_output_embeddings().fit_report
    assert report.perplexity_head is None and report.kl <= report.kl_start
    model = _pretrained()
    sohsm.hf.use_head(model, "self_organized", counts=counts())
    assert model.get_output_embeddings().fit_report is None


def test_bands_keep_a_low_rank_fit_say_so_and_the_joint_fit_never_ends_worse():
    model = _pretrained()
    with pytest.warns(UserWarning, match=r"keeps the trained lm_head only in part: div_value.*dimensions of 16"):
        sohsm.hf.use_head(model, "self_organized", counts=counts(), div_value=2, cutoffs=[10],
                          data=[token_ids(8, 32, seed=s) for s in range(4)], fit_seconds=3, progress=False)
    report = model.get_output_embeddings().fit_report
    assert report.steps > 1 and report.kl <= report.kl_start


def test_a_tied_head_with_bands_now_keeps_the_embedding_through_its_fit():
    model = gpt2()
    before = model.get_input_embeddings().weight.detach().clone()
    with pytest.warns(UserWarning, match="input vectors are read through the same fit"):
        head = sohsm.hf.use_head(model, "self_organized", counts=counts(), div_value=2, cutoffs=[10])
    rows = model.get_input_embeddings()(torch.arange(VOCAB)).detach()
    common = head.band_of_word == 0
    assert torch.allclose(rows[common], before[common])  # band 0: the rows themselves
    assert not torch.allclose(rows[~common], before[~common])  # the others: their rank-8 fit


def test_a_head_that_cannot_keep_the_trained_layer_says_so():
    with pytest.warns(UserWarning, match=r"head 'adaptive' cannot keep what the model's lm_head learned.*50 x 16"):
        sohsm.hf.use_head(_pretrained(), "adaptive", counts=counts(), cutoffs=[10])
    with pytest.warns(UserWarning, match="projection=True.*own initialisation"):
        sohsm.hf.use_head(_pretrained(), "two_level_random", projection=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sohsm.hf.use_head(_pretrained(), "adaptive", counts=counts(), cutoffs=[10], keep_weights=False)


# -- bad inputs: one line each ---------------------------------------------------------------------------------
def test_an_lm_head_with_a_bias_is_refused_for_a_head_without_one():
    model = llama()
    model.lm_head = nn.Linear(WIDTH, VOCAB, bias=True)
    with pytest.raises(ValueError, match=r"lm_head of LlamaForCausalLM has a bias.*'full'.*keep_weights=False"):
        sohsm.hf.use_head(model, "self_organized", counts=counts())


@pytest.mark.parametrize("data, message", [
    ([torch.zeros(2, 3, 4, dtype=torch.long)], r"data batch 0 of input ids has shape \(2, 3, 4\)"),
    ([torch.zeros(2, 5, 7)], r"data batch 0 of hidden states has shape \(2, 5, 7\).*\[\.\.\., 16\]"),
    ([torch.full((2, 5), VOCAB)], rf"token id {VOCAB} but the model scores {VOCAB} tokens.*resize_token_embeddings"),
    ([{"labels": torch.zeros(2, 5, dtype=torch.long)}], "mapping without input_ids"),
    (["some text"], "data batch 0 is a str"),
    ("some text", "not text: tokenize it first"),
    ([token_ids(), torch.zeros(2, 5, WIDTH)], "data batch 1 mixes input ids and hidden states"),
    ([], "no position to fit"),
])
def test_data_of_the_wrong_shape_is_refused_in_one_line(data, message):
    with pytest.raises(ValueError, match=message) as error:
        sohsm.hf.use_head(llama(), "self_organized", counts=counts(), data=data, progress=False)
    assert "\n" not in str(error.value)


def test_counts_of_the_wrong_length_and_a_bad_budget_are_refused():
    with pytest.raises(ValueError, match=rf"counts has {VOCAB - 2} entries but the model scores {VOCAB} tokens"):
        sohsm.hf.use_head(llama(), "self_organized", counts=counts(VOCAB - 2))
    with pytest.raises(ValueError, match="fit_seconds must be a positive number"):
        sohsm.hf.use_head(llama(), "self_organized", counts=counts(), fit_seconds=0)


# -- fine-tuning goes on as before ------------------------------------------------------------------------------
def test_a_converted_head_trains_under_the_trainer_re_clusters_and_saves(tmp_path):
    model = _pretrained()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=2,
                             data=[token_ids(8, 32, seed=s) for s in range(4)], fit_seconds=3, progress=False)
    rows = torch.randint(0, VOCAB, (16, 16), generator=torch.Generator().manual_seed(0))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, learning_rate=1e-3,
                             max_steps=4, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, save_strategy="no",
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in rows],
                      callbacks=[sohsm.hf.HeadCallback()])
    trainer.train()
    assert [record["step"] for record in head.history] == [2, 4]
    model.save_pretrained(tmp_path / "saved")
    loaded = sohsm.hf.load(tmp_path / "saved")
    again = sohsm.hf.head_of(loaded)
    assert torch.equal(again.assignment, head.assignment)
    ids = token_ids()
    model.eval()
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert math.isfinite(float(loaded(ids, labels=ids).loss))


def test_a_converted_head_starts_its_statistics_from_the_fit_and_moves_words_only_by_a_margin():
    """The self-organized head's ``q`` starts from what the fitted head predicts of each word under the trained layer
    (not the uniform "no information"), so a first re-clustering keeps the fitted clusters; its default margin
    (``stay_margin``) is saved with the options."""
    model = _pretrained()
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(),
                             data=[token_ids(8, 32, seed=s) for s in range(4)], fit_seconds=3, progress=False)
    uniform = -math.log2(head.n_clusters)
    tail = head.tail_words
    assert not torch.allclose(head.q[tail], torch.full_like(head.q[tail], uniform))
    assert bool((head.q[tail] <= 0).all())  # log2 of probabilities
    assert model.config.sohsm_head["options"]["stay_margin"] == sohsm.hf.pretrained.TAKEOVER_STAY_MARGIN
    assert head.reassign()["change_rate"] == 0.0  # from the seeded statistics alone: the fitted clusters hold
    fresh = sohsm.hf.use_head(_pretrained(), "self_organized", counts=counts())
    assert torch.allclose(fresh.q, torch.full_like(fresh.q, uniform))  # without data nothing to start from
