"""Heads under DistributedDataParallel: two processes on the CPU (gloo), spawned by each test."""
from __future__ import annotations

import torch

from sohsm.heads import TwoLevelSoftmax, head_names

from .distributed import ddp_gradient_errors, spawn

#: DDP settings that change how the all-reduced gradient reaches ``.grad``: copied back into the
#: head's own buffer (the default), or ``.grad`` made a view of a bucket of its own (one per parameter)
DDP_VARIANTS = [
    {"set_to_none": True},
    {"set_to_none": False},
    {"set_to_none": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 1e-4},
]


def test_a_write_into_the_gradient_buffer_by_someone_else_is_not_trusted():
    """DDP copies all ranks' mean gradient into ``weight.grad``; the next step must not keep stale blocks."""
    head = TwoLevelSoftmax(4, 30, n_clusters=6)
    fresh = TwoLevelSoftmax(4, 30, n_clusters=6)
    fresh.load_state_dict(head.state_dict())
    head(torch.randn(3, 4), torch.tensor([0, 1, 2])).loss.backward()
    head.weight.grad.copy_(torch.randn(30, 4))  # as DDP's bucket copy does, in every cluster's block
    head.zero_grad(set_to_none=True)
    hidden, target = torch.randn(3, 4), torch.tensor([5, 6, 7])
    head(hidden, target).loss.backward()
    fresh(hidden, target).loss.backward()
    assert torch.equal(head.weight.grad, fresh.weight.grad)


def test_ddp_gradients_of_every_head_equal_one_process_on_the_union_batch(tmp_path):
    names = head_names()
    errors = spawn(ddp_gradient_errors, tmp_path, names, DDP_VARIANTS, str(tmp_path))
    for rank_errors in errors:
        assert set(rank_errors) == {f"{n} {i}" for n in names for i in range(len(DDP_VARIANTS))}
        bad = {key: e for key, e in rank_errors.items() if not e <= 1e-5}
        assert not bad, bad
