"""The baseline heads in the registry: names, explicit option signatures, what their loss is."""
from __future__ import annotations

import inspect

import pytest
import torch

from sohsm.heads import (
    AdaptiveSoftmax,
    BinaryTreeSoftmax,
    DifferentiatedSoftmax,
    FullSoftmax,
    Head,
    ImportanceSamplingSoftmax,
    NCESoftmax,
    PMISoftmax,
    build_head,
    head_names,
    head_options,
)
from sohsm.heads.registry import _REGISTRY

D, N = 16, 30
BASELINES = {
    "adaptive": (AdaptiveSoftmax, "nll", {"cutoffs", "div_value", "head_bias"}),
    "tree_huffman": (BinaryTreeSoftmax, "nll", {"sparse"}),
    "tree_random": (BinaryTreeSoftmax, "nll", {"sparse"}),
    "importance_sampling": (ImportanceSamplingSoftmax, "importance_sampling",
                            {"n_samples", "noise_power", "bias", "remove_accidental_hits", "sparse", "noise_per_row"}),
    "nce": (NCESoftmax, "nce", {"n_samples", "noise_power", "sparse", "bias_init", "noise_per_row"}),
    "pmi": (PMISoftmax, "negative_sampling", {"n_samples", "noise_power", "sparse", "shift", "noise_per_row"}),
    "dsoftmax": (DifferentiatedSoftmax, "nll", {"cutoffs", "dims", "bias"}),
}


#: baselines that draw nothing at random, so take no seed
UNSEEDED = {"adaptive", "dsoftmax"}


def test_baselines_are_registered_with_explicit_options():
    assert set(BASELINES) <= set(head_names())
    for name, (_, _, options) in BASELINES.items():
        parameters = inspect.signature(_REGISTRY[name].factory).parameters
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()), name
        # a head takes a seed only where it draws something at random (adaptive and dsoftmax draw nothing)
        assert set(head_options(name)) == ({"seed"} if name not in UNSEEDED else set()) | options, name
    assert set(head_options("tree_file")) == {"path", "sparse"}  # built in test_bootstrap_tree.py


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_build_and_one_training_step(name):
    cls, objective, _ = BASELINES[name]
    counts = torch.arange(N, 0, -1)
    head = build_head(name, D, N, counts=counts, **({"seed": 1} if "seed" in head_options(name) else {}))
    assert isinstance(head, cls) and isinstance(head, Head) and head.objective == objective
    assert head.loss_is_nll == (objective == "nll")
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    output, loss = head(torch.randn(5, D), torch.tensor([0, 3, 7, N - 1, 3]))
    assert output.shape == (5,) and loss.shape == () and torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    head.eval()
    assert head.loss_is_nll
    assert head(torch.randn(2, D), torch.tensor([1, 2])).output.shape == (2,)


def test_exact_heads_say_their_loss_is_the_nll():
    head = FullSoftmax(D, N)
    assert head.objective == "nll" and head.loss_is_nll
    head.eval()
    assert head.loss_is_nll
