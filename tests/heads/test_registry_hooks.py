"""What a head knows of itself beyond its options, asked through the registry by name: a run's defaults, earlier
releases' options and checkpoints, presets, the re-clustering interval, hierarchies, word2vec's binary pairs."""
from __future__ import annotations

import math

import pytest
import torch

from sohsm.head_catalogue import (
    DEFAULT_HEAD,
    NEGATIVE_SAMPLING_HEAD,
    REFERENCE_HEAD,
    WORD2VEC_HEAD,
)
from sohsm.heads import (
    HeadSetting,
    binary_pairs,
    build_head,
    head_names,
    hierarchy_options,
    legacy_options,
    preset,
    resume_refusal,
    setting_defaults,
    takes_tree,
    tree_heads,
    update_every_for,
    with_seed,
)

LSTM = HeadSetting(model="lstm", hidden_size=256, tied=True, n_words=33_000)


def test_the_catalogue_s_roles_name_registered_heads():
    assert {DEFAULT_HEAD, REFERENCE_HEAD, WORD2VEC_HEAD, NEGATIVE_SAMPLING_HEAD} <= set(head_names())


def test_a_head_s_defaults_for_a_model_and_vocabulary_are_its_own():
    """Only the self-organized head bands its words, and only for a tied LSTM over many words; it says why."""
    banded = setting_defaults("self_organized", {"gamma": 2.0}, LSTM)
    assert banded.options == {"div_value": 4}
    assert "20,000 words" in banded.reason and "self_organized" in banded.reason
    for name in ("full", "two_level_random", "adaptive", "pmi"):
        assert setting_defaults(name, {}, LSTM).options == {}, name
    assert setting_defaults("self_organized", {}, HeadSetting("transformer", 256, True, 33_000)).options == {}
    assert setting_defaults("self_organized", {}, HeadSetting("lstm", 256, True, 33_000, subwords=True)).options == {}
    assert setting_defaults("self_organized", {"div_value": None}, LSTM).options == {}


def test_a_cpu_run_keeps_q_compact_where_the_dense_q_would_pass_256_mib():
    """q_clusters=16 from about 190,000 words (the dense q: N x ceil(sqrt(N)) float32) on the CPU, with the banded
    default where that applies too; not on a GPU (its sync-free path folds the dense q), not where q_clusters or
    stay_margin is given, and a smaller n_clusters given keeps q below the limit longer."""
    million = HeadSetting("lstm", 256, True, 1_000_000)
    both = setting_defaults("self_organized", {}, million)
    assert both.options == {"div_value": 4, "q_clusters": 16}
    assert "q_clusters=16" in both.reason and "3,815 MiB" in both.reason and "div_value=4" in both.reason
    assert setting_defaults("self_organized", {}, HeadSetting("lstm", 256, True, 150_000)).options == {"div_value": 4}
    assert setting_defaults("self_organized", {}, HeadSetting("lstm", 256, True, 200_000)).options["q_clusters"] == 16
    untied = setting_defaults("self_organized", {}, HeadSetting("lstm", 256, False, 1_000_000))
    assert untied.options == {"q_clusters": 16} and untied.reason.startswith("the default on the CPU")
    on_gpu = HeadSetting("lstm", 256, True, 1_000_000, device="cuda")
    assert setting_defaults("self_organized", {}, on_gpu).options == {"div_value": 4}
    for given in ({"q_clusters": None}, {"q_clusters": 4}, {"stay_margin": 1.0}):
        assert "q_clusters" not in setting_defaults("self_organized", given, million).options, given
    assert "q_clusters" not in setting_defaults("self_organized", {"n_clusters": 60}, million).options


def test_an_earlier_release_s_options_are_the_head_s_migration():
    """A self-organized head saved before the shortlist existed had none; a shortlist given stays; others keep
    theirs."""
    assert legacy_options("self_organized", {"gamma": 2.0}) == {"gamma": 2.0, "shortlist": 0}
    assert legacy_options("self_organized", {"shortlist": 5}) == {"shortlist": 5}
    assert legacy_options("full", {"bias": True}) == {"bias": True}
    assert legacy_options("no_such_head", {"x": 1}) == {"x": 1}  # the config refuses the name itself


def test_a_banded_head_refuses_to_resume_one_widened_weight():
    state = {"weight": torch.zeros(3, 4)}
    for name in ("self_organized", "two_level_random", "two_level_frequency"):
        refusal = resume_refusal(name, {"div_value": 4}, state)
        assert refusal is not None and refusal.startswith("was written by an earlier sohsm"), name
        assert resume_refusal(name, {}, state) is None
        assert resume_refusal(name, {"div_value": 4}, {"band_weights.0": torch.zeros(3, 4)}) is None
    assert resume_refusal("full", {"div_value": 4}, state) is None


