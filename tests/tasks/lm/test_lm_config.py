"""The language model's config: the paper's defaults, and runs saved by earlier versions read as they were trained."""
from __future__ import annotations

import pytest

from sohsm.tasks.lm.config import LMConfig as TrainConfig


def test_defaults_are_the_papers_text8_setting():
    c = TrainConfig()
    assert c.data.corpus == "text8" and c.head.name == "self_organized"
    assert (c.model.emb_size, c.model.hidden_size, c.model.layers) == (512, 512, 1)
    assert c.optim.optimizer == "adagrad" and c.optim.learning_rate == 0.1
    assert c.optim.clip == 0.25 and c.optim.weight_decay == 1e-6
    assert (c.bptt, c.batch_size, c.epochs) == (20, 128, 5)
    assert c.head.update_every is None  # the head's own default K = 1000


def test_a_config_saved_before_the_fused_step_keeps_the_behaviour_it_was_trained_with():
    """Runs saved before `optim.fused` existed used torch's default step and no shortlist: they keep both."""
    from sohsm.tasks.lm import LMConfig

    saved = LMConfig().to_dict()
    del saved["optim"]["fused"]
    del saved["task"]
    saved["head"] = {"name": "self_organized", "update_every": None, "options": {"gamma": 2.0}}
    config = LMConfig.from_saved(saved)
    assert config.optim.fused is False and config.head.options == {"gamma": 2.0, "shortlist": 0}
    saved["head"]["options"] = {"shortlist": 5}  # an explicit choice stays
    assert LMConfig.from_saved(saved).head.options == {"shortlist": 5}
    current = LMConfig().to_dict()  # a config of this version is read as it is
    assert LMConfig.from_saved(current) == LMConfig.from_dict(current)
    assert LMConfig.from_saved(current).optim.fused is True


def test_a_new_transformer_run_takes_the_transformer_recipe_under_the_fields_given():
    from sohsm.tasks.lm import TRANSFORMER_DEFAULTS, LMConfig

    config = LMConfig.from_overrides({"model.architecture": "transformer", "optim.warmup": 7, "model.hidden_size": 64,
                                      "model.attention_heads": 4})
    assert config.optim.optimizer == "adamw" and config.optim.lr_schedule == "cosine" and config.optim.warmup == 7
    assert (config.model.layers, config.bptt, config.batch_size) == (4, 128, 32)
    assert config.model.emb_size == config.model.hidden_size == 64  # one width: given once, taken for both
    assert all(config.get(path) == value for path, value in TRANSFORMER_DEFAULTS.items() if path != "optim.warmup")
    lstm = LMConfig.from_overrides({"model.hidden_size": 64})  # the LSTM's recipe: the paper's, warmed up
    assert lstm == LMConfig.from_dict({"model": {"hidden_size": 64, "tie_weights": False}, "optim": {"warmup": 30}})
    assert (lstm.optim.optimizer, lstm.optim.lr_schedule, lstm.optim.warmup, lstm.model.emb_size) == (
        "adagrad", "constant", 30, 512)


def test_a_new_lstm_run_warms_its_rate_up_and_a_saved_one_keeps_its_own():
    from sohsm.tasks.lm import LSTM_DEFAULTS, LMConfig

    assert LSTM_DEFAULTS == {"optim.warmup": 30}
    assert LMConfig.from_overrides({}).optim.warmup == 30
    assert LMConfig.from_overrides({"model.architecture": "lstm"}).optim.warmup == 30
    assert LMConfig.from_overrides({"optim.warmup": 0}).optim.warmup == 0  # given, it wins
    saved = LMConfig().to_dict()  # a run saved before: warmup 0 in its config.json
    assert LMConfig.from_saved(saved).optim.warmup == 0


def test_a_config_saved_before_the_transformer_is_an_lstm_with_a_constant_rate():
    from sohsm.tasks.lm import LMConfig

    saved = LMConfig().to_dict()
    del saved["model"]["architecture"], saved["model"]["attention_heads"], saved["model"]["positions"]
    del saved["optim"]["lr_schedule"], saved["optim"]["warmup"]
    assert LMConfig.from_saved(saved) == LMConfig()


