"""The hand-written word2vec step against autograd and a naive float64 per-row loop."""
import math

import numpy as np
import pytest
import torch

from sohsm.data.vocab import Vocabulary
from sohsm.heads import build_head
from sohsm.tasks.w2v.config import W2VConfig
from sohsm.tasks.w2v.data import W2VBatch
from sohsm.tasks.w2v.fast import HandStep, trains_by_hand
from sohsm.tasks.w2v.model import LinearDecaySGD, Word2Vec
from sohsm.train.config import HeadConfig

N, D = 20, 6
COUNTS = torch.arange(N, 0, -1)


def make(architecture="cbow", head_name="tree_huffman", exact=False, **options):
    torch.manual_seed(0)
    model = Word2Vec(N, D, architecture, exact_mean_gradient=exact).double()
    if head_name == "pmi":
        options = {"n_samples": 3, "noise_power": 0.75, "noise_per_row": True, "shift": False, **options}
    head = build_head(head_name, D, N, counts=COUNTS, **options).double()
    with torch.no_grad():
        head.weight.normal_(0, 0.5)
        model.embedding.weight.normal_(0, 0.5)
    return model, head


def batch_of(architecture):
    if architecture == "cbow":  # 5 rows; word 4 in two contexts, twice in one
        inputs = torch.tensor([1, 2, 3, 4, 4, 0, 4, 7, 8, 9, 3])
        counts = torch.tensor([3, 2, 2, 2, 2])
        return W2VBatch(inputs, torch.cumsum(counts, 0) - counts, counts, torch.tensor([5, 6, 7, 0, 19]), 11)
    return W2VBatch(torch.tensor([1, 4, 4, 0, 9]), None, None, torch.tensor([5, 6, 7, 0, 19]), 5)


def optimizer(model, head, lr=0.1, total=10, min_ratio=1.0):
    """word2vec's SGD; by default at a constant rate (its floor is the whole rate)."""
    return LinearDecaySGD([*model.parameters(), *head.parameters()], lr=lr, total_steps=total, rows=lambda: 1,
                          min_ratio=min_ratio)


HEADS = [("tree_huffman", {}), ("tree_random", {}), ("pmi", {}), ("pmi", {"shift": True})]


@pytest.mark.parametrize("architecture, exact", [("cbow", False), ("cbow", True), ("skipgram", False)])
@pytest.mark.parametrize("head_name, options", HEADS)
def test_one_update_is_the_rate_times_autograds_gradient(architecture, head_name, options, exact):
    """All rows in one update: every weight moves by -alpha x the gradient of the summed loss, as autograd has it
    (CBOW's undivided mean and the exact mean), and the loss is the head's own training loss."""
    model, head = make(architecture, head_name, exact, **options)
    batch = batch_of(architecture)
    state = head.state_dict()
    output = head(model(batch), batch.targets).output  # draws the same noise as the step below (head's generator)
    (-output.sum()).backward()
    grads = [model.embedding.weight.grad.to_dense(), head.weight.grad.to_dense()]
    head.load_state_dict(state)  # the noise generator back where it was
    before = [model.embedding.weight.detach().clone(), head.weight.detach().clone()]
    loss_sum, rows = HandStep(model, head, optimizer(model, head), update_rows=8)(batch)
    assert rows == 5 and loss_sum.dtype == torch.float64
    torch.testing.assert_close(loss_sum, -output.sum().detach(), rtol=1e-12, atol=1e-12)
    for after, start, grad in zip([model.embedding.weight, head.weight], before, grads):
        torch.testing.assert_close(after.detach(), start - 0.1 * grad, rtol=1e-12, atol=1e-12)


