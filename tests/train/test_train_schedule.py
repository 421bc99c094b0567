"""The learning-rate schedule (warm-up, cosine) and the transformer's optimizer: AdamW, decay on its linear maps."""
from __future__ import annotations

import math

import pytest
import torch

from small_run import small_config, small_vocab
from sohsm.tasks.lm import build_model_and_head
from sohsm.train import apply_overrides, build_optimizer
from sohsm.train.schedule import COSINE_FLOOR, planned_steps, schedule_factor


def test_warmup_rises_linearly_to_the_full_rate():
    assert [schedule_factor("constant", s, 4, 100) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [schedule_factor("constant", s, 0, 100) for s in (0, 50, 500)] == [1.0, 1.0, 1.0]


def test_cosine_falls_from_the_full_rate_to_the_floor_at_the_last_planned_step():
    total, warmup = 102, 1
    factors = [schedule_factor("cosine", s, warmup, total) for s in range(total + 5)]
    assert factors[0] == 1.0 and factors[1] == 1.0  # the warm-up's one step, then the cosine's top
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))  # never rises
    assert factors[51] == pytest.approx((1 + COSINE_FLOOR) / 2)  # halfway: the mean of the top and the floor
    assert factors[total - 1] == pytest.approx(COSINE_FLOOR) and factors[-1] == pytest.approx(COSINE_FLOOR)


def test_a_schedule_is_a_function_of_the_step_alone():
    """What exact resume needs: no state, the same factor for the same step whenever it is asked."""
    first = [schedule_factor("cosine", s, 10, 200) for s in range(200)]
    assert first == [schedule_factor("cosine", s, 10, 200) for s in range(200)]
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        schedule_factor("linear", 0, 0, 10)


def test_planned_steps_count_whole_epochs_and_full_steps_of_the_last():
    assert planned_steps(1000, 400, 4, 100) == 10
    assert planned_steps(400, 390, 4, 100) == 5  # 4 steps (the last short) then one of the 10 tokens left
    assert planned_steps(250, 400, 4, 100) == 3 and planned_steps(1, 400, 4, 100) == 1


@pytest.mark.parametrize("overrides, match", [
    ({"optim.lr_schedule": "linear"}, "optim.lr_schedule must be one of constant, cosine"),
    ({"optim.warmup": -1}, "optim.warmup must be >= 0"),
])
def test_schedule_settings_are_checked(overrides, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(small_config(), overrides)


def test_the_transformer_trains_with_fused_adamw_and_decays_its_linear_maps_only():
    config = small_config(**{"model.architecture": "transformer", "model.attention_heads": 2,
                             "optim.optimizer": "adamw", "optim.weight_decay": 0.1})
    model, head = build_model_and_head(config, small_vocab())
    optimizer = build_optimizer(config, model, head)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True  # CPU fuses AdamW
    decay, rest = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0 and math.isclose(rest["lr"], 1e-3)
    assert {id(p) for p in decay["params"]} == {id(p) for p in model.decayed_parameters()}
    names = {id(p): n for n, p in [*model.named_parameters(), *(("head." + n, p) for n, p in head.named_parameters())]}
    assert not any("embedding" in names[id(p)] or "norm" in names[id(p)] for p in decay["params"])
    assert {id(p) for p in head.parameters()} <= {id(p) for p in rest["params"]}
