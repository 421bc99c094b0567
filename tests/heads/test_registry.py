"""The head registry: names, building with options, errors."""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import FullSoftmax, Head, SelfOrganizedSoftmax, TwoLevelSoftmax, build_head, head_names, register_head
from sohsm.heads import registry

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
    assert so.update_every == 7 and so.smoothing == "paper_literal"
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


def test_registry_changes_in_tests_do_not_leak():
    assert "test_only_head" not in head_names() and "not_a_head" not in head_names()
