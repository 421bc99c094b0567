"""The sync-free path of the two-level heads (sohsm.heads.two_level.ops.grouped, device_statistics) on the CPU.

Its torch backend against the dense float64 reference, the heads on it against the
per-cluster kernel, the static-shape statistics against ``update_statistics``, and the
proof that a training step reads nothing back: it compiles with ``fullgraph=True``.
"""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from tests.heads.reference import sequential_q_update

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TwoLevelSoftmax
from sohsm.heads.two_level.ops import backends, grouped
from sohsm.heads.two_level.ops.layout import ClusterLayout
from sohsm.heads.two_level.self_organizing import device_statistics


def _layout(n_words: int, n_clusters: int, seed: int, empty: int = 0) -> ClusterLayout:
    """A random assignment with uneven clusters, ``empty`` of them without words."""
    g = torch.Generator().manual_seed(seed)
    used = n_clusters - empty
    assignment = torch.randint(0, used, (n_words,), generator=g)
    assignment[:used] = torch.arange(used)  # every used cluster has a word
    assignment[: n_words // 3] = 0  # one large cluster
    return ClusterLayout(assignment[torch.randperm(n_words, generator=g)], n_clusters)


def _dense_in_cluster(hidden, word_weight, assignment, target):
    """``log P(t | h, C(t))`` from the full logit matrix masked to the target's cluster (float64)."""
    logits = hidden @ word_weight.t()
    outside = assignment[None, :] != assignment[target][:, None]
    return torch.log_softmax(logits.masked_fill(outside, float("-inf")), dim=1).gather(1, target[:, None]).squeeze(1)


# -- the tile layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, n_clusters, block_m", [(1, 5, 16), (40, 8, 16), (300, 7, 16), (64, 100, 4),
                                                        (33, 3, 8)])
