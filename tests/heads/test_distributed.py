"""Heads under DistributedDataParallel: two processes on the CPU (gloo), spawned by each test."""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TreeSoftmax, TwoLevelSoftmax, head_names

from .distributed import ddp_gradient_errors, ddp_reclustering, spawn

#: DDP settings that change how the all-reduced gradient reaches ``.grad``: copied back into the
#: head's own buffer (the default), or ``.grad`` made a view of a bucket of its own (one per parameter)
DDP_VARIANTS = [
    {"set_to_none": True},
    {"set_to_none": False},
    {"set_to_none": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 1e-4},
]


#: heads that write ``weight.grad`` into a reused buffer (the tree head gathers rows at every depth here)
BUFFERED_HEADS = {
    "two_level": lambda: TwoLevelSoftmax(4, 30, n_clusters=6),
    "tree": lambda: TreeSoftmax(4, 30, depth=3),
}


@pytest.fixture(params=sorted(BUFFERED_HEADS))
def buffered_pair(request, monkeypatch):
    """Two heads of one kind with equal weights."""
    import sohsm.heads.nary_tree as nary_tree

    monkeypatch.setattr(nary_tree, "_DENSE_FACTOR", 0)  # gather each row's children, as at a large N
    head, fresh = BUFFERED_HEADS[request.param](), BUFFERED_HEADS[request.param]()
    fresh.load_state_dict(head.state_dict())
    return head, fresh


def test_a_write_into_the_gradient_buffer_by_someone_else_is_not_trusted(monkeypatch, buffered_pair):
    """DDP copies all ranks' mean gradient into ``weight.grad``; the next step must not keep stale rows."""
    import sohsm.heads.reused_gradient as reused_gradient

    monkeypatch.setattr(reused_gradient, "distributed", lambda: True)  # as when a process group is up
    head, fresh = buffered_pair
    head(torch.randn(3, 4), torch.tensor([0, 1, 2])).loss.backward()
    head.weight.grad.copy_(torch.randn_like(head.weight))  # as DDP's bucket copy does, in every row
    head.zero_grad(set_to_none=True)
    hidden, target = torch.randn(3, 4), torch.tensor([5, 6, 7])
    head(hidden, target).loss.backward()
    fresh(hidden, target).loss.backward()
    assert torch.equal(head.weight.grad, fresh.weight.grad)


def _buffers(head) -> list:
    """The head's reused gradient buffers (a two-level head keeps one per word-vector parameter)."""
    return head.words.grads if hasattr(head, "words") else [head._grad]


def _new_buffers(head) -> None:
    if hasattr(head, "words"):
        head.words.grads = [type(b)() for b in head.words.grads]
    else:
        head._grad = type(head._grad)()


def test_clipping_in_one_process_keeps_the_gradient_exact_without_a_full_zeroing(buffered_pair):
    """Clipping scales ``.grad`` in place (a version bump); zero rows stay zero, so the record still holds."""
    head, fresh = buffered_pair
    for step, target in enumerate(([0, 1, 2], [5, 6, 7], [0, 9, 20], [29, 28, 3])):
        hidden, target = torch.randn(3, 4), torch.tensor(target)
        head.zero_grad(set_to_none=True)
        fresh.zero_grad(set_to_none=True)
        _new_buffers(fresh)  # a new buffer every step: the plain reference
        head(hidden, target).loss.backward()
        fresh(hidden, target).loss.backward()
        assert torch.equal(head.weight.grad, fresh.weight.grad), step
        if step:
            assert all(buffer.known() for buffer in _buffers(head))  # the record survived the scaling below
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1e-3)
        torch.nn.utils.clip_grad_norm_(fresh.parameters(), 1e-3)


def test_gradients_accumulate_over_two_backward_passes(buffered_pair):
    """Without ``zero_grad`` between them, two batches' gradients add up in the reused buffer."""
    head, fresh = buffered_pair
    batches = [(torch.randn(3, 4), torch.tensor(t)) for t in ([0, 1, 2], [5, 6, 29])]
    head(*batches[0]).loss.backward()
    head.zero_grad(set_to_none=True)  # the buffer now holds stale rows of the first batch
    for hidden, target in batches:
        head(hidden, target).loss.backward()
    (fresh(*batches[0]).loss + fresh(*batches[1]).loss).backward()
    torch.testing.assert_close(head.weight.grad, fresh.weight.grad)


