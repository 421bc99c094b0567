"""The run configuration: strict dicts and overrides, range checks, what a resume may change."""
from __future__ import annotations

import json

import pytest

from sohsm.fields import FieldError
from sohsm.tasks.lm.config import RESUMABLE_FIELDS, DataConfig, LMConfig as TrainConfig
from sohsm.train.config import DEFAULT_LR, HeadConfig, apply_overrides, config_differences


def test_learning_rate_follows_the_optimizer_unless_set():
    assert apply_overrides(TrainConfig(), {"optim.optimizer": "adam"}).optim.learning_rate == DEFAULT_LR["adam"]
    assert apply_overrides(TrainConfig(), {"optim.optimizer": "sgd", "optim.lr": 0.5}).optim.learning_rate == 0.5


def test_round_trip_through_json():
    c = TrainConfig(data=DataConfig(corpus="ptb", max_size=5000), head=HeadConfig(options={"gamma": 2.0}))
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize("data, match", [
    ({"bogus": 1}, "unknown config field.*bogus"),
    ({"optim": {"learning_rate": 1}}, "unknown config field.*optim.learning_rate"),
    ({"bptt": True}, "bptt must be int"),
    ({"bptt": 2.5}, "bptt must be int"),
    ({"optim": {"lr": "0.1"}}, "optim.lr must be float"),
    ({"model": 3}, "model must be a mapping"),
    ({"data": {"corpus": None}}, "data.corpus must be str"),
])
def test_from_dict_is_strict(data, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(data)


def test_ints_are_accepted_for_floats():
    assert TrainConfig.from_dict({"optim": {"lr": 1}}).optim.lr == 1.0


@pytest.mark.parametrize("overrides, match", [
    ({"optim.lrr": 0.1}, "unknown config field 'optim.lrr'"),
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"model.dropout": 1.0}, "model.dropout"),
    ({"head.name": "nope"}, "unknown head 'nope'"),
    ({"optim.optimizer": "rmsprop"}, "unknown optimizer"),
    ({"optim.clip": -1.0}, "optim.clip"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"time_budget": 0.0}, "time_budget"),
    ({"model.tie_weights": True, "model.emb_size": 64}, "tie_weights"),
    ({"device": "warp-drive"}, "device"),
    ({"head.options": {"update_every": 3}}, "head.update_every"),
    ({"optim.lr": float("inf")}, "optim.lr must be a finite number, got inf"),
    ({"optim.lr": float("nan")}, "optim.lr must be a finite number, got nan"),
    ({"optim.clip": float("inf")}, "optim.clip must be a finite number"),
    ({"optim.weight_decay": float("inf")}, "optim.weight_decay must be a finite number"),
    ({"optim.anneal": float("inf")}, "optim.anneal must be a finite number"),
    ({"time_budget": float("inf")}, "time_budget must be a finite number"),
])
def test_overrides_are_checked(overrides, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(TrainConfig(), overrides)


def test_differences_ignore_budgets_and_locations():
    saved = TrainConfig()
    assert config_differences(saved, {"epochs": 9, "max_tokens": 5, "data.data_dir": "/x", "device": "cpu"}) == []
    assert config_differences(saved, {"optim.lr": 0.1}) == []  # unset means 0.1 for Adagrad
    diffs = config_differences(saved, {"head.name": "full", "model.hidden_size": 512, "optim.clip": 0.25})
    assert diffs == ["head.name is 'self_organized' in the run, 'full' requested"]
    assert config_differences(saved, {"optim.lr": 0.2}) == ["optim.lr is 0.1 in the run, 0.2 requested"]
    assert "max_tokens" in RESUMABLE_FIELDS and "head.name" not in RESUMABLE_FIELDS




@pytest.mark.parametrize("overrides, tied", [
    ({}, True),  # the LSTM's emb 512 = hidden 512
    ({"model.hidden_size": 256}, False),  # emb stays 512: nothing to share
    ({"model.hidden_size": 256, "model.emb_size": 256}, True),
    ({"model.architecture": "transformer", "model.hidden_size": 256}, True),  # one width: emb follows hidden
    ({"model.architecture": "transformer", "model.emb_size": 128}, True),
    ({"model.tie_weights": False}, False),
])
@pytest.mark.parametrize("head", ["full", "two_level_random", "two_level_frequency", "self_organized", "adaptive"])
def test_a_new_run_ties_every_head_that_can_be_tied_where_the_sizes_allow(head, overrides, tied):
    """One rule for every head and model: tied where the head lends word vectors and emb_size = hidden_size."""
    config = TrainConfig.from_overrides({"data.corpus": "ptb", "head.name": head, **overrides})
    assert config.model.tie_weights is tied


@pytest.mark.parametrize("head, options", [
    ("tree_huffman", {}), ("tree", {}), ("importance_sampling", {}), ("nce", {}), ("dsoftmax", {}),
    ("self_organized", {"word_dim": 64}), ("two_level_frequency", {"word_dim": 128}),
])
def test_a_head_that_cannot_be_tied_is_untied_by_default_and_refused_when_asked(head, options):
    config = TrainConfig.from_overrides({"data.corpus": "ptb", "head.name": head, "head.options": options})
    assert config.model.tie_weights is False
    with pytest.raises(FieldError, match=f"head '{head}' cannot be tied"):
        TrainConfig.from_overrides({"data.corpus": "ptb", "head.name": head, "head.options": options,
                                    "model.tie_weights": True})


@pytest.mark.parametrize("head", ["adaptive", "two_level_frequency", "self_organized"])
def test_heads_with_differentiated_dimensions_tie_whatever_their_cutoffs_and_div_value(head):
    """Rare words' shorter vectors are read back up to d through their band's projection (adaptive input)."""
    config = TrainConfig.from_overrides({"data.corpus": "ptb", "head.name": head,
                                         "head.options": {"div_value": 2.0, "cutoffs": [100, 1000]}})
    assert config.model.tie_weights is True
