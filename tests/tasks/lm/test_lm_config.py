"""The language model's config: the paper's defaults, and runs saved by earlier versions read as they were trained."""
from __future__ import annotations

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
