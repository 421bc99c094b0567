"""The one head builder of every task: head, options and seed from a run config."""
from __future__ import annotations

import pytest
import torch

from small_run import small_config, small_vocab
from sohsm.tasks.heads import build_run_head


@pytest.fixture
def vocab():
    return small_vocab()


def test_the_runs_seed_draws_the_random_clusters(vocab):
    a = build_run_head(small_config(**{"head.name": "two_level_random", "seed": 1}), vocab).assignment
    b = build_run_head(small_config(**{"head.name": "two_level_random", "seed": 1}), vocab).assignment
    c = build_run_head(small_config(**{"head.name": "two_level_random", "seed": 2}), vocab).assignment
    assert torch.equal(a, b) and not torch.equal(a, c)
    head = build_run_head(small_config(**{"head.name": "self_organized", "head.update_every": 7}), vocab)
    assert head.update_every == 7 and int(head.counts[0]) == int(vocab.counts[0])


def test_options_a_head_does_not_take(vocab):
    with pytest.raises(ValueError, match="head 'full' has no option 'update_every'; its options: bias"):
        build_run_head(small_config(**{"head.update_every": 7}), vocab)
    with pytest.raises(ValueError, match="gamma"):
        build_run_head(small_config(**{"head.options": {"gamma": 2.0}}), vocab)
    head = build_run_head(small_config(**{"head.name": "self_organized", "head.options": {"gamma": 2.0}}), vocab)
    assert head.reclustering.gamma == 2.0


def test_clusters_given_to_a_self_organized_head_are_all_its_clusters(vocab):
    """A language model's clusters (its one-word shortlist clusters among them) are the head's, none added: the
    head once put its own shortlist on top (a run of 288 clusters gave a summariser 432, a third of them empty)."""
    n = len(vocab)
    clusters = torch.arange(n) % 5
    head = build_run_head(small_config(**{"head.name": "self_organized"}), vocab, clusters=clusters)
    assert head.n_clusters == 5 and torch.equal(head.assignment, clusters)
    assert int((torch.bincount(head.assignment, minlength=head.n_clusters) == 0).sum()) == 0