def naive_word2vec(model, head, batch, alphas, exact=False, offset=0.0):
    """word2vec.c's loop, one row at a time, in float64 on dense copies: (syn0, syn1, loss); ``exact``: each context
    word gets 1 / |context| of the row's error; ``offset`` is subtracted from every score (pmi's shift)."""
    syn0, syn1 = model.embedding.weight.detach().clone(), head.weight.detach().clone()
    if head.__class__.__name__ == "BinaryTreeSoftmax":
        nodes, signs = head.paths()
        pairs = [[(int(n), 1.0 if s > 0 else 0.0) for n, s in zip(nodes[t], signs[t]) if s != 0]
                 for t in batch.targets.tolist()]
    else:
        noise = head.noise_samples(batch.targets.numel() * head.n_samples).view(-1, head.n_samples)
        pairs = [[(t, 1.0)] + [(int(w), 0.0) for w in noise[r]] for r, t in enumerate(batch.targets.tolist())]
    loss = 0.0
    for r, alpha in enumerate(alphas):
        if batch.offsets is not None:
            context = batch.inputs[batch.offsets[r]: batch.offsets[r] + batch.counts[r]].tolist()
            h = syn0[context].mean(0)
        else:
            context = [int(batch.inputs[r])]
            h = syn0[context[0]].clone()
        error = torch.zeros(D, dtype=torch.float64)
        for node, label in pairs[r]:
            f = float(syn1[node] @ h) - offset
            loss -= math.log(1 / (1 + math.exp(-f))) if label else math.log(1 - 1 / (1 + math.exp(-f)))
            g = alpha * (label - 1 / (1 + math.exp(-f)))
            error += g * syn1[node]
            syn1[node] += g * h
        for c in context:
            syn0[c] += error / len(context) if exact else error
    return syn0, syn1, loss


@pytest.mark.parametrize("architecture", ["cbow", "skipgram"])
@pytest.mark.parametrize("head_name", ["tree_huffman", "pmi"])
def test_one_row_per_update_is_word2vecs_loop_with_its_falling_rate(architecture, head_name):
    model, head = make(architecture, head_name)
    batch = batch_of(architecture)
    opt = optimizer(model, head, lr=0.2, total=4, min_ratio=1e-4)
    opt.param_groups[0]["steps_done"] = 1  # the second of 4 steps: the rate falls from 0.15 within the piece
    alphas = [0.2 * (1 - (1 + j / 5) / 4) for j in range(5)]
    state = head.state_dict()
    syn0, syn1, loss = naive_word2vec(model, head, batch, alphas)
    head.load_state_dict(state)
    loss_sum, _ = HandStep(model, head, opt, update_rows=1)(batch)
    torch.testing.assert_close(model.embedding.weight.detach(), syn0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.weight.detach(), syn1, rtol=1e-12, atol=1e-12)
    assert float(loss_sum) == pytest.approx(loss, rel=1e-12)
    assert opt.param_groups[0]["steps_done"] == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.15)


def test_row_cap_scales_a_row_by_cap_over_its_uses_in_the_update():
    """The Huffman root is on all 5 paths and word 4 is in 3 contexts: capped at 2, they move by 2/5 and 2/3 of
    their summed update; a row used once moves as uncapped."""
    moves = []
    for cap in (None, 2.0):
        model, head = make("cbow")
        batch = batch_of("cbow")
        before = [model.embedding.weight.detach().clone(), head.weight.detach().clone()]
        HandStep(model, head, optimizer(model, head), update_rows=5, row_cap=cap)(batch)
        moves.append([model.embedding.weight.detach() - before[0], head.weight.detach() - before[1]])
    (free0, free1), (capped0, capped1) = moves
    root = int(head.paths()[0][0, 0])
    torch.testing.assert_close(capped1[root], free1[root] * 2 / 5)
    torch.testing.assert_close(capped0[4], free0[4] * 2 / 3)
    torch.testing.assert_close(capped0[1], free0[1])  # word 1: one context, once


def test_rows_are_updated_in_groups_in_order():
    """update_rows=2 over 5 rows: the same as three steps of 2, 2 and 1 rows at the rates of their groups."""
    model, head = make("cbow")
    twin_model, twin_head = make("cbow")
    batch = batch_of("cbow")
    HandStep(model, head, optimizer(model, head), update_rows=2)(batch)
    step = HandStep(twin_model, twin_head, optimizer(twin_model, twin_head), update_rows=8)
    for lo, hi in ((0, 2), (2, 4), (4, 5)):
        start, end = int(batch.offsets[lo]), int(batch.offsets[hi - 1] + batch.counts[hi - 1])
        part = W2VBatch(batch.inputs[start:end], batch.offsets[lo:hi] - start, batch.counts[lo:hi],
                        batch.targets[lo:hi], 0)
        step(part)
    torch.testing.assert_close(model.embedding.weight, twin_model.embedding.weight, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.weight, twin_head.weight, rtol=1e-12, atol=1e-12)


