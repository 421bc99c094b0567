"""torch's own tests of ``nn.AdaptiveLogSoftmaxWithLoss``, ported, run against every head where they apply.

Ported from pytorch/pytorch (rewritten, not copied): ``test/test_nn.py``'s ``test_adaptive_log_softmax``,
``test/cpp/api/modules.cpp``'s ``AdaptiveLogSoftmaxWithLoss`` and ``test/test_module_init.py``'s factory
kwargs. :class:`~sohsm.heads.AdaptiveSoftmax` passes all of them, torch's attributes and checkpoints included;
what another head cannot share (cutoffs, torch's layout, the meta device for a layout derived from data) is listed
in docs/heads-contract.md. Each check runs on torch's module too, so that it is known to hold there.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sohsm.clustering.trees import random_tree, save_tree
from sohsm.heads import AdaptiveSoftmax, DifferentiatedSoftmax, FullSoftmax, build_head, head_names
from sohsm.heads.base import HeadInputError

D, N = 16, 20  # torch's test's sizes: 16 features, 20 classes, cutoffs [5, 10, 15], div_value 2


def every_head(name: str, tmp_path, d: int = D, n: int = N, **overrides):
    """Head ``name`` at ``d`` x ``n`` with its defaults (a tree file for ``tree_file``), seeded."""
    options = {"self_organized": {"update_every": 0}}.get(name, {})
    if name == "tree_file":
        path = tmp_path / "tree.pt"
        save_tree(path, random_tree(n, torch.Generator().manual_seed(0)))
        options = {"path": str(path)}
    torch.manual_seed(0)
    return build_head(name, d, n, counts=torch.arange(n, 0, -1) * 3, **{**options, **overrides}).eval()


def torch_module(*args, **kwargs):
    torch.manual_seed(0)
    return nn.AdaptiveLogSoftmaxWithLoss(*args, **kwargs)


MODULES = [pytest.param(torch_module, id="torch"), pytest.param(AdaptiveSoftmax, id="AdaptiveSoftmax")]


# -- test_nn.py: argument validation, shapes, cluster sizes ------------------------------------------------
@pytest.mark.parametrize("make", MODULES)
def test_cutoffs_are_validated_as_torch_validates_them(make):
    for cutoffs in ([5, 15, 15], [5, 15, 10], [5, 10, 25], [5, 10, 20], []):
        with pytest.raises(ValueError):
            make(16, 20, cutoffs, div_value=2.0)
    make(16, 20, [5, 10, 19], div_value=2.0)  # the last cutoff may be n_classes - 1


@pytest.mark.parametrize("make", MODULES)
def test_cluster_sizes_and_torch_s_attributes(make):
    asfm = make(16, 20, [5, 10, 15], div_value=2.0)
    assert asfm.head.weight.shape == (5 + 3, 16)  # a 5-word shortlist and one entry for each of 3 clusters
    assert [tuple(asfm.tail[i][1].weight.shape) for i in range(3)] == [(5, 8), (5, 4), (5, 2)]
    assert [tuple(asfm.tail[i][0].weight.shape) for i in range(3)] == [(8, 16), (4, 16), (2, 16)]
    assert asfm.cutoffs == [5, 10, 15, 20]
    assert (asfm.in_features, asfm.n_classes, asfm.div_value, asfm.head_bias) == (16, 20, 2.0, False)
    assert (asfm.shortlist_size, asfm.n_clusters, asfm.head_size) == (5, 3, 8)
    assert asfm(torch.randn(2, 16), torch.tensor([0, 17])).output.shape == (2,)


@pytest.mark.parametrize("make", MODULES)
def test_bad_shapes_and_targets_raise_runtime_errors(make):
    asfm = make(16, 20, [5, 10, 15], div_value=2.0)
    with pytest.raises(RuntimeError):  # batch sizes differ
        asfm(torch.randn(2, 16), torch.tensor([0, 5, 10]))
    with pytest.raises(RuntimeError, match="[Tt]arget values"):  # a class id past n_classes
        asfm(torch.randn(2, 16), torch.tensor([0, 20]))


@pytest.mark.parametrize("name", head_names())
def test_every_head_raises_what_both_torch_and_sohsm_code_catch(name, tmp_path):
    """torch raises RuntimeError for bad input, sohsm has raised ValueError: a head's error is both."""
    head = every_head(name, tmp_path)
    for hidden, target in ((torch.randn(2, D), torch.tensor([0, 5, 10])),  # batch sizes differ
                           (torch.randn(2, D), torch.tensor([0, N])),  # a target past n_classes
                           (torch.randn(2, D + 1), torch.tensor([0, 1]))):  # not in_features wide
        with pytest.raises(RuntimeError) as caught:
            head(hidden, target)
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, HeadInputError), name
        assert "\n" not in str(caught.value)