def test_word2vec_s_preset_is_negative_sampling_for_pmi_and_sparse_rows_for_trees():
    assert preset("pmi", "word2vec") == {"n_samples": 5, "noise_power": 0.75, "shift": False, "noise_per_row": True,
                                         "sparse": True}
    for name in ("tree_huffman", "tree_random", "tree_file", "tree", "nce", "importance_sampling"):
        assert preset(name, "word2vec") == {"sparse": True}, name
    assert preset("self_organized", "word2vec") == {} and preset("pmi", "no_such_preset") == {}
    preset("pmi", "word2vec")["n_samples"] = 99  # a copy: the registry's preset does not change
    assert preset("pmi", "word2vec")["n_samples"] == 5
    head = build_head("pmi", 8, 40, counts=list(range(40, 0, -1)), **preset("pmi", "word2vec"))
    assert head.binary_pairs == "noise" and head.sparse


def test_the_re_clustering_interval_of_an_epoch_is_asked_of_the_head():
    assert update_every_for("self_organized", {}, 800) == 100  # 8 re-clusterings an epoch by default
    assert update_every_for("self_organized", {"reclusters_per_epoch": 2}, 800) == 400
    assert update_every_for("self_organized", {}, 3) == 1
    assert update_every_for("full", {}, 800) is None and update_every_for("two_level_random", {}, 800) is None


def test_a_hierarchy_becomes_the_options_the_head_takes():
    assert tree_heads() == ["tree"] and takes_tree("tree") and not takes_tree("self_organized")
    assert hierarchy_options("tree", {}, tree=[[0, 1], [2]]) == {"tree": [[0, 1], [2]]}
    assert hierarchy_options("self_organized", {}, n_clusters=3) == {"n_clusters": 3, "shortlist": 0}
    assert hierarchy_options("two_level_random", {}, n_clusters=3) == {"n_clusters": 3}
    with pytest.raises(ValueError, match="takes no tree; use the 'tree' head"):
        hierarchy_options("full", {}, tree=[[0, 1]])
    with pytest.raises(ValueError, match="no word clusters and takes no hierarchy; use the 'tree' head or a two-level"):
        hierarchy_options("full", {}, n_clusters=3)
    with pytest.raises(ValueError, match="has 4 clusters but the hierarchy 3"):
        hierarchy_options("self_organized", {"n_clusters": 4}, n_clusters=3)
    assert with_seed("two_level_random", {}, 7) == {"seed": 7}
    assert with_seed("two_level_random", {"seed": 1}, 7) == {"seed": 1} and with_seed("full", {}, 7) == {}


def test_binary_pairs_give_a_tree_s_paths_and_negative_sampling_s_noise():
    """The pairs' scores, shifted and summed as ``-log sigma(+-f)``, are the head's own training loss."""
    counts = list(range(20, 0, -1))
    hidden, targets = torch.randn(5, 8, dtype=torch.float64), torch.tensor([0, 3, 3, 19, 7])
    tree = build_head("tree_huffman", 8, 20, counts=counts).double()
    pairs = binary_pairs(tree)
    nodes, labels, lengths = pairs(targets)
    assert pairs.vectors is tree.weight and pairs.offset == 0.0 and pairs.by_word is not None
    assert lengths.tolist() == tree.path_lengths()[targets].tolist() and nodes.numel() == int(lengths.sum())
    rows = torch.repeat_interleave(torch.arange(5), lengths)
    scores = (hidden[rows] * tree.weight[nodes]).sum(-1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, labels, reduction="sum")
    assert torch.allclose(loss, tree(hidden, targets).loss * 5)

    pmi = build_head("pmi", 8, 20, counts=counts, n_samples=3, noise_per_row=True)
    pairs = binary_pairs(pmi)
    nodes, labels, lengths = pairs(targets)
    assert pairs.by_word is None and pairs.offset == pytest.approx(math.log(3))
    assert lengths.tolist() == [4] * 5 and labels.view(5, 4)[:, 0].tolist() == [1.0] * 5
    assert nodes.view(5, 4)[:, 0].tolist() == targets.tolist() and labels.view(5, 4)[:, 1:].sum() == 0
    assert binary_pairs(build_head("full", 8, 20)) is None
