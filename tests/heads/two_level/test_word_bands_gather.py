"""The banded head's word vectors read in one gather (sync-free backends) equal the band-by-band reads."""
from __future__ import annotations

import pytest
import torch

from sohsm import build_head


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_gather_reads_and_trains_what_the_band_loop_does(seed):
    """float64: the tied embedding and the widened weight of a sync-free head, values and gradients, against the
    per-cluster head's band-by-band reads (the reference), on random ids and hidden states."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 50, (120,), generator=g).double()
    heads = {}
    for backend in ("grouped_torch", "per_cluster"):
        torch.manual_seed(seed)
        heads[backend] = build_head("self_organized", 16, 120, counts=counts, div_value=4, cutoffs=[10, 40],
                                    backend=backend, update_every=0).double()
    fast, slow = heads["grouped_torch"], heads["per_cluster"]
    ids = torch.randint(0, 120, (7, 5), generator=g)
    weights = torch.randn(7, 5, 16, dtype=torch.float64, generator=g)
    hidden = torch.randn(9, 16, dtype=torch.float64, generator=g)
    target = torch.randint(0, 120, (9,), generator=g)
    outputs = {}
    for name, head in heads.items():
        head.zero_grad(set_to_none=True)
        embedded = head.embed(ids)
        loss = (embedded * weights).sum() + head(hidden, target).loss
        loss.backward()
        outputs[name] = (embedded.detach(), head.words.matrix(head._layout).detach())
    torch.testing.assert_close(outputs["grouped_torch"][0], outputs["per_cluster"][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outputs["grouped_torch"][1], outputs["per_cluster"][1], rtol=0, atol=0)
    for (name, a), b in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(a.grad.to_dense(), b.grad.to_dense(), rtol=1e-10, atol=1e-12, msg=name)
