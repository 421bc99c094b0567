"""Differentiated dimensions of the two-level heads (``div_value``, ``cutoffs``) against a dense float64 reference.

The reference is written from the definition: a word of band ``i`` has a vector
``u_w`` of ``d_i`` entries and is scored as ``(P_i h) . u_w`` (``P_0`` the
identity), the cluster softmax scores ``h`` against the cluster vectors, and the
in-cluster softmax normalises over the target's cluster. The head keeps band
``i``'s vectors in its own ``[n_i, d_i]`` weight, rows in the order of the cluster
layout's slots; :func:`band_words` says which word each row holds.
"""
from __future__ import annotations

import pytest
import torch

from sohsm.heads import SelfOrganizedSoftmax, TwoLevelSoftmax, build_head

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
    """A banded head of ``kind`` in float64 over :func:`_counts`."""
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


def band_words(head, band: int) -> torch.Tensor:
    """``[n_band]`` the word held by each row of ``head.band_weights[band]``."""
    return head._layout.word_of_slot[head.words.band_rows(head._layout).slots[band]]


def by_word(head, band: int, rows: torch.Tensor) -> torch.Tensor:
    """A band-weight-shaped tensor (weight, gradient, optimizer state) with its rows in ascending word id."""
    return rows.detach()[torch.argsort(band_words(head, band).to(rows.device))]


