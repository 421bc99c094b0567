"""Noise drawn per row (``noise_per_row=True``, word2vec's negative sampling) against the per-row formulas."""
from __future__ import annotations

import math

import pytest
import torch

from sohsm.heads.sampled import noise_distribution

from .reference import importance_sampling_output, nce_output, negative_sampling_output
from .test_sampled import K, N, _batch, _counts, make_head


def _reference_row(head, weight, bias, h, t, noise):
    log_q = noise_distribution(_counts(), N, head.noise_power).log()
    if head.objective == "importance_sampling":
        return importance_sampling_output(weight, bias, log_q, h, t, noise, head.remove_accidental_hits)
    if head.objective == "nce":
        return nce_output(weight, bias, log_q, h, t, noise)
    return negative_sampling_output(weight, h, t, noise, -math.log(K) if head.shift else 0.0)


@pytest.mark.parametrize("name", ["importance_sampling", "nce", "pmi"])
def test_per_row_noise_matches_each_rows_formula(name):
    head = make_head(name, seed=4, noise_per_row=True, noise_power=0.75)
    hidden, target = _batch(4)
    state = head.generator.get_state()
    out = head(hidden, target)
    head.generator.set_state(state)
    noise = head.noise_samples(target.numel() * K).view(target.numel(), K)  # [B, k]: what the forward drew
    noise[0, 0] = target[0]  # an accidental hit
    hidden.requires_grad_(True)
    output = head.sampled_output(hidden, target, noise)
    (-output.mean()).backward()
    weight = head.weight.detach().clone().requires_grad_(True)
    bias = head.bias.detach().clone().requires_grad_(True) if head.bias is not None else None
    h = hidden.detach().clone().requires_grad_(True)
    expected = torch.cat([_reference_row(head, weight, bias, h[i: i + 1], target[i: i + 1], noise[i])
                          for i in range(target.numel())])
    (-expected.mean()).backward()
    torch.testing.assert_close(output, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, weight.grad, rtol=0, atol=1e-12)
    assert out.output.shape == (target.numel(),)
    assert not torch.equal(noise[1], noise[2])  # every row its own draw


def test_word2vec_negative_sampling_draws_from_unigram_to_the_three_quarters():
    head = make_head("pmi", seed=5, noise_per_row=True, noise_power=0.75, shift=False)
    draws = head.noise_samples(200_000)
    q = noise_distribution(_counts(), N, 0.75)
    torch.testing.assert_close(torch.bincount(draws, minlength=N).double() / 200_000, q, rtol=0, atol=0.004)
    assert "noise_per_row=True" in repr(head)
