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


def test_each_head_says_what_a_step_holds_besides_its_parameters():
    """The head, not the pre-flight check, knows its memory: against the two-level head (word and cluster vectors),
    the full softmax has no clusters but its logits and their gradient, the self-organized head adds its statistics
    q (N x ceil(sqrt(N)) float32), adaptive softmax is counted by its word vectors alone."""
    base = {"model.emb_size": 20, "model.hidden_size": 20, "model.tie_weights": False, "optim.optimizer": "adam"}
    config = apply_overrides(TrainConfig(), {**base, "head.name": "two_level_random"})
    plain = estimate_bytes(config, 100)[0]
    clusters, rows = 10 * 20 * 4 * 4, config.bptt * config.batch_size  # 10 cluster vectors, their grads and Adam's
    expected = {"full": (plain - clusters + 2 * rows * 100 * 4, "output logits"),
                "self_organized": (plain + 100 * 10 * 4, "statistics q"),
                "adaptive": (plain - clusters, "optimizer state")}
    for head, (total, covers) in expected.items():
        got = estimate_bytes(apply_overrides(TrainConfig(), {**base, "head.name": head}), 100)
        assert got[0] == total and got[1].endswith(covers), head


def test_tied_runs_count_the_shared_word_vectors_once():
    base = {"model.emb_size": 20, "model.hidden_size": 20, "optim.optimizer": "adam", "head.name": "full"}
    tied = estimate_bytes(apply_overrides(TrainConfig(), {**base, "model.tie_weights": True}), 100)[0]
    untied = estimate_bytes(apply_overrides(TrainConfig(), {**base, "model.tie_weights": False}), 100)[0]
    assert untied - tied == 100 * 20 * 4 * 4