class _Reference:
    """float64 leaves: cluster vectors, each word's short vector, the band maps."""

    def __init__(self, head):
        leaf = lambda t: t.detach().cpu().double().clone().requires_grad_(True)  # noqa: E731
        self.dims = [D, D // 4, D // 16]
        self.band = head.band_of_word.cpu().clone()
        self.cluster_weight = leaf(head.cluster_weight)
        vectors = head.word_vectors().cpu()  # [N, D + 4 + 1], word order
        starts = [0, D, D + D // 4]
        self.short = [leaf(vectors[self.band == i, s : s + d]) for i, (s, d) in enumerate(zip(starts, self.dims))]
        self.maps = [None] + [leaf(p.weight) for p in head.band_projections]
        self.assignment = head.assignment.cpu().clone()

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

    def check_gradients(self, head, **tol) -> None:
        """Each band weight's gradient, row by row, is the reference's gradient of that row's word."""
        for i, weight in enumerate(head.band_weights):
            torch.testing.assert_close(by_word(head, i, weight.grad).cpu().double(), self.short[i].grad, **tol)


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
    hidden = hidden.to(device, head.band_weights[0].dtype).requires_grad_(True)
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
    ref.check_gradients(head, **tol)


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("ordered", [False, True])
def test_per_cluster_kernel_scores_band_by_band_across_steps(ordered):
    """The per-cluster kernel scores each cluster band by band (a band's words as consecutive positions where the ids
    follow frequency, as index tensors where they do not) and writes each band's gradient into its own weight: values
    and gradients accumulated over two batches, then a step later in the reused buffers, match the reference."""
    head = _head("self_organized", ordered, update_every=0)
    head.backend = "per_cluster"
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    ref = _Reference(head)
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
    positions = [group.positions for groups in head._layout.bands.groups for group in groups]
    assert (all(isinstance(p, slice) for p in positions) if ordered
            else any(isinstance(p, torch.Tensor) for p in positions))
    ref.check_gradients(head, rtol=0, atol=1e-10)
    optimizer.step()
    optimizer.zero_grad()  # the buffers are reused: their rows written before are zeroed
    ref = _Reference(head)
    hidden, target = _batch(23)
    head(hidden, target).loss.backward()
    (-ref.log_prob(hidden).gather(1, target[:, None]).mean()).backward()
    ref.check_gradients(head, rtol=0, atol=1e-10)


def test_the_parameters_are_each_words_own_entries():
    """Each band's weight holds its words' d_i entries and nothing else: the head's parameters, its optimizer state
    and the exact parameter count its memory estimate gives before it is built."""
    head = _head("self_organized", update_every=0)
    band = _bands(_counts())
    assert [tuple(w.shape) for w in head.band_weights] == [(8, 16), (22, 4), (50, 1)]
    assert [torch.equal(torch.sort(band_words(head, i)).values, (band == i).nonzero().squeeze(1))
            for i in range(3)] == [True] * 3
    estimate = type(head).memory_estimate(D, N, {"div_value": 4, "cutoffs": CUTOFFS, "n_clusters": head.n_clusters},
                                          rows=1)
    assert estimate.parameters == sum(p.numel() for p in head.parameters())
    assert estimate.word_vectors == 8 * 16 + 22 * 4 + 50 * 1
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    hidden, target = _batch(3)
    head(hidden, target).loss.backward()
    optimizer.step()
    assert [tuple(optimizer.state[w]["sum"].shape) for w in head.band_weights] == [(8, 16), (22, 4), (50, 1)]


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
def test_a_write_into_band_of_word_is_followed_or_refused():
    """A write into ``band_of_word`` (a buffer broadcast) is seen by the next step, as a write into the assignment is:
    bands of the same sizes are read anew (each band's rows then hold other words); other sizes are refused."""
    head = _head("self_organized", update_every=0)
    head.backend = "per_cluster"
    hidden, target = _batch(33)
    head(hidden, target).loss.backward()
    with torch.no_grad():
        head.band_of_word.copy_(head.band_of_word.roll(1))  # the same number of words in each band
    head.zero_grad()
    ref = _Reference(head)
    out = head(hidden, target)
    out.loss.backward()
    expected = ref.log_prob(hidden).gather(1, target[:, None]).squeeze(1)
    (-expected.mean()).backward()
    torch.testing.assert_close(out.output.detach(), expected.detach(), rtol=0, atol=1e-10)
    ref.check_gradients(head, rtol=0, atol=1e-10)
    with torch.no_grad():
        head.band_of_word.fill_(0)
    with pytest.raises(RuntimeError, match="bands are fixed when it is built"):
        head(hidden, target)


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
def test_banded_kernel_runs_under_autocast():
    """Under autocast the kernel's products stay in the weight's dtype: an index-tensor band group (ids not in
    frequency order) copies them into float buffers, which a lowered product would not fit."""
    head = _head("self_organized", update_every=0).float()
    head.backend = "per_cluster"
    hidden, target = _batch(32)
    hidden = hidden.float().requires_grad_(True)
    expected = head(hidden, target).output.detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(hidden, target)
        out.loss.backward()
    assert any(isinstance(g.positions, torch.Tensor) for groups in head._layout.bands.groups for g in groups)
    for weight in head.band_weights:
        assert weight.grad.dtype == torch.float32 and torch.isfinite(weight.grad).all()
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


@pytest.mark.parametrize("moved_vectors", ["keep", "cluster_mean"])
def test_a_reassignment_moves_each_words_vector_gradient_and_optimizer_state(moved_vectors):
    """set_assignment re-lays out every band's rows: a word keeps its vector, gradient and Adagrad sum (``keep``);
    then with ``cluster_mean`` a moved word takes the mean of its new cluster's stayers of its band."""
    head = _head("self_organized", update_every=0)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.5)
    head.attach(optimizer)
    for seed in (40, 41):
        hidden, target = _batch(seed)
        head(hidden, target).loss.backward()
        optimizer.step()
    hidden, target = _batch(42)
    head(hidden, target).loss.backward()  # a gradient to move too
    before = [(by_word(head, i, w), by_word(head, i, w.grad), by_word(head, i, optimizer.state[w]["sum"]))
              for i, w in enumerate(head.band_weights)]
    new = torch.randint(0, head.n_clusters, (N,), generator=torch.Generator().manual_seed(8))
    moved = head.set_assignment(new, optimizer)
    assert moved.any() and torch.equal(head.assignment, new)
    if moved_vectors == "cluster_mean":
        head._give_cluster_means(moved, optimizer)
    band = _bands(_counts())
    for i, (weight, (vectors, grad, sums)) in enumerate(zip(head.band_weights, before)):
        after = (by_word(head, i, weight), by_word(head, i, weight.grad),
                 by_word(head, i, optimizer.state[weight]["sum"]))
        torch.testing.assert_close(after[1], grad, rtol=0, atol=0)
        if moved_vectors == "keep":
            torch.testing.assert_close(after[0], vectors, rtol=0, atol=0)
            torch.testing.assert_close(after[2], sums, rtol=0, atol=0)
            continue
        words = (band == i).nonzero().squeeze(1)  # ascending: the rows of by_word
        for j, word in enumerate(words.tolist()):
            mates = [k for k, w in enumerate(words.tolist()) if new[w] == new[word] and not moved[w]]
            expected = (vectors[j], sums[j]) if not moved[word] or not mates else (
                vectors[mates].mean(0), sums[mates].mean(0))
            torch.testing.assert_close((after[0][j], after[2][j]), expected, rtol=0, atol=1e-12)


def test_training_and_reclustering_match_the_reference():
    """Adagrad steps and re-clusterings (rows, gradients and optimizer state move, moved words take their band's
    means) leave a head whose exact log-probabilities are the reference's from its own vectors."""
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
    assert all(w.abs().min() > 0 for w in head.band_weights)  # the bands themselves learned
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
    assert [p.weight.shape for p in head.band_projections] == [(4, D), (1, D)]
    assert "weight" not in head.state_dict()
    band = _bands(_counts())
    # the widened vectors: every word its band's width, nothing else
    assert int((head.word_vectors() != 0).sum()) == sum(int((band == i).sum()) * d for i, d in enumerate([16, 4, 1]))


def test_a_state_dict_with_one_widened_weight_still_loads():
    """A banded head saved with one ``[N, d + d/div + ...]`` weight (its rows in the saved assignment's layout, zero
    outside each word's block) loads into the band weights."""
    head = _head("self_organized")
    state = head.state_dict()
    for i in range(3):
        del state[f"band_weights.{i}"]
    state["weight"] = head.words.matrix(head._layout).detach().clone()
    state["assignment"] = head.assignment.clone()
    clone = SelfOrganizedSoftmax(D, N, counts=_counts(), div_value=4, cutoffs=CUTOFFS, seed=9).double()
    assert not torch.equal(clone.assignment, head.assignment)
    clone.load_state_dict(state)
    hidden, _ = _batch(4, batch=5)
    with torch.no_grad():
        torch.testing.assert_close(clone.log_prob(hidden), head.log_prob(hidden), rtol=0, atol=0)


def test_a_banded_head_traces_whole_under_torch_compile():
    """On the sync-free path the bands are widened inside the compiled step, their rows derived with the layout (at
    construction, ``.to()`` and loading), so a fresh head traces as one graph, with the loss and band gradients of
    an eager copy."""
    import copy

    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    head = _head().float()  # .float() builds the layout anew
    head.backend, head.check_targets = "grouped_torch", False
    eager = copy.deepcopy(head)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def step(module, hidden, target):
        loss = module(hidden, target).loss
        loss.backward()
        return loss.detach()

    hidden, target = _batch(50)
    hidden = hidden.float()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        loss = torch.compile(step, fullgraph=True, backend=counter)(head, hidden, target)
    torch.testing.assert_close(loss, step(eager, hidden, target))
    for weight, expected in zip(head.band_weights, eager.band_weights):
        torch.testing.assert_close(weight.grad, expected.grad)
    assert counter.frame_count == 1


def test_bands_first_derived_under_inference_mode_still_train():
    """A head evaluated under ``torch.inference_mode`` before it trains (as trainers do) then trains on the sync-free
    path: the band rows it derived there are ordinary tensors, which autograd may save."""
    head = _head()
    head.backend = "grouped_torch"
    head.load_state_dict(head.state_dict())  # a new layout, its bands derived anew
    hidden, target = _batch(51)
    with torch.inference_mode():
        head.log_prob(hidden)
    head(hidden, target).loss.backward()
    assert all(w.grad is not None and w.grad.any() for w in head.band_weights)


@pytest.mark.filterwarnings("ignore:.*without an attached optimizer")
@pytest.mark.parametrize("banded", [False, True])
def test_a_loss_through_log_prob_leaves_no_stale_rows_in_the_reused_buffers(banded):
    """Autograd writes the word vectors' gradient where a loss goes through ``log_prob``: the next step's buffers,
    after ``zero_grad``, hold that step's gradient only (as a head whose buffers are new)."""
    import copy

    head = _head() if banded else TwoLevelSoftmax(D, N, counts=_counts()).double()
    head.backend = "per_cluster"
    clone = copy.deepcopy(head)
    (h1, t1), (h2, t2) = _batch(52, batch=4), _batch(53, batch=4)  # few clusters: most rows not rewritten
    head(h1, t1).loss.backward()
    (-head.log_prob(h1).mean()).backward()
    head.zero_grad()
    head(h2, t2).loss.backward()
    clone(h2, t2).loss.backward()
    for mine, theirs in zip(head.words.weights, clone.words.weights):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0)


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