@pytest.mark.parametrize("model, message", [
    ({"hidden_size": 30, "emb_size": 30, "attention_heads": 4},
     "model.hidden_size=30 must be a multiple of model.attention_heads=4"),
    ({"hidden_size": 12, "emb_size": 12, "attention_heads": 4, "positions": "rotary"},
     "rotary positions need an even head size"),
    ({"hidden_size": 32, "emb_size": 64, "attention_heads": 4}, "a transformer's model.emb_size=64 must equal"),
    ({"attention_heads": 0}, "model.attention_heads must be >= 1"),
    ({"architecture": "gru"}, "model.architecture must be one of lstm, transformer"),
])
def test_sizes_a_transformer_cannot_take_are_refused_in_one_line(model, message):
    from sohsm.tasks.lm import LMConfig

    with pytest.raises(ValueError, match=message) as caught:
        LMConfig.from_dict({"model": {"architecture": "transformer", **model}})
    assert "\n" not in str(caught.value)


def test_the_vocabulary_bands_only_a_tied_lstm_s_self_organized_head_over_words():
    """``div_value=4`` from 20,000 words, for the tied self-organized head of an LSTM over words alone: every other
    head, model, tokenizer, an untied head or an option of a word's width given leaves the options as they are."""
    from sohsm.heads.two_level.run_defaults import BANDED_FROM_WORDS
    from sohsm.tasks.lm.config import vocabulary_head_options
    from sohsm.train import apply_overrides

    def options(n_words=BANDED_FROM_WORDS, **overrides):
        base = {"data.corpus": "wikitext-2", "head.name": "self_organized", "model.tie_weights": True}
        return vocabulary_head_options(apply_overrides(TrainConfig(), {**base, **overrides}), n_words)

    assert BANDED_FROM_WORDS == 20_000
    assert options() == {"div_value": 4}
    assert options(BANDED_FROM_WORDS - 1) == {}
    assert options(**{"model.tie_weights": False}) == {}
    assert options(**{"head.name": "two_level_frequency"}) == {}
    assert options(**{"model.architecture": "transformer"}) == {}
    assert options(**{"data.tokenizer": "bpe:32000"}) == {}
    for given in ({"div_value": None}, {"div_value": 2}, {"cutoffs": [100]}, {"word_dim": 512}, {"projection": True}):
        assert options(**{"head.options": given}) == {}, given
    assert options(**{"head.options": {"gamma": 2.0}}) == {"div_value": 4}
    assert options(**{"model.hidden_size": 16, "model.emb_size": 16}) == {"div_value": 4}  # bands of 16, 4 and 1
    assert options(**{"model.hidden_size": 15, "model.emb_size": 15}) == {}  # the rarest band would have none


def test_a_vocabulary_with_unseen_words_keeps_them_apart_in_the_self_organized_head():
    """``unseen_words=apart`` where the vocabulary holds words of count 0 (a tokenizer's unused rows), for the
    self-organized head alone; none where every word is seen, or where the run's options choose."""
    from sohsm.tasks.lm.config import vocabulary_defaults, vocabulary_head_options
    from sohsm.train import apply_overrides

    def config(**overrides):
        base = {"data.corpus": "wikitext-2", "data.tokenizer": "llama3", "head.name": "self_organized",
                "model.architecture": "transformer"}
        return apply_overrides(TrainConfig(), {**base, **overrides})

    assert vocabulary_head_options(config(), 128_256, 100_816) == {"unseen_words": "apart"}
    assert "100,816 of 128,256" in vocabulary_defaults(config(), 128_256, 100_816).reason
    assert vocabulary_head_options(config(), 128_256, 0) == {}
    assert vocabulary_head_options(config(), 128_256) == {}
    assert vocabulary_head_options(config(**{"head.options": {"unseen_words": "spread"}}), 128_256, 100_816) == {}
    assert vocabulary_head_options(config(**{"head.name": "two_level_frequency"}), 128_256, 100_816) == {}
