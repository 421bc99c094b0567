"""Heads under autograd's features: activation checkpointing, hooks on the weight, torch.compile."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TreeSoftmax, TwoLevelSoftmax, head_names

from .test_precision import make_head

D, N, B = 16, 60, 48


# -- activation checkpointing --------------------------------------------------------------------
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_updates_the_statistics_once_per_step(reentrant):
    """The forward recomputed during backward must not fold the batch into q a second time."""
    heads = [SelfOrganizedSoftmax(D, N, counts=torch.arange(N, 0, -1),
                                  reclustering=Reclustering(update_every=0)) for _ in range(2)]
    heads[1].load_state_dict(heads[0].state_dict())
    hidden, target = torch.randn(B, D), torch.randint(0, N, (B,))
    grads = []
    for head, checkpointed in zip(heads, (False, True)):
        h = hidden.clone().requires_grad_()
        if checkpointed:
            loss = checkpoint(lambda x, t: head(x, t).loss, h, target, use_reentrant=reentrant)
        else:
            loss = head(h, target).loss
        loss.backward()
        grads.append((h.grad, head.weight.grad, head.cluster_weight.grad))
    assert heads[1].tokens_seen == heads[0].tokens_seen == B
    assert torch.equal(heads[1].q, heads[0].q)
    for g_checkpointed, g_plain in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_checkpointed, g_plain)


# -- hooks on the weight ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TwoLevelSoftmax, TreeSoftmax])
def test_hooks_on_a_weight_whose_gradient_the_head_writes(cls):
    """Documented in TwoLevelSoftmax and TreeSoftmax: a tensor hook gets ``None`` (the gradient goes straight
    into ``weight.grad``); a post-accumulate-grad hook runs once ``weight.grad`` holds the batch's gradient."""
    head = cls(D, N)
    seen = []
    head.weight.register_hook(lambda grad: seen.append(("tensor hook", grad)))
    head.weight.register_post_accumulate_grad_hook(lambda p: seen.append(("post accumulate", p.grad.clone())))
    head(torch.randn(B, D), torch.randint(0, N, (B,))).loss.backward()
    assert [kind for kind, _ in seen] == ["tensor hook", "post accumulate"]
    assert seen[0][1] is None
    assert torch.equal(seen[1][1], head.weight.grad) and seen[1][1].abs().sum() > 0


# -- torch.compile ----------------------------------------------------------------------------------
def _loss_and_grads(head, hidden, target):
    h = hidden.clone().requires_grad_()
    loss = head(h, target).loss
    loss.backward()
    return [loss.detach(), h.grad] + [p.grad for p in head.parameters()]


@pytest.mark.parametrize("name", head_names())
def test_compiled_head_gives_the_eager_loss_and_gradients(name, tmp_path):
    """``aot_eager`` traces with dynamo and AOT autograd as inductor does, without compiling C++."""
    torch._dynamo.reset()
    eager, compiled = make_head(name, tmp_path), make_head(name, tmp_path)
    compiled.check_targets = False  # the host-side check would break the graph
    compiled_call = torch.compile(compiled, backend="aot_eager")
    for step in range(2):  # a second batch with other clusters: no stale graph
        torch.manual_seed(step)
        hidden, target = torch.randn(B, D), torch.randint(0, N, (B,))
        for g_eager, g_compiled in zip(_loss_and_grads(eager, hidden, target),
                                       _loss_and_grads(compiled_call, hidden, target)):
            if g_eager is None:
                assert g_compiled is None
                continue
            g_eager = g_eager.to_dense() if g_eager.is_sparse else g_eager
            g_compiled = g_compiled.to_dense() if g_compiled.is_sparse else g_compiled
            torch.testing.assert_close(g_compiled, g_eager, rtol=1e-5, atol=1e-6)
        for head in (eager, compiled):
            head.zero_grad()
    if name == "self_organized":
        torch.testing.assert_close(compiled.q, eager.q)


def test_two_level_head_compiles_with_one_eager_region():
    """The per-cluster kernel runs eagerly (``torch.compiler.disable``); the rest is one graph each side."""
    torch._dynamo.reset()
    head = SelfOrganizedSoftmax(D, N, projection=True, reclustering=Reclustering(update_every=0))
    head.check_targets = False
    explanation = torch._dynamo.explain(head)(torch.randn(B, D), torch.randint(0, N, (B,)))
    assert explanation.graph_break_count <= 2, [r.reason for r in explanation.break_reasons]
