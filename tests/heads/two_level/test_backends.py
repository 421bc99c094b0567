"""The one table of in-cluster backends (sohsm.heads.two_level.ops.backends): names, defaults, what 'auto' reads."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sohsm.heads import TwoLevelSoftmax
from sohsm.heads.two_level.ops import backends
from sohsm.heads.two_level.ops.backends import BACKENDS, BackendInfo, register_backend, select_backend


def test_the_option_lists_auto_and_every_registered_backend():
    assert backends.backend_options() == ("auto", "per_cluster", "grouped_torch", "triton")
    for info in BACKENDS.values():
        assert info.fallback is None or info.fallback in BACKENDS


def test_each_device_type_has_at_most_one_default():
    seen = {}
    for info in BACKENDS.values():
        for device in info.default_devices:
            assert device not in seen, (device, seen[device], info.name)
            seen[device] = info.name
    assert seen == {backends.ANY_DEVICE: "per_cluster", "cuda": "triton"}


def test_a_taken_name_or_a_second_default_is_refused():
    per_cluster = BACKENDS["per_cluster"]
    with pytest.raises(ValueError, match="a backend named 'per_cluster' exists already"):
        register_backend(per_cluster)
    with pytest.raises(ValueError, match="a backend named 'auto' exists already"):
        register_backend(dataclasses.replace(per_cluster, name="auto", default_devices=()))
    with pytest.raises(ValueError, match="would both be the default on \\['cuda'\\]"):
        register_backend(dataclasses.replace(per_cluster, name="other", default_devices=("cuda",)))
    assert "other" not in BACKENDS


def test_auto_reads_the_table(monkeypatch):
    """A backend registered as the default of a device type is what 'auto' runs there, and a head trains on it."""
    calls = []

    def kernel(hidden, weight, row_cluster, row_position, layout, width, sink):
        calls.append(width)
        return BACKENDS["grouped_torch"].kernel(hidden, weight, row_cluster, row_position, layout, width, sink)

    table = dict(BACKENDS)
    monkeypatch.setattr(backends, "BACKENDS", table)
    table["per_cluster"] = dataclasses.replace(BACKENDS["per_cluster"], default_devices=("cuda",))
    register_backend(BackendInfo("recorded", kernel, devices=("cpu",), default_devices=("cpu",), sync_free=True,
                                 writes_gradient=False, description="a recording backend", fallback="per_cluster"))
    assert select_backend("auto", torch.device("cpu"), torch.float32).name == "recorded"
    assert select_backend("auto", torch.device("cpu"), torch.float32, sync_free=False).name == "per_cluster"
    assert select_backend("auto", torch.device("cuda"), torch.float32).name == "per_cluster"
    head = TwoLevelSoftmax(6, 30, n_clusters=5).double()
    hidden = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    target = torch.arange(8)
    out = head(hidden, target)
    out.loss.backward()
    assert calls == [head.cluster_sizes().max().item()]
    expected = head.log_prob(hidden.detach()).gather(1, target[:, None]).squeeze(1)
    torch.testing.assert_close(out.output.detach(), expected, rtol=0, atol=1e-12)
    assert head.weight.grad is not None and hidden.grad is not None