# -- test_nn.py: unbatched input, log_prob, forward, predict, for every head ------------------------------
def _each(tmp_path):
    """torch's module and every registered head at torch's sizes."""
    yield "torch", torch_module(D, N, [5, 10, 15], div_value=2.0)
    for name in head_names():
        yield name, every_head(name, tmp_path)


def test_an_unbatched_row_is_the_batch_of_one_without_its_row(tmp_path):
    x, y = torch.randn(1, D), torch.tensor([17])
    for name, head in _each(tmp_path):
        with torch.no_grad():
            torch.testing.assert_close(head(x, y).output.squeeze(0), head(x[0], y[0]).output, msg=name)


def test_log_prob_is_a_distribution_and_forward_reads_it(tmp_path):
    x = torch.randn(4, D)
    for name, head in _each(tmp_path):
        with torch.no_grad():
            log_prob = head.log_prob(x)
            torch.testing.assert_close(log_prob.exp().sum(1), torch.ones(4), msg=name)
            for v in (0, 1, 6, 12, 19):  # the shortlist and every cluster of torch's test's cutoffs
                y = torch.full((4,), v, dtype=torch.long)
                output, loss = head(x, y)
                torch.testing.assert_close(output, log_prob.gather(1, y[:, None]).squeeze(1), msg=name)
                torch.testing.assert_close(loss, F.nll_loss(log_prob, y), msg=name)


def test_predict_is_the_argmax_of_log_prob(tmp_path):
    x = torch.randn(64, D)
    for name, head in _each(tmp_path):
        with torch.no_grad():
            assert torch.equal(head.predict(x), head.log_prob(x).argmax(1)), name


@pytest.mark.parametrize("make", MODULES)
@pytest.mark.parametrize("where", ["shortlist", "clusters", "both"])
def test_predict_in_and_outside_the_shortlist(make, where):
    """torch's three cases: every argmax in the shortlist, none, and half (its predict's three paths)."""
    torch.manual_seed(1)
    x = torch.randn(64 if where != "both" else 32, 8).abs_()
    asfm = make(8, 10, [4, 8], div_value=2.0, head_bias=True)
    with torch.no_grad():
        asfm.head.weight.abs_()
        asfm.head.bias.abs_()
        if where == "shortlist":
            asfm.head.weight[asfm.shortlist_size:].zero_()
        else:
            asfm.head.weight[: asfm.shortlist_size].zero_()
        assert torch.equal(asfm.predict(x), asfm.log_prob(x).argmax(1))


# -- modules.cpp: the same module through the C++ API's checks ----------------------------------------------
@pytest.mark.parametrize("make", MODULES)
def test_cpp_api_checks(make):
    """The C++ test's own: a log_prob over 4 classes sums to one, forward's loss is nll_loss of it, and a
    ``[1]`` target and a 0-dim one agree."""
    asfm = make(8, 4, [2], div_value=2.0)
    x = torch.randn(4, 8)
    with torch.no_grad():
        log_prob = asfm.log_prob(x)
        torch.testing.assert_close(log_prob.exp().sum(1), torch.ones(4))
        for v in range(4):
            y = torch.full((4,), v, dtype=torch.long)
            output, loss = asfm(x, y)
            torch.testing.assert_close(output, log_prob.gather(1, y[:, None]).squeeze(1))
            torch.testing.assert_close(loss, F.nll_loss(log_prob, y))
        torch.testing.assert_close(asfm(x[:1], torch.tensor([3])).output[0], asfm(x[0], torch.tensor(3)).output)


