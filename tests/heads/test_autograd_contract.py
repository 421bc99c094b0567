"""Autograd's contract for every head: ``autograd.grad`` writes no ``.grad`` and returns what it is asked for, and
``torch.func.functional_call`` computes with the tensors it is given (the heads that write their weight's gradient
themselves included: their sink serves ``backward()`` only)."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from sohsm.heads import head_names

from .test_precision import B, D, N, make_head


def _dense(grad):
    return grad.to_dense() if grad is not None and grad.is_sparse else grad


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, generator=g), torch.randint(0, N, (B,), generator=g)


def _backward_grads(head, hidden, target):
    """``(hidden's gradient, every parameter's)`` from a plain ``backward()``: the reference."""
    h = hidden.clone().requires_grad_()
    head(h, target).loss.backward()
    return h.grad, {name: _dense(p.grad) for name, p in head.named_parameters()}


def _no_grad_written(head) -> list[str]:
    return [name for name, p in head.named_parameters() if p.grad is not None]


@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("training", [True, False])
def test_autograd_grad_of_the_inputs_writes_no_grad_and_a_later_backward_is_exact(name, training, tmp_path):
    """An input-gradient pass (gradient penalty, adversarial step) before the step's ``backward()`` must leave
    ``.grad`` alone: the step's gradients are then those of the ``backward()`` alone, not twice the weight's."""
    hidden, target = _inputs()
    head = make_head(name, tmp_path).train(training)
    h = hidden.clone().requires_grad_()
    torch.manual_seed(2)  # a sampled head draws its noise from torch's generator
    (grad_h,) = torch.autograd.grad(head(h, target).loss, [h])
    assert grad_h.shape == h.shape and torch.isfinite(grad_h).all()
    assert _no_grad_written(head) == [], name
    if training and head.objective != "nll":
        return  # a sampled objective draws other noise each forward: the exact comparison is for exact losses
    torch.manual_seed(2)
    _, after = _backward_grads(head, hidden, target)
    reference = make_head(name, tmp_path).train(training)
    torch.manual_seed(2)
    _, alone = _backward_grads(reference, hidden, target)
    for key, grad in alone.items():
        if grad is None:
            assert after[key] is None, key
        else:
            torch.testing.assert_close(after[key], grad, msg=f"{name}: {key}")


@pytest.mark.parametrize("name", head_names())
def test_autograd_grad_returns_every_parameter_gradient_and_writes_none(name, tmp_path):
    """``autograd.grad(loss, [hidden, *parameters])`` gives what ``backward()`` would have put in ``.grad``."""
    hidden, target = _inputs()
    head = make_head(name, tmp_path).eval()
    ref_h, ref = _backward_grads(make_head(name, tmp_path).eval(), hidden, target)
    h = hidden.clone().requires_grad_()
    names, params = zip(*[(k, p) for k, p in head.named_parameters() if p.requires_grad])
    grads = torch.autograd.grad(head(h, target).loss, [h, *params], allow_unused=True)
    assert _no_grad_written(head) == [], name
    torch.testing.assert_close(grads[0], ref_h)
    for key, grad in zip(names, grads[1:]):
        if ref[key] is None:
            assert grad is None or not _dense(grad).any(), key
        else:
            torch.testing.assert_close(_dense(grad), ref[key], msg=f"{name}: {key}")


@pytest.mark.parametrize("name", head_names())
def test_backward_with_inputs_leaves_the_other_parameters_alone(name, tmp_path):
    """``backward(inputs=[hidden])`` accumulates into ``hidden.grad`` only."""
    hidden, target = _inputs()
    head = make_head(name, tmp_path).eval()
    h = hidden.clone().requires_grad_()
    head(h, target).loss.backward(inputs=[h])
    assert h.grad is not None and _no_grad_written(head) == [], name


@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("training", [True, False])
def test_functional_call_computes_with_the_tensors_it_is_given(name, training, tmp_path):
    """Swapped-in parameters change the output as loading them would, get their gradient from autograd, and the
    head's own parameters get none (the meta-learning and ``torch.func`` pattern)."""
    hidden, target = _inputs()
    head = make_head(name, tmp_path).train(training)
    g = torch.Generator().manual_seed(3)
    given = {k: (p.detach() * 0.5 + 0.1 * torch.randn(p.shape, generator=g)).requires_grad_()
             for k, p in head.named_parameters()}
    torch.manual_seed(4)
    output, loss = functional_call(head, given, (hidden, target))
    grads = torch.autograd.grad(loss, list(given.values()), allow_unused=True)
    assert _no_grad_written(head) == [], name
    assert any(grad is not None and _dense(grad).abs().sum() > 0 for grad in grads), name
    if training and head.objective != "nll":
        return
    loaded = make_head(name, tmp_path).train(training)
    loaded.load_state_dict({**loaded.state_dict(), **{k: v.detach() for k, v in given.items()}})
    torch.manual_seed(4)
    reference = loaded(hidden, target)
    torch.testing.assert_close(output, reference.output)
    reference.loss.backward()
    for (key, p), grad in zip(loaded.named_parameters(), grads):
        expected = _dense(p.grad)
        if expected is None:
            assert grad is None or not _dense(grad).any(), key
        else:
            torch.testing.assert_close(_dense(grad), expected, msg=f"{name}: {key}")


@pytest.mark.parametrize("options", [{"div_value": 2.0, "cutoffs": [10, 30]}, {"word_dim": 8}])
def test_a_two_level_head_s_banded_or_narrow_word_vectors_follow_the_contract(options):
    """Differentiated dimensions keep a weight per band, each written by its own sink in ``backward()``."""
    from sohsm.heads import TwoLevelSoftmax
    hidden, target = _inputs()
    heads = []
    for _ in range(2):
        torch.manual_seed(0)
        heads.append(TwoLevelSoftmax(D, N, counts=torch.arange(N, 0, -1), **options))
    ref_h, ref = _backward_grads(heads[1], hidden, target)
    h = hidden.clone().requires_grad_()
    names, params = zip(*heads[0].named_parameters())
    loss = heads[0](h, target).loss
    torch.autograd.grad(loss, [h], retain_graph=True)
    grads = torch.autograd.grad(loss, [h, *params])
    assert _no_grad_written(heads[0]) == []
    torch.testing.assert_close(grads[0], ref_h)
    for key, grad in zip(names, grads[1:]):
        torch.testing.assert_close(grad, ref[key], msg=key)
    given = {k: v.detach() * 2 for k, v in heads[0].named_parameters()}
    doubled = functional_call(heads[0], given, (hidden, target)).output
    heads[1].load_state_dict({**heads[1].state_dict(), **given})
    torch.testing.assert_close(doubled, heads[1](hidden, target).output)


def test_a_parameter_assigned_in_place_of_the_word_vectors_is_used_and_gets_its_gradient():
    """``head.weight = nn.Parameter(...)`` (what loading by assignment or tying does) binds the new weight."""
    from sohsm.heads import TwoLevelSoftmax
    hidden, target = _inputs()
    torch.manual_seed(0)
    head = TwoLevelSoftmax(D, N)
    new = torch.nn.Parameter(head.weight.detach() * 3)
    expected = functional_call(head, {"weight": new.detach()}, (hidden, target)).output
    head.weight = new
    head(hidden, target).loss.backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    torch.testing.assert_close(head(hidden, target).output, expected)