def test_ddp_gradients_of_every_head_equal_one_process_on_the_union_batch(tmp_path):
    names = head_names()
    results = spawn(ddp_gradient_errors, tmp_path, names, DDP_VARIANTS, str(tmp_path))
    for result in results:
        assert "ZeroRedundancyOptimizer" in result["zero"]  # refused by attach, see below
        rank_errors = result["errors"]
        assert set(rank_errors) == {f"{n} {i}" for n in names for i in range(len(DDP_VARIANTS))}
        bad = {key: e for key, e in rank_errors.items() if not e <= 1e-5}
        assert not bad, bad


@pytest.mark.parametrize("counts_given, q_clusters", [(True, None), (False, None), (True, 3)])
def test_reclustering_under_ddp_gives_every_rank_the_one_process_assignment(tmp_path, counts_given, q_clusters):
    ranks = spawn(ddp_reclustering, tmp_path, counts_given, q_clusters)
    for result in ranks:
        ddp, one = result["ddp"], result["one_process"]
        assert len(ddp["history"]) == len(one["history"]) == 2
        assert any(record["change_rate"] > 0 for record in one["history"])  # words did move
        assert torch.equal(ddp["assignment"], one["assignment"])
        assert torch.equal(ddp["counts"], one["counts"])
        assert ddp["tokens_seen"] == one["tokens_seen"]
        torch.testing.assert_close(ddp["q"], one["q"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ddp["word_vectors"], one["word_vectors"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ddp["sums"], one["sums"], rtol=1e-5, atol=1e-6)
        assert [r["change_rate"] for r in ddp["history"]] == [r["change_rate"] for r in one["history"]]
    assert torch.equal(ranks[0]["ddp"]["assignment"], ranks[1]["ddp"]["assignment"])
    assert torch.equal(ranks[0]["ddp"]["q"], ranks[1]["ddp"]["q"])


# -- configurations that cannot work are refused at set-up ---------------------------------------
@pytest.mark.parametrize("cls", [TwoLevelSoftmax, TreeSoftmax])
def test_data_parallel_replicas_are_refused(cls):
    """nn.DataParallel on several devices replicates the head; a replica's weight gradient would be lost."""
    head = cls(4, 30)
    with pytest.raises(RuntimeError, match="DataParallel"):
        head._replicate_for_data_parallel()  # what nn.DataParallel calls on every module it replicates
    # on one device DataParallel runs the module itself, which works
    model = torch.nn.DataParallel(head, device_ids=[]) if not torch.cuda.is_available() else None
    if model is not None:
        assert torch.isfinite(model(torch.randn(3, 4), torch.tensor([0, 1, 2])).loss)


@pytest.mark.parametrize("make", [lambda: SelfOrganizedSoftmax(4, 30, reclustering=Reclustering(update_every=0)),
                                  lambda: TreeSoftmax(4, 30)])
def test_a_weight_flattened_into_a_larger_buffer_is_refused(make):
    """FSDP (flat parameters) and ZeRO-3 make each weight a view into one flat buffer."""
    head = make()
    rows = head.weight.size(0)
    flat = torch.zeros(2 * rows * 4)
    head.weight.data = flat[: rows * 4].view(rows, 4)
    with pytest.raises(RuntimeError, match="flat buffer.*FSDP"):
        head(torch.randn(3, 4), torch.tensor([0, 1, 2]))
    head.eval()
    with torch.no_grad():  # evaluation reads the rows and writes no gradient: allowed
        assert torch.isfinite(head(torch.randn(3, 4), torch.tensor([0, 1, 2])).loss)

# ZeroRedundancyOptimizer (its state for the weight lives on one rank) is refused by attach:
# checked in test_ddp_gradients_of_every_head_equal_one_process_on_the_union_batch
