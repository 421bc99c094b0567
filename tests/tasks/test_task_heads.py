"""The one head builder of every task: head, options and seed from a run config."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sohsm.data import Vocabulary
from sohsm.tasks.heads import build_run_head
from sohsm.tasks.lm import LMConfig as TrainConfig
from sohsm.train import apply_overrides

WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(48)]


@pytest.fixture
def vocab():
    counts = np.arange(len(WORDS), 0, -1) * 3
    return Vocabulary(WORDS, counts)


def _config(**overrides):
    base = {"model.emb_size": 8, "model.hidden_size": 8, "head.name": "full"}
    base.update(overrides)
    return apply_overrides(TrainConfig(), base)


def test_the_runs_seed_draws_the_random_clusters(vocab):
    a = build_run_head(_config(**{"head.name": "two_level_random", "seed": 1}), vocab).assignment
    b = build_run_head(_config(**{"head.name": "two_level_random", "seed": 1}), vocab).assignment
    c = build_run_head(_config(**{"head.name": "two_level_random", "seed": 2}), vocab).assignment
    assert torch.equal(a, b) and not torch.equal(a, c)
    head = build_run_head(_config(**{"head.name": "self_organized", "head.update_every": 7}), vocab)
    assert head.update_every == 7 and int(head.counts[0]) == int(vocab.counts[0])


def test_options_a_head_does_not_take(vocab):
    with pytest.raises(ValueError, match="head 'full' has no option 'update_every'; its options: bias"):
        build_run_head(_config(**{"head.update_every": 7}), vocab)
    with pytest.raises(ValueError, match="gamma"):
        build_run_head(_config(**{"head.options": {"gamma": 2.0}}), vocab)
    head = build_run_head(_config(**{"head.name": "self_organized", "head.options": {"gamma": 2.0}}), vocab)
    assert head.gamma == 2.0
