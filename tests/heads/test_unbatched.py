"""One unbatched hidden state (``[d]``) and a 0-dim target, as torch's ``AdaptiveLogSoftmaxWithLoss`` takes them: every
registered head answers in torch's shapes (a 0-dim output and loss), with the values of the same row given as a batch
of one. ``log_prob`` and ``predict`` answer as torch's do for that row, without its batch dimension (``[N]``, 0-dim):
torch 2.13's own take batches only (an unbatched state fails inside them)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sohsm.clustering.trees import random_tree, save_tree
from sohsm.heads import ClusteredHead, build_head, head_names

D, N = 16, 60


def make_head(name: str, tmp_path) -> nn.Module:
    """Head ``name`` at this file's sizes, in float64 (a tree file for ``tree_file``)."""
    options = {"adaptive": {"div_value": 2.0}, "self_organized": {"update_every": 0}}.get(name, {})
    if name == "tree_file":
        path = tmp_path / "tree.pt"
        save_tree(path, random_tree(N, torch.Generator().manual_seed(0)))
        options = {"path": str(path)}
    torch.manual_seed(0)
    return build_head(name, D, N, counts=torch.arange(N, 0, -1) * 5, **options).double()


@pytest.fixture(scope="module")
def torch_module() -> nn.AdaptiveLogSoftmaxWithLoss:
    torch.manual_seed(0)
    return nn.AdaptiveLogSoftmaxWithLoss(D, N, [N // 2], div_value=2.0).double()


@pytest.mark.parametrize("name", head_names())
def test_an_unbatched_row_gets_torchs_shapes_and_the_rows_values(name, torch_module, tmp_path):
    head = make_head(name, tmp_path).eval()
    torch.manual_seed(1)
    hidden, target = torch.randn(D, dtype=torch.float64), torch.tensor(7)
    theirs = torch_module(hidden, target)
    with torch.no_grad():
        ours = head(hidden, target)
        batch = head(hidden[None], target[None])
        assert ours.output.shape == theirs.output.shape == ()
        assert ours.loss.shape == theirs.loss.shape == ()
        torch.testing.assert_close(ours.output, batch.output[0])
        torch.testing.assert_close(ours.loss, batch.loss)
        log_prob = head.log_prob(hidden)
        assert log_prob.shape == torch_module.log_prob(hidden[None])[0].shape == (N,)
        torch.testing.assert_close(log_prob, head.log_prob(hidden[None])[0])
        torch.testing.assert_close(log_prob[7], ours.output)
        predicted = head.predict(hidden)
        assert predicted.shape == torch_module.predict(hidden[None])[0].shape == ()
        assert predicted.dtype == torch.long and int(predicted) == int(log_prob.argmax())
        values, ids = head.topk(hidden, 3)
        assert values.shape == ids.shape == (3,)
        torch.testing.assert_close(values, log_prob.topk(3).values)
        if isinstance(head, ClusteredHead):
            parts = head.score_parts(hidden, target)
            assert parts.cluster.shape == parts.in_cluster.shape == ()
            torch.testing.assert_close(parts.cluster + parts.in_cluster, ours.output)


@pytest.mark.parametrize("name", head_names())
def test_an_unbatched_row_trains(name, tmp_path):
    """In training mode too (a sampled head's objective): a 0-dim output whose loss has gradients."""
    head = make_head(name, tmp_path).train()
    hidden = torch.randn(D, dtype=torch.float64, requires_grad=True)
    output, loss = head(hidden, torch.tensor(3))
    assert output.shape == loss.shape == ()
    loss.backward()
    assert hidden.grad is not None and hidden.grad.shape == (D,) and bool(torch.isfinite(hidden.grad).all())


@pytest.mark.parametrize("name", ["full", "adaptive", "self_organized", "tree", "nce"])
def test_batches_keep_their_row_dimension(name, torch_module, tmp_path):
    """A batch of one stays a batch (``[1]``) as in torch; ``[*, d]`` still flattens; an unbatched state with a
    one-element target is read as a row (torch refuses it; sohsm reads any ``[*]`` target so)."""
    head = make_head(name, tmp_path).eval()
    hidden = torch.randn(1, D, dtype=torch.float64)
    with torch.no_grad():
        assert head(hidden, torch.tensor([2])).output.shape == torch_module(hidden, torch.tensor([2])).output.shape
        assert head.predict(hidden).shape == torch_module.predict(hidden).shape == (1,)
        assert head.log_prob(hidden).shape == torch_module.log_prob(hidden).shape == (1, N)
        assert head(torch.randn(2, 3, D, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.long)).output.shape == (6,)
        assert head(hidden[0], torch.tensor([2])).output.shape == (1,)