def test_which_heads_and_settings_take_the_hand_written_path():
    assert trains_by_hand(build_head("tree_huffman", 4, N, counts=COUNTS))
    assert trains_by_hand(build_head("pmi", 4, N, counts=COUNTS, noise_per_row=True))
    assert not trains_by_hand(build_head("pmi", 4, N, counts=COUNTS))  # noise shared by the batch
    assert not trains_by_hand(build_head("two_level_frequency", 4, N, counts=COUNTS))
    model, head = make()
    with pytest.raises(ValueError, match="update_rows must be >= 1, got 0"):
        HandStep(model, head, optimizer(model, head), update_rows=0)
    with pytest.raises(ValueError, match="row_cap must be positive or None, got 0"):
        HandStep(model, head, optimizer(model, head), update_rows=4, row_cap=0)
    with pytest.raises(ValueError, match="head must be a binary tree or pmi"):
        HandStep(model, build_head("full", D, N), optimizer(model, head), update_rows=4)


def test_the_task_chooses_the_path_and_old_runs_keep_theirs():
    from sohsm.tasks.w2v.task import W2VTask, build_w2v_head

    vocab = Vocabulary(["a", "b", "c", "<unk>"], [3, 2, 2, 0], eos=None)
    for name, fast, expected in [("tree_huffman", True, True), ("pmi", True, True), ("tree_huffman", False, False),
                                 ("self_organized", True, False)]:
        config = W2VConfig(head=HeadConfig(name=name), fast_path=fast)
        task = W2VTask.__new__(W2VTask)  # the choice reads only the config and the device
        task.config, task.device = config, torch.device("cpu")
        head = build_w2v_head(config, vocab, steps_per_epoch=10)
        assert task.trains_by_hand(head) is expected, name
        assert (task.step_by_hand(Word2Vec(4, 100), head, optimizer(Word2Vec(4, 100), head)) is not None) is expected
    saved = W2VConfig(head=HeadConfig(name="tree_huffman")).to_dict()
    del saved["fast_path"]
    assert W2VConfig.from_saved(saved).fast_path is False  # trained by the generic path: resumed by it
    assert W2VConfig.from_saved(W2VConfig().to_dict()).fast_path is True
    with pytest.raises(ValueError, match="update_rows"):
        W2VConfig(update_rows=0).validate()


numba_or_skip = pytest.mark.skipif(not __import__("sohsm.tasks.w2v.kernel", fromlist=["x"]).numba_available(),
                                   reason="numba (the w2v and dev extras) is not installed")


@numba_or_skip
@pytest.mark.parametrize("architecture, exact", [("cbow", False), ("cbow", True), ("skipgram", False)])
@pytest.mark.parametrize("head_name, options", HEADS)
def test_the_compiled_loop_is_word2vecs_loop_with_its_falling_rate(architecture, exact, head_name, options):
    """float64 weights: the compiled loop equals the naive float64 loop (and its exact-mean variant)."""
    from sohsm.tasks.w2v.fast import CompiledStep

    model, head = make(architecture, head_name, exact, **options)
    batch = batch_of(architecture)
    opt = optimizer(model, head, lr=0.2, total=4, min_ratio=1e-4)
    opt.param_groups[0]["steps_done"] = 1
    alphas = [0.2 * (1 - (1 + j / 5) / 4) for j in range(5)]
    state = head.state_dict()
    syn0, syn1, loss = naive_word2vec(model, head, batch, alphas, exact=exact,
                                      offset=math.log(3) if options.get("shift") else 0.0)
    head.load_state_dict(state)
    loss_sum, rows = CompiledStep(model, head, opt)(batch)
    assert rows == 5 and loss_sum.dtype == torch.float64
    torch.testing.assert_close(model.embedding.weight.detach(), syn0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.weight.detach(), syn1, rtol=1e-12, atol=1e-12)
    assert float(loss_sum) == pytest.approx(loss, rel=1e-12)
    assert opt.param_groups[0]["steps_done"] == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.15)


@numba_or_skip
@pytest.mark.parametrize("architecture", ["cbow", "skipgram"])
def test_the_compiled_loop_in_float32_equals_the_torch_path_row_by_row(architecture):
    """float32 (what runs train): the compiled loop and HandStep with one row per update agree to float rounding."""
    from sohsm.tasks.w2v.fast import CompiledStep

    twins = []
    for step in ("compiled", "torch"):
        model, head = make(architecture)
        model, head = model.float(), head.float()
        opt = optimizer(model, head, lr=0.2, total=4, min_ratio=1e-4)
        (CompiledStep(model, head, opt) if step == "compiled" else HandStep(model, head, opt, update_rows=1))(
            batch_of(architecture))
        twins.append([model.embedding.weight.detach(), head.weight.detach()])
    for compiled, by_torch in zip(*twins):
        assert compiled.dtype == torch.float32
        torch.testing.assert_close(compiled, by_torch, rtol=1e-5, atol=1e-6)


