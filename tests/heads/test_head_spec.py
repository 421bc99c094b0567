"""A head's options resolved once (``HeadSpec``): typed values, the answers asked before a head exists, building."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sohsm.heads import HeadSetting, HeadSpec, build_head, head_names, head_options
from sohsm.train.config import HeadConfig


def test_a_spec_holds_its_options_as_given_and_every_option_typed():
    spec = HeadSpec.of("self_organized", {"gamma": 2.0, "div_value": 4})
    assert dict(spec.given) == {"gamma": 2.0, "div_value": 4}
    assert type(spec.values).__name__ == "SelfOrganizedOptions"
    assert (spec.values.gamma, spec.values.div_value, spec.values.n_clusters) == (2.0, 4, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.values.gamma = 3.0
    with pytest.raises(TypeError):
        spec.given["gamma"] = 3.0  # read-only
    assert spec == HeadSpec.of("self_organized", {"div_value": 4, "gamma": 2.0}) != HeadSpec.of("self_organized")


def test_head_options_are_the_fields_of_the_spec_s_values():
    """``sohsm.head_options(name)`` (and ``--help``, written from it) read the same typed spec a run resolves."""
    for name in head_names():
        options, values = head_options(name), HeadSpec.of(name).values
        if options is None:
            assert values is None, name
            continue
        fields = dataclasses.fields(values)
        assert [f.name for f in fields] == list(options), name
        assert all(getattr(values, key) == option.default for key, option in options.items()), name


def test_a_spec_is_checked_once_unless_a_config_asks_before_its_options_are_checked():
    with pytest.raises(ValueError, match="has no option 'gama'"):
        HeadSpec.of("self_organized", {"gama": 2.0})
    with pytest.raises(ValueError, match="option gamma must be float"):
        HeadSpec.of("self_organized", {"gamma": "two"})
    with pytest.raises(ValueError, match="unknown head"):
        HeadSpec.of("no_such_head")
    lenient = HeadSpec.of("self_organized", {"gama": 2.0}, check=False)
    assert not lenient.checked and lenient.tying_refusal(32) is None
    with pytest.raises(ValueError, match="has no option 'gama'"):
        lenient.build(8, 50)  # building checks them


def test_a_spec_answers_tying_memory_and_a_run_s_defaults():
    assert HeadSpec.of("two_level_random", {"word_dim": 8}).tying_refusal(16) is not None
    assert HeadSpec.of("tree_huffman").tying_refusal(16) is not None
    assert HeadSpec.of("full").tying_refusal(16) is None
    banded = HeadSpec.of("self_organized", {"div_value": 4}).memory_estimate(64, 1000, rows=10)
    plain = HeadSpec.of("self_organized").memory_estimate(64, 1000, rows=10)
    assert banded.word_vectors < plain.word_vectors == 64 * 1000
    settled, added = HeadSpec.of("self_organized").settle(HeadSetting("lstm", 256, True, 30_000))
    assert added.options == {"div_value": 4} and settled.values.div_value == 4
    same, none = HeadSpec.of("full").settle(HeadSetting("lstm", 256, True, 30_000))
    assert none.options == {} and same == HeadSpec.of("full")


def test_build_head_takes_a_spec_and_builds_what_the_name_and_options_build():
    counts = torch.arange(60, 0, -1)
    spec = HeadSpec.of("self_organized", {"n_clusters": 6, "seed": 3})
    torch.manual_seed(0)
    by_spec = build_head(spec, 8, 60, counts=counts)
    torch.manual_seed(0)
    by_name = build_head("self_organized", 8, 60, counts=counts, n_clusters=6, seed=3)
    tensors = [{k: v for k, v in head.state_dict().items() if torch.is_tensor(v)} for head in (by_spec, by_name)]
    assert tensors[0].keys() == tensors[1].keys() and len(tensors[0]) > 3
    assert all(torch.equal(tensors[0][key], tensors[1][key]) for key in tensors[0])
    fewer = build_head(spec, 8, 60, counts=counts, n_clusters=5)  # an option given beside the spec wins
    assert fewer.n_clusters == build_head("self_organized", 8, 60, counts=counts, n_clusters=5).n_clusters
    assert fewer.n_clusters < by_spec.n_clusters


def test_a_run_s_head_config_resolves_to_one_spec_with_its_update_every():
    config = HeadConfig(name="self_organized", update_every=50, options={"gamma": 2.0})
    spec = config.spec()
    assert dict(spec.given) == {"gamma": 2.0, "update_every": 50} and spec.values.update_every == 50
    assert config.options == {"gamma": 2.0}  # the config keeps its own
    run = spec.for_run(7, n_clusters=4)
    assert dict(run.given) == {"gamma": 2.0, "update_every": 50, "seed": 7, "n_clusters": 4, "shortlist": 0}
