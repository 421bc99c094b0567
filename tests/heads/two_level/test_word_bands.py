"""Differentiated dimensions of the two-level heads (``div_value``, ``cutoffs``) against a dense float64 reference.

The reference is written from the definition: a word of band ``i`` has a vector
``u_w`` of ``d_i`` entries and is scored as ``(P_i h) . u_w`` (``P_0`` the
identity), the cluster softmax scores ``h`` against the cluster vectors, and the
in-cluster softmax normalises over the target's cluster.
"""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import SelfOrganizedSoftmax, TwoLevelSoftmax, build_head
from sohsm.heads.two_level.ops import per_cluster
from tests.heads.reference import in_word_order

D, N = 16, 80
CUTOFFS = [8, 30]  # bands: ranks 0-7 (16 dims), 8-29 (4 dims), 30-79 (1 dim)


def _counts(ordered: bool = False) -> torch.Tensor:
    """Zipf counts, in a random order of ids; ``ordered``: ids by frequency, as sohsm's vocabularies have them."""
    g = torch.Generator().manual_seed(5)
    zipf = (1000.0 / torch.arange(1, N + 1, dtype=torch.float64)).round()
    return zipf if ordered else zipf[torch.randperm(N, generator=g)]


def _batch(seed: int, batch: int = 48):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, D, generator=g, dtype=torch.float64)
    target = torch.randint(0, N, (batch,), generator=g)
    return hidden, target


def _head(kind: str = "two_level", ordered: bool = False, **options):
    torch.manual_seed(3)
    counts = _counts(ordered)
    if kind == "two_level":
        return TwoLevelSoftmax(D, N, counts=counts, div_value=4, cutoffs=CUTOFFS, **options).double()
    return build_head("self_organized", D, N, counts=counts, div_value=4, cutoffs=CUTOFFS, **options).double()


def _bands(counts: torch.Tensor) -> torch.Tensor:
    ranks = torch.sort(counts, descending=True, stable=True).indices
    band = torch.empty(N, dtype=torch.long)
    band[ranks] = torch.bucketize(torch.arange(N), torch.tensor(CUTOFFS), right=True)
    return band


