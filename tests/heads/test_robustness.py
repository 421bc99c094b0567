"""Every head against bad numbers: counts, sizes, empty batches, NaN hidden states, repeated attach."""
from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TwoLevelSoftmax, build_head, head_names

D, N = 6, 30


def _counts() -> torch.Tensor:
    return torch.arange(N, 0, -1, dtype=torch.long) * 3


# -- counts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("bad, match", [
    (torch.full((N,), float("nan")), "finite"),
    (torch.cat([torch.ones(N - 1), torch.tensor([float("inf")])]), "finite"),
    (torch.cat([torch.ones(N - 1), torch.tensor([-2.0])]), "non-negative"),
    (torch.ones(N + 1), r"counts must have one entry per word, shape \[30\], got \(31,\)"),
    (torch.ones(N - 1, dtype=torch.long), "counts must have one entry per word"),
])
def test_bad_counts_are_refused_alike_by_every_head(name, bad, match):
    with pytest.raises(ValueError, match=match):
        build_head(name, D, N, counts=bad)


@pytest.mark.parametrize("make", [
    lambda counts: TwoLevelSoftmax(D, N, assignment="frequency", counts=counts),
    lambda counts: SelfOrganizedSoftmax(D, N, counts=counts),
])
@pytest.mark.parametrize("bad, match", [
    (torch.full((N,), float("nan")), "finite"),
    (-torch.ones(N), "non-negative"),
    (torch.ones(N + 2), "counts must have one entry per word"),
])
def test_bad_counts_are_refused_by_the_constructors(make, bad, match):
    with pytest.raises(ValueError, match=match):
        make(bad)


def test_the_error_names_the_word_with_the_bad_count():
    counts = _counts().double()
    counts[7] = float("nan")
    with pytest.raises(ValueError, match="word 7"):
        build_head("self_organized", D, N, counts=counts)


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("n_classes", [10.5, "10", True, 10.0])
def test_a_vocabulary_size_that_is_no_integer_is_refused(name, n_classes):
    with pytest.raises(ValueError, match=r"n_classes.*integer"):
        build_head(name, D, n_classes)


@pytest.mark.parametrize("cls", [TwoLevelSoftmax, SelfOrganizedSoftmax])
def test_a_vocabulary_size_that_is_no_integer_is_refused_by_the_classes(cls):
    for n_classes in (10.5, "10"):
        with pytest.raises(ValueError, match=r"n_classes.*integer"):
            cls(D, n_classes)
    with pytest.raises(ValueError, match=r"in_features.*integer"):
        cls(6.5, N)


def test_integer_like_sizes_are_accepted():
    import numpy as np

    head = build_head("full", np.int64(D), torch.tensor(N))
    assert (head.in_features, head.n_classes) == (D, N) and type(head.n_classes) is int


# -- empty batches ----------------------------------------------------------------------------------
#: options some heads need at this test's small sizes; tree_file needs a tree file (its empty-batch
#: behaviour is that of tree_huffman, the same class)
_SMALL_OPTIONS = {"adaptive": {"div_value": 2.0}}


@pytest.mark.parametrize("name", [n for n in head_names() if n != "tree_file"])
def test_topk_and_predict_of_an_empty_batch_are_empty(name):
    head = build_head(name, D, N, counts=_counts(), **_SMALL_OPTIONS.get(name, {})).eval()
    hidden = torch.randn(0, D)
    values, indices = head.topk(hidden, 3)
    assert values.shape == (0, 3) and indices.shape == (0, 3) and indices.dtype == torch.long
    predicted = head.predict(hidden)
    assert predicted.shape == (0,) and predicted.dtype == torch.long
    assert head.log_prob(hidden).shape == (0, N)
    expected = head.log_prob(torch.randn(0, D)).topk(3, dim=1)  # what the dense reference gives
    assert values.dtype == expected.values.dtype


# -- a NaN hidden row -------------------------------------------------------------------------------
def test_a_nan_hidden_row_does_not_poison_q():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=0))
    hidden = torch.randn(4, D)
    hidden[1] = float("nan")
    target = torch.tensor([3, 5, 3, 8])
    head(hidden, target)
    assert torch.isfinite(head.q).all()
    reference = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=0))
    reference.load_state_dict({k: v for k, v in head.state_dict().items() if k != "q"}, strict=False)
    reference.q.copy_(torch.full_like(reference.q, -math.log2(reference.n_clusters)))
    keep = torch.tensor([0, 2, 3])
    reference(hidden[keep], target[keep])  # the same batch without the NaN row
    assert torch.allclose(head.q, reference.q)


def test_an_all_nan_batch_leaves_q_as_it_was():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=0))
    before = head.q.clone()
    head(torch.full((3, D), float("nan")), torch.tensor([1, 2, 3]))
    assert torch.equal(head.q, before)


# -- attach -------------------------------------------------------------------------------------------
def test_attaching_one_optimizer_twice_counts_each_step_once():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=4))
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    first = head.attach(optimizer)
    assert head.attach(optimizer) is first
    for _ in range(4):
        head(torch.randn(5, D), torch.randint(0, N, (5,))).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert int(head.steps) == 4
    assert [r["step"] for r in head.history] == [4]  # one re-clustering after K = 4 steps, not two


def test_attached_optimizers_are_held_weakly():
    head = SelfOrganizedSoftmax(D, N, counts=_counts(), reclustering=Reclustering(update_every=4))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    alive = weakref.ref(optimizer)
    del optimizer
    gc.collect()
    assert alive() is None and len(head._optimizers) == 0
    second = torch.optim.Adagrad(head.parameters(), lr=0.1)  # a re-built optimizer attaches as usual
    head.attach(second)
    assert list(head._optimizers) == [second]