def test_the_task_picks_the_loop_and_runs_saved_before_kernel_keep_torchs(monkeypatch):
    import sohsm.tasks.w2v.task as task_module
    from sohsm.tasks.w2v.fast import CompiledStep
    from sohsm.tasks.w2v.task import W2VTask, build_w2v_head

    vocab = Vocabulary(["a", "b", "c", "<unk>"], [3, 2, 2, 0], eos=None)
    for available in (True, False):
        monkeypatch.setattr(task_module, "numba_available", lambda: available)
        for kernel, name, fast, expected in [("auto", "tree_huffman", True, "numba" if available else "torch"),
                                             ("auto", "pmi", True, "numba" if available else "torch"),
                                             ("torch", "pmi", True, "torch"), ("numba", "tree_huffman", True, "numba"),
                                             ("numba", "tree_huffman", False, None),
                                             ("numba", "self_organized", True, None)]:
            config = W2VConfig(head=HeadConfig(name=name), fast_path=fast, kernel=kernel)
            task = W2VTask.__new__(W2VTask)  # the choice reads only the config and the device
            task.config, task.device = config, torch.device("cpu")
            head = build_w2v_head(config, vocab, steps_per_epoch=10)
            assert task.kernel(head) == expected, (available, kernel, name)
            if expected == "numba" and not available:
                with pytest.raises(ValueError, match="kernel is 'numba' but numba cannot be imported"):
                    task.step_by_hand(Word2Vec(4, 100), head, optimizer(Word2Vec(4, 100), head))
            elif expected == "numba" and __import__("sohsm.tasks.w2v.kernel", fromlist=["x"]).numba_available():
                step = task.step_by_hand(Word2Vec(4, 100), head, optimizer(Word2Vec(4, 100), head))
                assert isinstance(step, CompiledStep)
            elif expected == "torch":
                step = task.step_by_hand(Word2Vec(4, 100), head, optimizer(Word2Vec(4, 100), head))
                assert isinstance(step, HandStep)
    saved = W2VConfig(head=HeadConfig(name="tree_huffman")).to_dict()
    del saved["kernel"]
    assert W2VConfig.from_saved(saved).kernel == "torch"  # trained by the torch loop: resumed by it
    assert W2VConfig.from_saved(W2VConfig().to_dict()).kernel == "auto"
    with pytest.raises(ValueError, match="kernel"):
        W2VConfig(kernel="cuda").validate()


@numba_or_skip
def test_the_compiled_loop_refuses_ids_out_of_range_and_other_heads():
    from sohsm.tasks.w2v.fast import CompiledStep

    model, head = make()
    step = CompiledStep(model, head, optimizer(model, head))
    bad = W2VBatch(torch.tensor([1, 2, 30]), torch.tensor([0]), torch.tensor([3]), torch.tensor([5]), 3)
    with pytest.raises(ValueError, match=r"batch.inputs must hold word ids in \[0, 20\), got \[1, 30\]"):
        step(bad)
    with pytest.raises(ValueError, match="head must be a binary tree or pmi"):
        CompiledStep(model, build_head("full", D, N), optimizer(model, head))
    with pytest.raises(ValueError, match="must share a dtype"):
        CompiledStep(model.float(), head, optimizer(model, head))


@numba_or_skip
def test_the_vectorised_loop_gives_the_same_bits_every_run():
    """The compiled loop's sums are reordered once, when it compiles: two runs from one start agree to the bit
    (what an exact resumption needs), in float32 with vectors wider than one SIMD register."""
    from sohsm.tasks.w2v.kernel import train_rows

    rng = np.random.default_rng(0)
    syn0 = rng.uniform(-0.01, 0.01, size=(50, 100)).astype(np.float32)
    syn1 = rng.normal(0, 0.3, size=(49, 100)).astype(np.float32)
    counts = rng.integers(1, 8, size=200)
    inputs = rng.integers(0, 50, size=int(counts.sum()))
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    nodes = rng.integers(0, 49, size=200 * 6)
    labels = rng.integers(0, 2, size=nodes.size).astype(np.float32)
    starts, lengths = np.arange(200) * 6, np.full(200, 6)
    runs = []
    for _ in range(2):
        a, b = syn0.copy(), syn1.copy()
        loss = train_rows(a, b, inputs, offsets, counts, np.arange(200), nodes, labels, starts, lengths, 0.05, 3,
                          10, 1e-4, 0.0, False)
        runs.append((a, b, loss))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2] and not np.array_equal(runs[0][0], syn0)
