"""The head registry: names, building with options, errors."""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import (
    FullSoftmax,
    Head,
    SelfOrganizedSoftmax,
    TwoLevelSoftmax,
    build_head,
    head_names,
    head_options,
    register_head,
    registry,
)

D, N = 4, 25


def test_built_in_heads_are_registered():
    names = head_names()
    assert names == sorted(names)
    assert {"full", "two_level_random", "two_level_frequency", "self_organized"} <= set(names)


def test_build_head_builds_each_kind_with_options():
    counts = torch.arange(N, 0, -1)
    full = build_head("full", D, N, bias=True)
    assert isinstance(full, FullSoftmax) and full.bias is not None
    random_head = build_head("two_level_random", D, N, counts=counts, projection=False, seed=3)
    assert isinstance(random_head, TwoLevelSoftmax) and random_head.projection is None
    assert torch.equal(random_head.assignment, TwoLevelSoftmax(D, N, seed=3).assignment)
    freq = build_head("two_level_frequency", D, N, counts=counts, n_clusters=4)
    assert freq.n_clusters == 4
    assert freq.assignment[0] == 0 and freq.assignment[-1] == 3  # most frequent word first
    so = build_head("self_organized", D, N, counts=counts, update_every=7, smoothing="paper_literal")
    assert isinstance(so, SelfOrganizedSoftmax)
    assert so.update_every == 7 and so.reclustering.smoothing == "paper_literal"
    assert torch.equal(so.counts, counts)
    for head in (full, random_head, freq, so):
        head.eval()  # no q statistics (and no 'unattached optimizer' warning) for this smoke check
        assert isinstance(head, Head) and head.in_features == D and head.n_classes == N
        out = head(torch.randn(3, D), torch.tensor([0, 5, N - 1]))
        assert out.output.shape == (3,) and torch.isfinite(out.loss)


def test_unknown_head_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown head 'softmax'") as info:
        build_head("softmax", D, N)
    for name in head_names():
        assert name in str(info.value)


def test_frequency_head_without_counts_is_an_error():
    with pytest.raises(ValueError, match="counts"):
        build_head("two_level_frequency", D, N)


def test_duplicate_name_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError, match="already registered"):
        register_head("full")(lambda in_features, n_classes, counts=None: FullSoftmax(in_features, n_classes))

    @register_head("test_only_head")
    def _factory(in_features, n_classes, counts=None, **options):
        return FullSoftmax(in_features, n_classes)

    assert "test_only_head" in head_names()
    with pytest.raises(ValueError, match="already registered"):
        register_head("test_only_head")(_factory)
    assert isinstance(build_head("test_only_head", D, N), FullSoftmax)


def test_factory_must_return_a_head(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_head("not_a_head")(lambda in_features, n_classes, counts=None: torch.nn.Linear(in_features, n_classes))
    with pytest.raises(TypeError, match="not a Head"):
        build_head("not_a_head", D, N)
    with pytest.raises(TypeError, match="callable"):
        register_head("not_callable")(42)



def test_each_head_lists_its_options():
    assert set(head_options("full")) == {"bias"}
    for name in ("two_level_random", "two_level_frequency"):
        # assignment: the factory's
        assert set(head_options(name)) == {"backend", "cluster_bias", "cutoffs", "div_value", "n_clusters",
                                           "projection", "seed", "word_dim"}
    so = head_options("self_organized")
    assert {"n_clusters", "gamma", "freq_budget", "update_every", "init", "smoothing", "projection", "seed",
            "reclusters_per_epoch"} <= set(so)
    assert so["gamma"].default == 1.5 and so["gamma"].type is float
    with pytest.raises(ValueError, match="unknown head"):
        head_options("softmax")


def test_an_option_the_head_does_not_take_names_the_head_and_its_options():
    with pytest.raises(ValueError, match=r"^head 'full' has no option 'gamma'; its options: bias$"):
        build_head("full", D, N, gamma=2.0)
    with pytest.raises(ValueError, match="head 'two_level_random' has no option 'assignment'"):
        build_head("two_level_random", D, N, assignment="frequency")
    with pytest.raises(ValueError, match="has no option 'seed'"):
        build_head("full", D, N, seed=1)


@pytest.mark.parametrize("options, message", [
    ({"gamma": "abc"}, r"option gamma must be float, got 'abc' \(str\)"),
    ({"n_clusters": 2.5}, r"option n_clusters must be int or None, got 2.5"),
    ({"projection": 1}, r"option projection must be bool, got 1"),
    ({"update_every": True}, r"option update_every must be int or None, got True"),
])
def test_a_value_of_the_wrong_type_is_refused_before_building(options, message):
    with pytest.raises(ValueError, match="head 'self_organized': " + message):
        build_head("self_organized", D, N, counts=torch.arange(N, 0, -1), **options)


def test_values_out_of_range_are_the_heads_own_errors():
    with pytest.raises(ValueError, match="gamma must be positive"):
        build_head("self_organized", D, N, gamma=-1)  # an int is a fine float
    assert build_head("self_organized", D, N, gamma=2, n_clusters=None).reclustering.gamma == 2.0


def test_a_factory_without_a_class_passes_options_through(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_head("open_head")
    def _open(in_features, n_classes, counts=None, **options):
        return FullSoftmax(in_features, n_classes, **options)

    @register_head("closed_head")
    def _closed(in_features, n_classes, counts=None, bias: bool = False):
        return FullSoftmax(in_features, n_classes, bias=bias)

    assert head_options("open_head") is None
    assert build_head("open_head", D, N, bias=True).bias is not None
    assert set(head_options("closed_head")) == {"bias"}
    with pytest.raises(ValueError, match="head 'closed_head' has no option 'gamma'"):
        build_head("closed_head", D, N, gamma=1.0)


def test_registry_changes_in_tests_do_not_leak():
    assert not {"test_only_head", "not_a_head", "open_head", "closed_head"} & set(head_names())


def test_a_head_says_whether_its_loss_splits_into_logistic_decisions():
    """word2vec's hand-written loop asks the head (``binary_pairs``), never its class."""
    counts = list(range(40, 0, -1))
    assert build_head("tree_huffman", 8, 40, counts=counts).binary_pairs == "paths"
    assert build_head("pmi", 8, 40, counts=counts, noise_per_row=True).binary_pairs == "noise"
    assert build_head("pmi", 8, 40, counts=counts).binary_pairs is None  # noise shared by the batch's rows
    for name in ("full", "self_organized", "adaptive", "nce"):
        assert build_head(name, 32, 40, counts=counts).binary_pairs is None, name
