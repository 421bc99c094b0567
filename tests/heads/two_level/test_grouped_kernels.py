"""The Triton kernels of the sync-free path: under Triton's interpreter on the CPU, compiled on a GPU.

Without a GPU, ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before Triton is first
imported, so that ``@triton.jit`` makes interpreted functions and these tests run on
any machine with Triton installed (CI included). Sizes are small: the interpreter runs
every program instance in Python. With a GPU the same tests run the compiled kernels.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install triton, or the dev extra)")

from tests.heads.two_level.kernel_device import triton_device  # noqa: E402

from sohsm.heads import TwoLevelSoftmax  # noqa: E402
from sohsm.heads.two_level.ops import grouped
from sohsm.heads.two_level.ops.layout import ClusterLayout  # noqa: E402

if triton_device() is None:  # pragma: no cover
    pytest.skip("no GPU, and Triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it)",
                allow_module_level=True)
DEVICE = triton_device().type


def _problem(batch: int, n_words: int, n_clusters: int, d: int, seed: int, empty: int = 0):
    g = torch.Generator().manual_seed(seed)
    used = n_clusters - empty
    assignment = torch.randint(0, used, (n_words,), generator=g)
    assignment[:used] = torch.arange(used)
    assignment[: n_words // 3] = 0  # one cluster wider than a block of words
    layout = ClusterLayout(assignment, n_clusters)
    weight = torch.randn(n_words, d, generator=g, dtype=torch.float64)  # slot order
    hidden = torch.randn(batch, d, generator=g, dtype=torch.float64)
    target = torch.randint(0, n_words, (batch,), generator=g)
    row_grad = torch.randn(batch, generator=g, dtype=torch.float64)
    return layout, assignment, weight, hidden, target, row_grad


def _run(backend, layout, assignment, weight, hidden, target, row_grad, dtype, width, block_m, autocast=False):
    """Output and gradients on DEVICE, returned in float64 on the CPU."""
    w = weight.to(DEVICE, dtype).requires_grad_(True)
    h = hidden.to(DEVICE, dtype).requires_grad_(True)
    row_cluster, row_target = assignment[target].to(DEVICE), layout.position_of_word[target].to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        out = grouped.in_cluster_log_prob(h, w, row_cluster, row_target, layout.offsets_t.to(DEVICE),
                                          layout.sizes_t.to(DEVICE), width, backend, block_m)
    (out * row_grad.to(DEVICE, out.dtype)).sum().backward()
    return out.double().cpu(), h.grad.double().cpu(), w.grad.double().cpu()


def _reference(layout, assignment, weight, hidden, target, row_grad):
    """Dense float64: full logits masked to the target's cluster."""
    h = hidden.clone().requires_grad_(True)
    w = weight[layout.slot_of_word].clone().requires_grad_(True)  # word order
    logits = h @ w.t()
    outside = assignment[None, :] != assignment[target][:, None]
    out = torch.log_softmax(logits.masked_fill(outside, float("-inf")), dim=1).gather(1, target[:, None]).squeeze(1)
    (out * row_grad).sum().backward()
    return out.detach(), h.grad, w.grad[layout.word_of_slot]


