"""The run configuration: the paper's defaults, strict dicts and overrides, range checks."""
from __future__ import annotations

import json

import pytest

from sohsm.tasks.lm.config import RESUMABLE_FIELDS, DataConfig, LMConfig as TrainConfig
from sohsm.train.config import DEFAULT_LR, HeadConfig, apply_overrides, config_differences


def test_defaults_are_the_papers_text8_setting():
    c = TrainConfig()
    assert c.data.corpus == "text8" and c.head.name == "self_organized"
    assert (c.model.emb_size, c.model.hidden_size, c.model.layers) == (512, 512, 1)
    assert c.optim.optimizer == "adagrad" and c.optim.learning_rate == 0.1
    assert c.optim.clip == 0.25 and c.optim.weight_decay == 1e-6
    assert (c.bptt, c.batch_size, c.epochs) == (20, 128, 5)
    assert c.head.update_every is None  # the head's own default K = 1000


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


def test_a_config_saved_before_the_fused_step_keeps_the_behaviour_it_was_trained_with():
    """Runs saved before `optim.fused` existed used torch's default step and no shortlist: they keep both."""
    from sohsm.tasks.lm import LMConfig

    saved = LMConfig().to_dict()
    del saved["optim"]["fused"]
    del saved["task"]
    saved["head"] = {"name": "self_organized", "update_every": None, "options": {"gamma": 2.0}}
    config = LMConfig.from_saved(saved)
    assert config.optim.fused is False and config.head.options == {"gamma": 2.0, "shortlist": 0}
    saved["head"]["options"] = {"shortlist": 5}  # an explicit choice stays
    assert LMConfig.from_saved(saved).head.options == {"shortlist": 5}
    current = LMConfig().to_dict()  # a config of this version is read as it is
    assert LMConfig.from_saved(current) == LMConfig.from_dict(current)
    assert LMConfig.from_saved(current).optim.fused is True
