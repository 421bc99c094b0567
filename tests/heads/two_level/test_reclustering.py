"""Reclustering: the self-organized head's re-clustering options as one typed, validated group, the same
whether a library user makes it or the registry makes it from flat options (build_head, --head-option)."""
import dataclasses

import pytest
import torch

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, build_head, head_options

D, N = 8, 60


def _counts() -> torch.Tensor:
    return torch.arange(N, 0, -1)


@pytest.mark.parametrize("options, match", [
    ({"gamma": 0}, "gamma must be positive, got 0"),
    ({"freq_budget": -0.1}, "freq_budget must be positive"),
    ({"reclusters_per_epoch": float("inf")}, "reclusters_per_epoch must be positive"),
    ({"update_growth": 0.5}, "update_growth must be a finite number >= 1"),
    ({"update_every": -1}, r"update_every must be None or an integer >= 0, got -1"),
    ({"update_every": 2.0}, r"update_every must be None or an integer >= 0, got 2.0"),
    ({"freeze_after_tokens": True}, "freeze_after_tokens must be None or an integer"),
    ({"first_update": 0}, r"first_update must be None or an integer >= 1, got 0"),
    ({"smoothing": "paper"}, "smoothing must be one of epoch, paper_literal, got 'paper'"),
    ({"solver": "greedy"}, "solver must be one of auto, sequential, deferred_acceptance"),
    ({"reset_on_freeze": "all"}, "reset_on_freeze must be one of none, head, head_keep_state"),
    ({"moved_vectors": "mean"}, "moved_vectors must be one of keep, cluster_mean"),
    ({"stay_margin": -1.0}, "stay_margin must be a finite number >= 0"),
    ({"stay_margin": 1.0, "q_clusters": 2}, "stay_margin needs the dense q"),
])
def test_a_value_out_of_range_is_refused_when_the_group_is_made_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        Reclustering(**options)
    with pytest.raises(ValueError, match=f"head 'self_organized': .*{match.split(' must')[0]}"):
        build_head("self_organized", D, N, counts=_counts(), **options)  # by name: the same check


def test_the_group_is_frozen_and_its_defaults_are_the_papers_limits_and_eight_reclusterings_an_epoch():
    group = Reclustering()
    assert (group.gamma, group.freq_budget, group.update_every, group.reclusters_per_epoch) == (1.5, 0.1, None, 8.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.gamma = 2.0


def test_the_registry_lists_the_groups_fields_as_options_by_their_own_names_with_their_types():
    options = head_options("self_organized")
    assert "reclustering" not in options
    for field in dataclasses.fields(Reclustering):
        assert options[field.name].default == field.default
    assert options["update_every"].type == (int | None) and options["gamma"].type is float
    with pytest.raises(ValueError, match="option gamma must be float, got 'two'"):
        build_head("self_organized", D, N, gamma="two")


def test_flat_options_by_name_and_the_typed_group_build_the_same_head():
    flat = build_head("self_organized", D, N, counts=_counts(), gamma=2.0, update_every=3, smoothing="paper_literal",
                      n_clusters=6, seed=4)
    torch.manual_seed(0)
    grouped = SelfOrganizedSoftmax(D, N, counts=_counts(), n_clusters=6, seed=4,
                                   reclustering=Reclustering(gamma=2.0, update_every=3, smoothing="paper_literal"))
    assert flat.reclustering == grouped.reclustering
    assert (flat.update_every, flat.max_cluster_size, flat.statistics.smoothing) == \
        (grouped.update_every, grouped.max_cluster_size, grouped.statistics.smoothing) == (3, 16, "paper_literal")
    assert torch.equal(flat.assignment, grouped.assignment)


def test_take_removes_the_groups_options_and_leaves_the_heads_own():
    options = {"gamma": 2.0, "init": "frequency", "update_every": 5}
    assert Reclustering.take(options) == Reclustering(gamma=2.0, update_every=5)
    assert options == {"init": "frequency"}


def test_a_group_given_as_a_dict_is_refused():
    with pytest.raises(ValueError, match="reclustering must be a Reclustering, got dict"):
        SelfOrganizedSoftmax(D, N, reclustering={"gamma": 2.0})


@pytest.mark.parametrize("shortlist", [0, 8])
def test_a_stay_margin_keeps_words_whose_gain_is_smaller(shortlist):
    """``stay_margin`` adds to each word's own cluster in q: a margin above every gain moves nothing, and the median
    gain moves fewer words than no margin, still some (limits loose enough that the random start obeys them: a
    start over a limit makes Algorithm 1 move words whatever the margin, and a word whose own cluster others filled
    moves too)."""
    def reassigned(margin):
        torch.manual_seed(0)
        head = build_head("self_organized", D, N, counts=_counts(), shortlist=shortlist, update_every=0,
                          stay_margin=margin, gamma=3.0, freq_budget=1.0)
        head.train()
        for _ in range(4):
            head(torch.randn(32, D), torch.randint(0, N, (32,)))
        before, q = head.assignment.clone(), head.statistics_rows().clone()
        head.reassign()
        return before, q, head.assignment.clone()

    before, q, plain = reassigned(0.0)
    assert bool((plain != before).any()), "the test should move words without a margin"
    own = q[torch.arange(N), before - shortlist] if shortlist else q[torch.arange(N), before]
    gain = q.max(1).values - own  # what the best cluster beats the word's own by
    margin = float(gain[shortlist:].max()) + 1.0
    _, _, kept = reassigned(margin)
    assert torch.equal(kept, before)
    half = float(gain[shortlist:].median())
    _, _, some = reassigned(half)
    assert 0 < int((some != before).sum()) < int((plain != before).sum())