@pytest.mark.parametrize("batch, n_words, n_clusters, d, empty, block_m", [
    (40, 70, 9, 20, 0, 16),   # clusters wider than a block of 32 words; d not a multiple of the block
    (5, 50, 12, 40, 3, 16),   # fewer rows than clusters, empty clusters, d over one block
    (70, 30, 2, 8, 0, 32),    # several tiles per cluster
])
def test_float32_kernels_match_dense_float64_reference(batch, n_words, n_clusters, d, empty, block_m):
    layout, assignment, weight, hidden, target, row_grad = _problem(batch, n_words, n_clusters, d, seed=batch,
                                                                    empty=empty)
    width = layout.max_size + 5  # wider than any cluster, as a head's static width is
    out, grad_h, grad_w = _run("triton", layout, assignment, weight, hidden, target, row_grad, torch.float32,
                               width, block_m)
    expected = _reference(layout, assignment, weight, hidden, target, row_grad)
    for got, want in zip((out, grad_h, grad_w), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def test_bf16_kernels_under_autocast_are_bf16_close_to_float64():
    """Under autocast the products take bf16 operands (float32 accumulation, float32 logits)."""
    layout, assignment, weight, hidden, target, row_grad = _problem(40, 70, 9, 20, seed=3)
    width = layout.max_size
    got = _run("triton", layout, assignment, weight, hidden, target, row_grad, torch.float32, width, 16, True)
    torch_backend = _run("torch", layout, assignment, weight, hidden, target, row_grad, torch.float32, width, 16,
                         True)
    expected = _reference(layout, assignment, weight, hidden, target, row_grad)
    for g, t, e in zip(got, torch_backend, expected):
        # the torch backend also rounds its logits to bf16 (autocast's bmm output); the kernels keep float32
        assert (g - e).abs().max() <= max(0.05, (t - e).abs().max())
    assert (got[0] - expected[0]).abs().max() > 1e-4  # the products really ran in bf16
    # exactly the products of the bf16-rounded operands, accumulated in float32
    rounded = _reference(layout, assignment, weight.bfloat16().double(), hidden.bfloat16().double(), target, row_grad)
    torch.testing.assert_close(got[0], rounded[0], rtol=0, atol=1e-4)


def test_float64_and_bad_block_are_refused():
    layout, assignment, weight, hidden, target, _ = _problem(4, 20, 4, 8, seed=0)
    args = [t.to(DEVICE) for t in (assignment[target], layout.position_of_word[target], layout.offsets_t,
                                   layout.sizes_t)] + [10]
    hidden, weight = hidden.to(DEVICE), weight.to(DEVICE)
    with pytest.raises(ValueError, match="float64"):
        grouped.in_cluster_log_prob(hidden, weight, *args, "triton", 16)
    with pytest.raises(ValueError, match="block_m"):
        grouped.in_cluster_log_prob(hidden.float(), weight.float(), *args, "triton", 24)


def test_head_on_triton_backend_equals_the_per_cluster_kernel():
    """The same head on the Triton kernels (on DEVICE) and on the per-cluster kernel (named: ``auto`` is Triton on
    CUDA, so on a GPU the default would compare the kernels with themselves)."""
    torch.manual_seed(0)
    head = TwoLevelSoftmax(12, 60, assignment="random", projection=True, backend="per_cluster")
    twin = TwoLevelSoftmax(12, 60, assignment="random", projection=True, backend="triton")
    twin.load_state_dict(head.state_dict())
    head, twin = head.to(DEVICE), twin.to(DEVICE)
    g = torch.Generator().manual_seed(1)
    hidden, target = torch.randn(33, 12, generator=g), torch.randint(0, 60, (33,), generator=g)
    hidden, target = hidden.to(DEVICE), target.to(DEVICE)
    grads = []
    for m in (head, twin):
        h = hidden.clone().requires_grad_(True)
        out = m(h, target)
        out.loss.backward()
        grads.append((out.output.detach(), h.grad, m.weight.grad, m.projection.weight.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_kernels_trace_whole_under_torch_compile():
    """The custom operators' fake implementations let dynamo and AOT autograd trace the step."""
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    torch.manual_seed(0)
    head = TwoLevelSoftmax(8, 40, assignment="random").to(DEVICE)
    head.backend, head.check_targets = "triton", False
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def step(hidden, target):
        loss = head(hidden, target).loss
        loss.backward()
        return loss.detach()

    compiled = torch.compile(step, fullgraph=True, backend=counter)
    hidden, target = torch.randn(20, 8, device=DEVICE), torch.randint(0, 40, (20,), device=DEVICE)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        loss = compiled(hidden, target)
    grad = head.weight.grad.clone()
    head.weight.grad = None
    expected = step(hidden, target)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, head.weight.grad)
    assert counter.frame_count == 1


def test_kernels_launch_on_the_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device: every launch runs under ``launch_device(tensors' device)``, which
    makes ``cuda:1`` current while ``cuda:0`` is (the current device mocked: torch.cuda.device's exchange)."""
    from sohsm.heads.two_level.ops import triton_kernels

    current = [0]

    def exchange(index):
        previous, current[0] = current[0], index if index >= 0 else current[0]
        return previous

    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "_exchange_device", exchange)
        patch.setattr(torch.cuda, "_maybe_exchange_device", exchange)
        with triton_kernels.launch_device(torch.device("cuda", 1)):
            assert current[0] == 1
        assert current[0] == 0

    guarded, launches = [], []
    real_guard = triton_kernels.launch_device

    class Guard:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            guarded.append(self.device)

        def __exit__(self, *exc):
            guarded.pop()

    class Kernel:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(list(guarded))
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(triton_kernels, "launch_device", Guard)
    for name in ("_forward_kernel", "_grad_hidden_kernel", "_grad_weight_kernel"):
        monkeypatch.setattr(triton_kernels, name, Kernel(getattr(triton_kernels, name)))
    layout, assignment, weight, hidden, target, row_grad = _problem(20, 30, 4, 8, seed=7)
    _run("triton", layout, assignment, weight, hidden, target, row_grad, torch.float32, layout.max_size, 16)
    assert len(launches) == 3 and all(g == [torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device(DEVICE)]
                                      for g in launches), launches
    assert real_guard(torch.device("cpu")).__class__.__name__ == "nullcontext"
