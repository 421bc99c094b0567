"""Pre-flight checks of the language model: a model that cannot fit in memory is refused before it is built."""
from __future__ import annotations

import pytest
import torch

from sohsm.tasks.lm import LMConfig as TrainConfig
from sohsm.tasks.lm.preflight import check_memory, estimate_bytes, format_bytes
from sohsm.train import apply_overrides


def test_memory_estimate_counts_parameters_gradients_and_optimizer_state():
    config = apply_overrides(TrainConfig(), {"head.name": "two_level_random", "model.emb_size": 10,
                                             "model.hidden_size": 20, "optim.optimizer": "adam"})
    n = 100
    params = n * 10 + (4 * 20 * (10 + 20) + 8 * 20) + n * 20 + 10 * 20
    assert estimate_bytes(config, n) == (params * 4 * 4, "parameters, gradients and optimizer state")


def test_an_impossible_model_is_refused_before_anything_is_allocated():
    config = apply_overrides(TrainConfig(), {"model.hidden_size": 1_000_000})
    with pytest.raises(ValueError, match=r"does not fit: .* TB, more than .* model.hidden_size=1000000"):
        check_memory(config, 10_000, torch.device("cpu"))
    check_memory(TrainConfig(), 10_000, torch.device("cpu"))  # the paper's model fits
    assert format_bytes(16.4e12) == "16.4 TB" and format_bytes(512) == "512 B"