# -- checkpoints: torch's module's state_dict loads into AdaptiveSoftmax and back ----------------------------
def test_a_torch_checkpoint_loads_into_adaptive_softmax_and_back():
    ours, theirs = AdaptiveSoftmax(16, 20, [5, 10, 15], div_value=2.0, head_bias=True), torch_module(
        16, 20, [5, 10, 15], div_value=2.0, head_bias=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x, y = torch.randn(6, 16), torch.tensor([0, 4, 5, 12, 17, 19])
    torch.testing.assert_close(ours(x, y).output, theirs(x, y).output, rtol=0, atol=0)
    again = torch_module(16, 20, [5, 10, 15], div_value=2.0, head_bias=True)
    torch.nn.init.zeros_(again.head.weight)
    again.load_state_dict(ours.state_dict())
    torch.testing.assert_close(again(x, y).output, theirs(x, y).output, rtol=0, atol=0)


def test_a_checkpoint_from_before_torch_s_layout_still_loads():
    """Heads saved while torch's module sat under ``asm`` (and with their word order) load as they were."""
    counts = torch.randperm(20).double()
    saved = AdaptiveSoftmax(16, 20, [5, 10], div_value=2.0, counts=counts)
    old = {("" if k.endswith("of_word") or k.endswith("of_rank") else "asm.") + k: v
           for k, v in saved.state_dict().items()}
    assert "asm.head.weight" in old and "rank_of_word" in old
    loaded = AdaptiveSoftmax(16, 20, [5, 10], div_value=2.0)  # id order until the checkpoint says otherwise
    loaded.load_state_dict(old)
    x, y = torch.randn(5, 16), torch.tensor([0, 3, 9, 14, 19])
    torch.testing.assert_close(loaded(x, y).output, saved(x, y).output, rtol=0, atol=0)
    assert "rank_of_word" in loaded.state_dict()  # reordered words keep their order in the next checkpoint


# -- test_module_init.py: factory kwargs --------------------------------------------------------------------
@pytest.mark.parametrize("name", head_names())
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_every_head_takes_device_and_dtype(name, device, tmp_path):
    """Parameters and the floating buffers made in the default dtype come out on ``device`` in ``dtype``; a head
    whose layout is derived from its buffers' values refuses the meta device in one line."""
    try:
        head = every_head(name, tmp_path, device=device, dtype=torch.float64)
    except ValueError as error:
        assert device == "meta" and "meta device" in str(error) and "\n" not in str(error), name
        return
    reference = every_head(name, tmp_path)
    for (key, tensor), (_, plain) in zip([*head.named_parameters(), *head.named_buffers()],
                                         [*reference.named_parameters(), *reference.named_buffers()]):
        assert tensor.device.type == device, (name, key)
        expected = torch.float64 if plain.dtype == torch.get_default_dtype() else plain.dtype
        assert tensor.dtype == expected, (name, key, tensor.dtype)
    if device == "cpu":
        hidden = torch.randn(3, D, dtype=torch.float64)
        assert head(hidden, torch.tensor([0, 7, 19])).output.dtype == torch.float64


def test_torch_s_module_takes_them_alike():
    """The rule above, on torch's module (the contract being ported)."""
    module = torch_module(16, 20, [5, 10], device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in module.parameters())


# -- positional calls that mean something else ------------------------------------------------------------
@pytest.mark.parametrize("name", head_names())
def test_torch_s_positional_call_is_refused_where_it_would_mean_another_option(name, tmp_path):
    cls = type(every_head(name, tmp_path))
    if cls is AdaptiveSoftmax:  # torch's signature, in torch's order
        head = cls(16, 20, [5, 10, 15], 2.0, True, "cpu", torch.float64)
        assert head.cutoffs == [5, 10, 15, 20] and head.head.bias.dtype == torch.float64
        return
    if cls is DifferentiatedSoftmax:  # its third argument is torch's too (cutoffs); the rest by keyword
        assert cls(16, 20, [5, 10, 15]).cutoffs == [5, 10, 15]
        with pytest.raises(TypeError, match="by keyword"):
            cls(16, 20, [5, 10, 15], 2.0)
        return
    with pytest.raises(TypeError, match="by keyword") as caught:
        cls(100, 20, [5, 10, 15])
    assert "\n" not in str(caught.value)


def test_full_softmax_no_longer_reads_cutoffs_as_bias():
    with pytest.raises(TypeError, match="AdaptiveSoftmax"):
        FullSoftmax(100, 20, [5, 10, 15])
    assert FullSoftmax(100, 20, bias=True).bias is not None
