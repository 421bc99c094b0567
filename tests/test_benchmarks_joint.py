"""benchmarks/joint_assignment.py: its in-cluster estimates against a dense float64 reference, and its ordered
placement against Algorithm 1 where the in-cluster term cannot change a choice."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from sohsm.clustering.assignments import greedy_assignment

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def joint():
    spec = importlib.util.spec_from_file_location("joint_assignment", ROOT / "benchmarks" / "joint_assignment.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["joint_assignment"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("joint_assignment", None)


def _head(joint, **options):
    torch.manual_seed(0)
    n, d = 300, 8
    counts = (1000.0 / torch.arange(1, n + 1)).round() + 1
    with pytest.warns(UserWarning, match="without an attached optimizer"):
        head = joint.JointSelfOrganizedSoftmax(d, n, counts=counts, update_every=1000, **options).double()
        head.train()
        hidden, target = torch.randn(40, d, dtype=torch.float64), torch.randint(0, n, (40,))
        torch.manual_seed(1)
        head(hidden, target)
    return head, hidden, target


def test_separable_in_cluster_terms_match_a_dense_reference(joint):
    head, hidden, target = _head(joint, mode="separable", sample=40)
    torch.manual_seed(1)
    keep = torch.randperm(40)[:40]  # the sample the head drew
    hidden, target = hidden[keep], target[keep]
    with torch.no_grad():
        scores = (head._split_hidden(hidden)[1] @ head.weight.T)[:, head._layout.slot_of_word]  # [m, N], word order
    expected = torch.zeros_like(head.joint_sum)
    for i, w in enumerate(target.tolist()):
        for c in range(head.shortlist, head.n_clusters):
            mates = [m for m in (head.assignment == c).nonzero().squeeze(1).tolist() if m != w]
            log_z = torch.logsumexp(torch.cat([scores[i, mates], scores[i, w:w + 1]]), 0)
            expected[w, c - head.shortlist] += float(scores[i, w] - log_z) / math.log(2)
    torch.testing.assert_close(head.joint_sum, expected, rtol=0, atol=1e-10)
    assert head.joint_count.sum() == 40


def test_ordered_placement_is_algorithm_1_where_the_in_cluster_term_cannot_change_a_choice(joint):
    head, _, _ = _head(joint, mode="ordered", sample=40, beta=1e-12)
    head.q = torch.randn(head.q.shape, generator=torch.Generator().manual_seed(5)) * 10  # distinct scores
    tail = head.tail_words
    counts = head.counts.double()
    expected = greedy_assignment(head.q[tail], (counts / counts.sum())[tail], head.max_cluster_size,
                                 head.reclustering.freq_budget).assignment + head.shortlist
    record = head.reassign()
    assert torch.equal(head.assignment[tail], expected)
    assert record["joint_words"] > 0 and not head.kept


def test_importing_the_benchmark_registers_no_head(joint):
    from sohsm.heads import head_names

    assert "self_organized_joint" not in head_names()