class _Reference:
    """float64 leaves: cluster vectors, each word's short vector, the band maps."""

    def __init__(self, head, ordered: bool = False):
        leaf = lambda t: t.detach().double().clone().requires_grad_(True)  # noqa: E731
        self.dims = [D, D // 4, D // 16]
        self.band = _bands(_counts(ordered))
        self.cluster_weight = leaf(head.cluster_weight)
        vectors = head.word_vectors()  # [N, D + 4 + 1], word order
        starts = [0, D, D + D // 4]
        self.short = [leaf(vectors[self.band == i, s : s + d]) for i, (s, d) in enumerate(zip(starts, self.dims))]
        self.maps = [None] + [leaf(p.weight) for p in head.band_projections]
        self.assignment = head.assignment.clone()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` in-cluster logits ``(P_band(w) h) . u_w``."""
        logits = h.new_zeros(h.size(0), N)
        for i in range(3):
            view = h if self.maps[i] is None else h @ self.maps[i].t()
            logits[:, self.band == i] = view @ self.short[i].t()
        return logits

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        cluster = torch.log_softmax(h @ self.cluster_weight.t(), dim=1)[:, self.assignment]  # [B, N]
        logits = self.logits(h)
        same = self.assignment[None, :] == self.assignment[:, None]  # [N, N]: w' in C(w)
        normaliser = torch.stack([logits[:, same[w]].logsumexp(1) for w in range(N)], dim=1)
        return cluster + logits - normaliser


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch", "triton"])
@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
def test_output_and_gradients_match_the_dense_reference(kind, backend):
    """Every backend against the dense float64 reference on the CPU; Triton's kernels run where they can
    (compiled on a GPU, interpreted on the CPU: tests/heads/two_level/kernel_device.py)."""
    device = torch.device("cpu")
    head = _head(kind)
    if backend == "triton":
        pytest.importorskip("triton", reason="Triton is not installed (the dev extra)")
        from tests.heads.two_level.kernel_device import triton_device

        device = triton_device()
        if device is None:  # pragma: no cover
            pytest.skip("no GPU, and Triton was imported before TRITON_INTERPRET=1 was set")
        head = head.float()  # the kernels compute in float32 at most
    ref = _Reference(head)  # on the CPU, from the head's values before it moves
    head = head.to(device)
    head.backend = backend
    head.train()
    hidden, target = _batch(1)
    hidden = hidden.to(device, head.weight.dtype).requires_grad_(True)
    out = head(hidden, target.to(device))
    out.loss.backward()
    h = hidden.detach().cpu().double().requires_grad_(True)
    expected = ref.log_prob(h).gather(1, target[:, None]).squeeze(1)
    (-expected.mean()).backward()
    tol = dict(rtol=0, atol=1e-5) if backend == "triton" else dict(rtol=0, atol=1e-10)  # Triton: float32 products
    cpu = lambda t: t.detach().cpu().double()  # noqa: E731
    torch.testing.assert_close(cpu(out.output), expected.detach(), **tol)
    torch.testing.assert_close(cpu(hidden.grad), h.grad, **tol)
    torch.testing.assert_close(cpu(head.cluster_weight.grad), ref.cluster_weight.grad, **tol)
    for projection, leaf in zip(head.band_projections, ref.maps[1:]):
        torch.testing.assert_close(cpu(projection.weight.grad), leaf.grad, **tol)
    grad = cpu(in_word_order(head, head.weight.grad))
    starts = [0, D, D + D // 4]
    for i, (s, d) in enumerate(zip(starts, ref.dims)):
        torch.testing.assert_close(grad[ref.band == i, s : s + d], ref.short[i].grad, **tol)
    # outside a word's band the gradient is exactly zero, on every backend
    mask = head._band_mask()
    assert not head.weight.grad[~mask].any()


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("by_band", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_per_cluster_kernel_scores_band_by_band_across_steps(ordered, by_band, monkeypatch):
    """The per-cluster kernel writes each cluster's weight gradient band by band (consecutive rows as slices where the
    ids follow frequency, index tensors where they do not), and from a hidden size on takes the scores and the hidden
    state's gradient band by band too: values and gradients accumulated over two batches, then a step later in the
    reused buffer, match the reference, and every entry outside a word's band stays exactly zero."""
    monkeypatch.setattr(per_cluster, "BAND_PRODUCTS_FROM", 1 if by_band else 10**9)
    head = _head("self_organized", ordered, update_every=0)
    head.backend = "per_cluster"
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    ref = _Reference(head, ordered)
    for seed in (21, 22):  # two backward passes add into one gradient
        hidden, target = _batch(seed)
        hidden.requires_grad_(True)
        out = head(hidden, target)
        out.loss.backward()
        h = hidden.detach().clone().requires_grad_(True)
        expected = ref.log_prob(h).gather(1, target[:, None]).squeeze(1)
        (-expected.mean()).backward()
        torch.testing.assert_close(out.output.detach(), expected.detach(), rtol=0, atol=1e-10)
        torch.testing.assert_close(hidden.grad, h.grad, rtol=0, atol=1e-10)
    rows = [group.rows for groups in head._layout.bands.groups for group in groups]
    assert all(isinstance(r, slice) for r in rows) if ordered else any(isinstance(r, torch.Tensor) for r in rows)
    mask = head._band_mask()

    def check():
        grad = in_word_order(head, head.weight.grad)
        for i, (s, d) in enumerate(zip([0, D, D + D // 4], ref.dims)):
            torch.testing.assert_close(grad[ref.band == i, s : s + d], ref.short[i].grad, rtol=0, atol=1e-10)
        assert not head.weight.grad[~mask].any()

    check()
    optimizer.step()
    optimizer.zero_grad()  # the buffer is reused: its rows written before are zeroed, not its columns
    ref = _Reference(head, ordered)
    hidden, target = _batch(23)
    head(hidden, target).loss.backward()
    (-ref.log_prob(hidden).gather(1, target[:, None]).mean()).backward()
    check()
    assert not head.weight[~mask].any()


def test_band_by_band_products_read_only_each_words_block(monkeypatch):
    """Where the scores are taken band by band, the entries outside a word's block are not read at all: set to NaN,
    they leave the output, the hidden state's gradient and the weight's gradient finite."""
    monkeypatch.setattr(per_cluster, "BAND_PRODUCTS_FROM", 1)
    head = _head("self_organized", update_every=0)
    head.backend = "per_cluster"
    with torch.no_grad():
        head.weight.masked_fill_(~head._band_mask(), float("nan"))
    hidden, target = _batch(31)
    hidden.requires_grad_(True)
    out = head(hidden, target)
    out.loss.backward()
    assert torch.isfinite(out.output).all() and torch.isfinite(hidden.grad).all()
    assert torch.isfinite(head.weight.grad).all() and not head.weight.grad[~head._band_mask()].any()


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
def test_band_groups_follow_a_write_into_band_of_word():
    """A write into ``band_of_word`` (a buffer broadcast) is seen by the next step, as a write into the assignment is."""
    head = _head("self_organized", update_every=0)
    head.backend = "per_cluster"
    hidden, target = _batch(33)
    head(hidden, target).loss.backward()
    with torch.no_grad():
        head.band_of_word.copy_(head.band_of_word.roll(1))
        head.weight.mul_(head._band_mask())
    head.zero_grad()
    head(hidden, target).loss.backward()
    assert head.weight.grad.any() and not head.weight.grad[~head._band_mask()].any()


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("by_band", [False, True])
def test_banded_kernel_runs_under_autocast(by_band, monkeypatch):
    """Under autocast the kernel's products stay in the weight's dtype: an index-tensor band group (ids not in
    frequency order) copies them into float buffers, which a lowered product would not fit."""
    monkeypatch.setattr(per_cluster, "BAND_PRODUCTS_FROM", 1 if by_band else 10**9)
    head = _head("self_organized", update_every=0).float()
    head.backend = "per_cluster"
    hidden, target = _batch(32)
    hidden = hidden.float().requires_grad_(True)
    expected = head(hidden, target).output.detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(hidden, target)
        out.loss.backward()
    assert any(isinstance(g.rows, torch.Tensor) for groups in head._layout.bands.groups for g in groups)
    assert head.weight.grad.dtype == torch.float32 and torch.isfinite(head.weight.grad).all()
    torch.testing.assert_close(out.output.float(), expected, rtol=0, atol=0.1)  # the cluster part is in bf16


@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch"])
def test_log_prob_and_topk_are_exact(backend):
    head = _head()
    head.backend = backend
    ref = _Reference(head)
    hidden, _ = _batch(2, batch=12)
    with torch.no_grad():
        log_probs = head.log_prob(hidden)
        expected = ref.log_prob(hidden)
    torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(log_probs.logsumexp(1), torch.zeros(12, dtype=torch.float64), rtol=0, atol=1e-12)
    values, indices = head.topk(hidden, 5)
    top = expected.topk(5)
    torch.testing.assert_close(values, top.values, rtol=0, atol=1e-10)
    assert torch.equal(indices, top.indices)
    assert torch.equal(head.predict(hidden), expected.argmax(1))


def test_training_and_reclustering_keep_every_word_in_its_band():
    """Adagrad steps, re-clusterings (rows, gradients and optimizer state move) and moved-word means keep the zeros."""
    head = _head("self_organized", update_every=3, moved_vectors="cluster_mean")
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    before = head.assignment.clone()
    for step in range(12):
        hidden, target = _batch(10 + step)
        head(hidden, target).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(head.assignment, before), "the test should have moved words"
    mask = head._band_mask()
    assert not head.weight[~mask].any()
    assert not optimizer.state[head.weight]["sum"][~mask].any()
    assert head.weight[mask].abs().min() > 0  # the bands themselves learned
    ref = _Reference(head)
    hidden, _ = _batch(99, batch=6)
    with torch.no_grad():
        torch.testing.assert_close(head.log_prob(hidden), ref.log_prob(hidden), rtol=0, atol=1e-10)


def test_state_dict_round_trip_and_parameters():
    head = _head("self_organized")
    clone = SelfOrganizedSoftmax(D, N, counts=_counts(), div_value=4, cutoffs=CUTOFFS).double()
    clone.load_state_dict(head.state_dict())
    hidden, _ = _batch(4, batch=5)
    with torch.no_grad():
        assert torch.equal(clone.log_prob(hidden), head.log_prob(hidden))
    assert head.weight.shape == (N, D + D // 4 + D // 16)
    assert [p.weight.shape for p in head.band_projections] == [(4, D), (1, D)]
    band = _bands(_counts())
    # non-zero entries: every word its band's width, nothing else
    assert int((head.word_vectors() != 0).sum()) == sum(int((band == i).sum()) * d for i, d in enumerate([16, 4, 1]))


def test_build_head_takes_the_options_and_defaults_to_adaptives_cutoffs():
    head = build_head("self_organized", 64, 1000, counts=torch.arange(1000, 0, -1), div_value=4)
    assert head.band_dims == [64, 16, 4]
    assert torch.bincount(head.band_of_word).tolist() == [45, 182, 773]  # default_cutoffs(1000) = [45, 227]
    frequency = build_head("two_level_frequency", 64, 1000, counts=torch.arange(1000, 0, -1), div_value=2,
                           cutoffs=[100])
    assert frequency.band_dims == [64, 32]


@pytest.mark.parametrize("kwargs, match", [
    ({"div_value": 0.5}, "div_value must be a number >= 1"),
    ({"div_value": "4"}, "div_value must be a number >= 1"),
    ({"cutoffs": [10]}, "give div_value too"),
    ({"div_value": 4, "cutoffs": [30, 10]}, "cutoffs must be increasing"),
    ({"div_value": 4, "word_dim": 8}, "cannot be combined"),
    ({"div_value": 4, "projection": True}, "cannot be combined"),
    ({"div_value": 64, "cutoffs": [10, 20]}, "leaves band 2 no dimension"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoLevelSoftmax(D, N, **kwargs)