def test_tile_map_puts_every_row_once_in_a_tile_of_its_cluster(batch, n_clusters, block_m):
    g = torch.Generator().manual_seed(batch)
    row_cluster = torch.randint(0, n_clusters, (batch,), generator=g) ** 2 % n_clusters  # uneven, some absent
    tiles = grouped.tile_map(row_cluster, n_clusters, block_m)
    n_tiles = grouped.max_tiles(batch, n_clusters, block_m)
    assert tiles.tile_rows.shape == (n_tiles * block_m,) and tiles.tile_cluster.shape == (n_tiles,)
    present = tiles.tile_rows[tiles.tile_rows >= 0]
    assert sorted(present.tolist()) == list(range(batch))  # every row exactly once
    assert torch.equal(tiles.tile_rows[tiles.row_position], torch.arange(batch))
    tile_of_row = tiles.row_position // block_m
    assert torch.equal(tiles.tile_cluster[tile_of_row], row_cluster)  # a row's tile is of its cluster
    counts = torch.bincount(row_cluster, minlength=n_clusters)
    assert torch.equal(tiles.cluster_tiles, (counts + block_m - 1) // block_m)
    used = int(tiles.cluster_tiles.sum())
    assert bool((tiles.tile_cluster[used:] == n_clusters).all())
    assert bool((tiles.tile_cluster[:used] < n_clusters).all())
    for c in range(n_clusters):  # a cluster's tiles are consecutive, from cluster_tile_start
        start, n = int(tiles.cluster_tile_start[c]), int(tiles.cluster_tiles[c])
        assert bool((tiles.tile_cluster[start : start + n] == c).all())


# -- the torch backend against the dense reference --------------------------------------------------


@pytest.mark.parametrize("batch, n_clusters, empty, block_m", [(40, 8, 0, 16), (3, 8, 2, 16), (1, 4, 0, 16),
                                                               (90, 12, 3, 4)])
def test_torch_backend_matches_dense_float64_reference(batch, n_clusters, empty, block_m):
    n_words, d = 70, 5
    layout = _layout(n_words, n_clusters, seed=batch, empty=empty)
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(n_words, d, generator=g, dtype=torch.float64, requires_grad=True)  # slot order
    hidden = torch.randn(batch, d, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, n_words, (batch,), generator=g)
    row_grad = torch.randn(batch, generator=g, dtype=torch.float64)
    assignment = layout.cluster_of_slot[layout.slot_of_word]
    out = grouped.in_cluster_log_prob(hidden, weight, assignment[target], layout.position_of_word[target],
                                      layout.offsets_t, layout.sizes_t, layout.max_size + 2, "torch", block_m)
    (out * row_grad).sum().backward()
    h_ref = hidden.detach().clone().requires_grad_(True)
    w_ref = weight.detach()[layout.slot_of_word].clone().requires_grad_(True)  # word order
    expected = _dense_in_cluster(h_ref, w_ref, assignment, target)
    (expected * row_grad).sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(hidden.grad, h_ref.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(weight.grad, w_ref.grad[layout.word_of_slot], rtol=0, atol=1e-12)


def test_unknown_backend_is_refused():
    layout = _layout(10, 3, seed=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        grouped.in_cluster_log_prob(torch.randn(2, 3), torch.randn(10, 3), torch.zeros(2, dtype=torch.long),
                                    torch.zeros(2, dtype=torch.long), layout.offsets_t, layout.sizes_t, 10, "cuda")


# -- the heads on the sync-free path against the per-cluster kernel -------------------------------

N, D = 60, 6


def _head(kind: str, projection: bool) -> TwoLevelSoftmax:
    torch.manual_seed(0)
    counts = (1000.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()
    if kind == "two_level":
        return TwoLevelSoftmax(D, N, assignment="frequency", counts=counts, projection=projection).double()
    return SelfOrganizedSoftmax(D, N, counts=counts, projection=projection,
                                reclustering=Reclustering(update_every=2)).double()


def _sync_free(head: TwoLevelSoftmax) -> TwoLevelSoftmax:
    twin = copy.deepcopy(head)
    twin.backend = "grouped_torch"
    return twin


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
@pytest.mark.parametrize("projection", [False, True])
def test_head_on_sync_free_path_equals_the_per_cluster_kernel_over_training(kind, projection):
    """Three optimizer steps (the self-organized head re-clusters after the second): same outputs,
    gradients, statistics and clusters."""
    head = _head(kind, projection)
    twin = _sync_free(head)
    optimizers = [torch.optim.Adagrad(m.parameters(), lr=0.5) for m in (head, twin)]
    for m, opt in zip((head, twin), optimizers):
        m.attach(opt)
    g = torch.Generator().manual_seed(5)
    for step in range(3):
        hidden = torch.randn(37, D, generator=g, dtype=torch.float64)
        target = torch.randint(0, N, (37,), generator=g)
        target[:9] = target[9:18]  # repeated words
        results = []
        for m, opt in zip((head, twin), optimizers):
            h = hidden.clone().requires_grad_(True)
            out = m(h, target)
            out.loss.backward()
            results.append((out.output.detach(), h.grad, m.weight.grad.clone(), m.cluster_weight.grad.clone()))
            opt.step()
            opt.zero_grad()
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        if kind == "self_organized":
            torch.testing.assert_close(twin.q, head.q, rtol=1e-6, atol=1e-6)
            assert torch.equal(twin.assignment, head.assignment)
            assert twin.tokens_seen == head.tokens_seen and int(twin.steps) == int(head.steps) == step + 1
    if kind == "self_organized":
        assert [r["step"] for r in twin.history] == [r["step"] for r in head.history] == [2]


def test_backend_option_selects_the_path(monkeypatch):
    head = _head("two_level", False)
    hidden, target = torch.randn(4, D, dtype=torch.float64), torch.arange(4)
    # CPU: the per-cluster kernel
    assert head.backend == "auto" and head.backend_for(hidden.device).name == "per_cluster"
    head.backend = "grouped_torch"
    assert head.backend_for(hidden.device).name == "grouped_torch"
    head.backend = "per_cluster"
    assert head.backend_for(hidden.device).name == "per_cluster"
    head.backend = "triton"
    monkeypatch.setattr(backends, "triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert head.backend_for(hidden.device).name == "triton"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # compiled kernels need a GPU: one line says so
    with pytest.raises(ValueError, match="backend='triton' runs on CUDA devices, not on cpu"):
        head(hidden, target)
    monkeypatch.setattr(backends, "triton_available", lambda: False)
    with pytest.raises(ValueError, match=r"backend='triton' needs Triton \(pip install triton\)"):
        head(hidden, target)
    with pytest.raises(ValueError, match="backend must be one of auto, per_cluster, grouped_torch, triton, got 'cuda'"):
        head.backend = "cuda"
    with pytest.raises(ValueError, match="backend must be one of"):
        TwoLevelSoftmax(D, 20, backend="sync_free")
    assert TwoLevelSoftmax(D, 20, backend="grouped_torch").backend == "grouped_torch"
    # auto on CUDA takes the Triton kernels where they run, else the per-cluster kernel (test_auto_falls_back...)
    head.backend = "auto"
    monkeypatch.setattr(backends, "triton_problem", lambda device, compute: None)
    assert head.backend_for(torch.device("cuda")).name == "triton"


def test_auto_falls_back_with_one_warning_where_triton_cannot_run(monkeypatch):
    """On CUDA (the device named, nothing launched on it): Triton missing, float64, or kernels that do not compile
    (no C compiler, bf16 ``tl.dot`` before sm_80) make ``auto`` take the next backend and say why, once."""
    monkeypatch.setattr(backends, "_triton_problems", {})
    monkeypatch.setattr(backends, "_warned", set())
    head = _head("two_level", False).float()
    cuda = torch.device("cuda")
    monkeypatch.setattr(backends, "triton_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="Triton is not installed.*the per-cluster kernel .* runs instead"):
        assert head.backend_for(cuda, torch.float32).name == "per_cluster"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert head.backend_for(cuda, torch.float32).name == "per_cluster"
    monkeypatch.setattr(backends, "triton_available", lambda: True)
    with pytest.warns(RuntimeWarning, match="do not compute in torch.float64"):
        assert head.double().backend_for(cuda).name == "per_cluster"

    def cannot_compile(*args):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    monkeypatch.setattr(backends, "run_triton_once", cannot_compile)  # what Triton's launcher raises without cc
    with pytest.warns(RuntimeWarning, match=r"failed to run \(RuntimeError: Failed to find C compiler"):
        assert head.backend_for(cuda, torch.bfloat16).name == "per_cluster"
    # while tracing nothing is tried: what an eager call found out, and a traceable backend in place of the
    # per-cluster kernel, whose host-side grouping would break the graph
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert head.backend_for(cuda, torch.bfloat16).name == "grouped_torch"
    assert head.backend_for(cuda, torch.float16).name == "triton"


def test_sync_free_path_under_bf16_autocast_is_close_to_float32():
    head = _head("two_level", True).float()
    twin = _sync_free(head)
    g = torch.Generator().manual_seed(2)
    hidden, target = torch.randn(50, D, generator=g), torch.randint(0, N, (50,), generator=g)
    expected = head(hidden, target).output
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = twin(hidden, target).output
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0.05)


# -- the statistics with static shapes --------------------------------------------------------------


@pytest.mark.parametrize("counts_given", [True, False])
@pytest.mark.parametrize("smoothing", ["epoch", "paper_literal"])
def test_static_statistics_equal_update_statistics(counts_given, smoothing):
    g = torch.Generator().manual_seed(11)
    counts = torch.randint(1, 6, (N,), generator=g).double() if counts_given else None
    for trial in range(20):
        head = SelfOrganizedSoftmax(D, N, counts=counts, reclustering=Reclustering(smoothing=smoothing, update_every=0))
        head.q.normal_(generator=g)
        twin = copy.deepcopy(head)
        for _ in range(2):  # the second batch sees the counts of the first when the head counts itself
            batch = int(torch.randint(1, 40, (1,), generator=g))
            target = torch.randint(0, 12 if trial % 2 else N, (batch,), generator=g)  # many repeats or few
            log_probs = torch.log_softmax(torch.randn(batch, head.n_clusters, generator=g), dim=1)
            if trial % 3 == 0:
                log_probs[0, 1] = float("nan")  # a non-finite row is left out
                log_probs[-1, 0] = float("-inf")  # an empty cluster is floored, not left out
            head.update_statistics(target, log_probs)
            twin.statistics.fold_on_device(target, log_probs, twin.counts)
            torch.testing.assert_close(twin.q, head.q, rtol=1e-5, atol=1e-5)
            assert torch.equal(twin.counts, head.counts)


def test_static_statistics_equal_one_update_per_token():
    counts = torch.randint(1, 9, (N,), generator=torch.Generator().manual_seed(3)).double()
    head = SelfOrganizedSoftmax(D, N, counts=counts, shortlist=0,
                                reclustering=Reclustering(update_every=0)).double()  # q over every cluster
    head.q = head.q.double()
    target = torch.tensor([3, 5, 3, 3, 7, 5, 0])
    log_probs = torch.log_softmax(torch.randn(7, head.n_clusters, dtype=torch.float64), dim=1)
    expected = sequential_q_update(head.q, target, log_probs, counts, "epoch")
    head.statistics.fold_on_device(target, log_probs, head.counts)
    torch.testing.assert_close(head.q, expected, rtol=0, atol=1e-10)


def _waiting_head(n_batches: int, seed: int):
    """A float64 head (counts given) after ``n_batches`` batches observed on the sync-free path, and the batches."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 9, (N,), generator=g).double()
    head = SelfOrganizedSoftmax(D, N, counts=counts, shortlist=0, reclustering=Reclustering(update_every=0)).double()
    head.q = head.q.double().normal_(generator=g)
    batches = []
    for _ in range(n_batches):
        target = torch.randint(0, 12, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g)  # many repeats
        log_probs = torch.log_softmax(torch.randn(target.numel(), head.n_clusters, dtype=torch.float64, generator=g),
                                      dim=1)
        batches.append((target, log_probs))
    start = head.q.clone()
    for target, log_probs in batches:
        head._observe_sync_free(target, log_probs)
    return head, batches, start


@pytest.mark.parametrize("n_batches", [3, device_statistics.FOLD_EVERY + 3])
def test_waiting_batches_fold_to_one_update_per_token(n_batches):
    head, batches, start = _waiting_head(n_batches, seed=5)
    assert len(head.statistics.waiting.batches) == n_batches % device_statistics.FOLD_EVERY  # they wait
    expected = start
    for target, log_probs in batches:
        expected = sequential_q_update(expected, target, log_probs, head.counts, "epoch")
    # reading q folds what waits: up to FOLD_EVERY (16) batches' tokens at once, whose products are sums of logs in
    # float64, rounding a little more the more tokens a fold holds (1.9e-10 at most here)
    torch.testing.assert_close(head.q, expected, rtol=0, atol=1e-9)
    assert not head.statistics.waiting.batches


def test_waiting_batches_are_folded_into_the_state_dict_and_before_a_reclustering():
    head, batches, start = _waiting_head(3, seed=6)
    twin = copy.deepcopy(head)
    saved = head.state_dict()["q"]
    torch.testing.assert_close(saved, twin.q, rtol=0, atol=0)
    head, *_ = _waiting_head(3, seed=6)
    head.reassign()
    assert not head.statistics.waiting.batches
    assert not torch.equal(twin.q, start)


def test_step_count_mirror_follows_a_loaded_state():
    head = SelfOrganizedSoftmax(D, N, reclustering=Reclustering(update_every=0))
    assert [head.schedule.count_step(head.steps) for _ in range(3)] == [1, 2, 3]
    other = SelfOrganizedSoftmax(D, N, reclustering=Reclustering(update_every=0))
    other.steps.fill_(41)
    head.load_state_dict(other.state_dict())
    assert head.schedule.count_step(head.steps) == 42 and int(head.steps) == 42


# -- no step synchronises: the training step compiles whole ----------------------------------------


@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
def test_training_step_compiles_with_fullgraph(kind):
    """Forward and backward in one dynamo graph: a host read (``.tolist()``, ``.item()``, ``unique``,
    a data-dependent shape) would be a graph break, which ``fullgraph=True`` turns into an error."""
    torch._dynamo.reset()
    head = _sync_free(_head(kind, True))
    head.check_targets = False  # the target range check reads a bool back (Head.check_targets)
    eager = copy.deepcopy(head)

    def step(model, hidden, target):
        loss = model(hidden, target).loss
        loss.backward()
        return loss.detach()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (head, eager)]
    for m, opt in zip((head, eager), optimizers):
        m.attach(opt)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):  # later steps with new data run the same graph
        hidden = torch.randn(48, D, generator=g, dtype=torch.float64)
        target = torch.randint(0, N, (48,), generator=g)
        with torch._dynamo.config.patch(trace_autograd_ops=True):  # trace loss.backward() too
            loss = compiled(head, hidden, target)
        expected = step(eager, hidden, target)
        torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(head.weight.grad, eager.weight.grad, rtol=0, atol=1e-12)
        if kind == "self_organized":
            torch.testing.assert_close(head.q, eager.q, rtol=0, atol=1e-6)
            assert head.schedule.unsettled == eager.schedule.unsettled
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
    assert math.isfinite(float(loss))
    assert counter.frame_count == 1  # one graph, not recompiled for the second batch


def _train_beside_eager(head, compiled, optimizer, batches, lr: float = 0.1, no_sync_from: int | None = None) -> None:
    """Train ``head`` through ``compiled`` and an eager copy of it on the same ``batches``, each attached to its own
    ``optimizer``: at every step both give the same loss, outputs and weight gradient. From step ``no_sync_from`` on
    (CUDA), a host sync in the compiled forward or backward is an error."""
    eager = copy.deepcopy(head)
    optimizers = [optimizer(m.parameters(), lr=lr) for m in (head, eager)]
    for m, opt in zip((head, eager), optimizers):
        m.attach(opt)
    for step, (hidden, target) in enumerate(batches):
        watched = no_sync_from is not None and step >= no_sync_from
        if watched:
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = compiled(hidden, target)
            out.loss.backward()
        finally:
            if watched:
                torch.cuda.set_sync_debug_mode(0)
        expected = eager(hidden, target)
        expected.loss.backward()
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.output, expected.output, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(head.weight.grad, eager.weight.grad, rtol=1e-5, atol=1e-6)
        for opt in optimizers:
            opt.step()
            opt.zero_grad()


def test_self_organized_head_with_the_target_check_on_traces_whole():
    """``torch.compile(head, fullgraph=True)`` with every default, the target check on: the range is checked on the
    device without a read-back, and ``backend="auto"`` takes a sync-free backend while tracing (eagerly on the CPU
    it is the per-cluster kernel, whose host-side grouping cannot be traced; on CUDA it is Triton, which traces)."""
    torch._dynamo.reset()
    counts = (1000.0 / torch.arange(1, N + 1)).round()
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(D, N, counts=counts)
    assert head.check_targets
    assert head.backend == "auto" and head.backend_for(torch.device("cpu")).name == "per_cluster"  # eagerly
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(head, fullgraph=True, backend=counter)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(24, D, generator=g), torch.randint(0, N, (24,), generator=g)) for _ in range(2)]
    _train_beside_eager(head, compiled, torch.optim.SGD, batches)  # the second batch runs the same graph
    assert counter.frame_count == 1
    with pytest.raises(RuntimeError, match=rf"target values must be in \[0, {N}\)"):
        compiled(torch.randn(2, D), torch.tensor([0, N]))


def test_per_cluster_kernel_does_not_compile_with_fullgraph():
    """The check above can fail: the per-cluster kernel's host-side grouping breaks the graph."""
    torch._dynamo.reset()
    head = _head("two_level", False)
    head.backend, head.check_targets = "per_cluster", False
    compiled = torch.compile(lambda h, t: head(h, t).loss, fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(torch.randn(8, D, dtype=torch.float64), torch.randint(0, N, (8,)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (inductor's Triton code for the head)")
def test_self_organized_head_compiles_whole_with_inductor_on_cuda_and_syncs_nowhere():  # pragma: no cover - GPU only
    """On CUDA, ``torch.compile(head, fullgraph=True)`` with every default and inductor: the eager head's loss and
    gradient at every step, and no host sync once compiled (run on an H200: docs/benchmarks/gpu.md)."""
    torch._dynamo.reset()
    n, d, b = 5000, 128, 1024
    counts = (1e5 / torch.arange(1, n + 1)).round()
    torch.manual_seed(0)
    head = SelfOrganizedSoftmax(d, n, counts=counts).cuda()
    compiled = torch.compile(head, fullgraph=True)
    g = torch.Generator(device="cuda").manual_seed(3)
    batches = [(torch.randn(b, d, device="cuda", generator=g), torch.randint(0, n, (b,), device="cuda", generator=g))
               for _ in range(4)]
    _train_beside_eager(head, compiled, torch.optim.AdamW, batches, lr=1e-3, no_sync_from=2)  # compiled after two
