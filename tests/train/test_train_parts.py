"""Building blocks of the training loop: optimizers from a config, checkpoints, metrics."""
from __future__ import annotations

import json

import pytest
import torch

from small_run import small_config, small_vocab
from sohsm.data import Vocabulary
from sohsm.tasks.lm import LMConfig as TrainConfig, build_model_and_head
from sohsm.train import MetricsLog, apply_overrides, build_optimizer, read_metrics
from sohsm.train.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint, write_atomic


@pytest.fixture
def vocab():
    return small_vocab()


def test_weight_decay_on_the_lstm_only_and_tied_weights_counted_once(vocab):
    config = small_config(**{"model.tie_weights": True})
    model, head = build_model_and_head(config, vocab)
    optimizer = build_optimizer(config, model, head)
    decay, rest = optimizer.param_groups
    assert decay["weight_decay"] == 1e-6 and rest["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(p) for p in model.lstm.parameters()}
    all_ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert len(all_ids) == len(set(all_ids))
    assert id(model.embedding.weight) in all_ids and head.weight is model.embedding.weight
    assert isinstance(optimizer, torch.optim.Adagrad) and rest["lr"] == 0.1


def test_checkpoints_are_written_atomically(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"format": "sohsm.lm-checkpoint/1", "step": 1})
    before = path.read_bytes()

    def fail(handle):
        handle.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, fail)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["step"] == 1


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a sohsm"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a run directory"):
        checkpoint_path(tmp_path / "nope")
    save_checkpoint(tmp_path / "last.pt", {"format": "sohsm.lm-checkpoint/1"})
    assert checkpoint_path(tmp_path, "best") == tmp_path / "last.pt"  # before any evaluation


def test_a_checkpoint_cut_short_says_so_in_one_sentence_and_whether_the_other_is_intact(tmp_path):
    """A truncated last.pt: torch's zip error in its first sentence (no advice, no cut at '...'), and best.pt
    beside it named with its step when it reads."""
    save_checkpoint(tmp_path / "best.pt", {"format": "sohsm.lm-checkpoint/1", "step": 800})
    data = (tmp_path / "best.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as info:
        load_checkpoint(tmp_path / "last.pt")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'last.pt'}: not a readable checkpoint (the file is cut short or "
                              "damaged: PytorchStreamReader failed reading zip archive"), message
    assert message.endswith("); best.pt beside it is intact (step 800)") and "..." not in message, message
    assert "miniz" not in message and "\n" not in message
    (tmp_path / "best.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"\(the file is cut short or damaged: it ends too early\); last.pt beside "
                                         "it is damaged too$"):
        load_checkpoint(tmp_path / "best.pt")
    with pytest.raises(ValueError, match="; best.pt beside it is damaged too$"):
        load_checkpoint(tmp_path / "last.pt")
    for junk in (b"2" * 100, b"hello world", b"\x80\x02}q\x00."):
        (tmp_path / "junk.pt").write_bytes(junk)
        with pytest.raises(ValueError, match=r"\(not a file torch.save wrote"):
            load_checkpoint(tmp_path / "junk.pt")


def test_metrics_log_drops_records_past_the_resumed_step(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        for step in (1, 2, 3):
            log.write({"kind": "train", "step": step, "ppl": float("inf")})
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "tr')  # a torn line
    with MetricsLog(tmp_path, keep_until_step=2, tensorboard=False) as log:
        log.write({"kind": "eval", "step": 3, "ppl": 5.0})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("train", 2), ("eval", 3)]
    assert records[0]["ppl"] is None  # JSON has no infinity
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line)


def test_metrics_are_mirrored_to_tensorboard_when_it_is_installed(tmp_path, monkeypatch):
    import sys
    import types

    scalars = []

    class FakeWriter:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def close(self):
            scalars.append("closed")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    with MetricsLog(tmp_path) as log:
        log.write({"kind": "eval", "step": 7, "ppl": 12.5, "ppl_cluster": None, "split": "valid"})
    assert ("eval/ppl", 12.5, 7) in scalars and scalars[-1] == "closed"
    assert not any(tag == "eval/ppl_cluster" for tag, *_ in scalars[:-1])


def test_the_loop_reads_declared_attributes_of_heads_and_configs():
    """Sparse gradients and the step's precision are declared (Head.sparse, RunConfig.amp/compile), not probed."""
    from sohsm.heads import build_head
    from sohsm.tasks.s2s import S2SConfig
    from sohsm.tasks.w2v import W2VConfig
    from sohsm.train.builders import can_fuse

    dense, sparse = build_head("full", 8, 20), build_head("nce", 8, 20, sparse=True)
    assert dense.sparse is False and sparse.sparse is True
    assert can_fuse(list(dense.parameters()), dense) and not can_fuse(list(sparse.parameters()), sparse)
    for config in (S2SConfig(), W2VConfig()):  # tasks without the fields train in float32, eagerly
        assert config.amp is None and config.compile is False
        assert "amp" not in config.to_dict() and "compile" not in config.to_dict()
    lm = apply_overrides(TrainConfig(), {"amp": "bf16", "compile": True})
    assert (lm.amp, lm.compile) == ("bf16", True) and lm.to_dict()["amp"] == "bf16"


def test_a_checkpoint_of_other_data_is_refused_naming_what_differs():
    from sohsm.train.checkpoint import check_same_data

    a, b = Vocabulary(["<unk>", "the", "cat"], [0, 5, 2]), Vocabulary(["<unk>", "the", "dog"], [0, 5, 2])
    check_same_data("run/last.pt", a, "ptb 1234", a, "ptb 1234", "corpus 'ptb'")  # the same data passes
    with pytest.raises(ValueError, match=r"vocabulary of run/last.pt differs from that of corpus 'ptb' as read now "
                                         r"\(.*word 2 is 'cat' in the checkpoint and 'dog' now\)"):
        check_same_data("run/last.pt", a, "ptb 1234", b, "ptb 1234", "corpus 'ptb'")
    with pytest.raises(ValueError, match=r"trained on \[ptb 1234\] but the data is now \[ptb 5678\]"):
        check_same_data("run/last.pt", a, "ptb 1234", a, "ptb 5678")


def test_each_task_makes_its_declared_locations_absolute(tmp_path, monkeypatch):
    from sohsm.tasks.lm import LMTask
    from sohsm.tasks.s2s import S2STask
    from sohsm.tasks.w2v import W2VTask

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytext").mkdir()
    given = {"data.corpus": "mytext", "data.data_dir": "d", "data.clusters_from": "c.json", "epochs": 2}
    lm = LMTask.absolute_locations(given)
    assert lm == {"data.corpus": str(tmp_path / "mytext"), "data.data_dir": str(tmp_path / "d"),
                  "data.clusters_from": str(tmp_path / "c.json"), "epochs": 2}
    assert LMTask.absolute_locations({"data.corpus": "ptb"}) == {"data.corpus": "ptb"}  # a known name stays
    w2v = W2VTask.absolute_locations(given)
    assert w2v["data.corpus"] == lm["data.corpus"] and w2v["data.clusters_from"] == "c.json"  # not a w2v location
    s2s = S2STask.absolute_locations(given)
    assert s2s["data.corpus"] == "mytext" and s2s["data.data_dir"] == str(tmp_path / "d")
    assert given["data.data_dir"] == "d"  # the overrides given are not changed


def test_the_optimizer_step_is_one_the_device_supports(monkeypatch):
    """Fused where torch fuses that optimizer on that device (Adagrad on the CPU), torch's default step elsewhere
    (CUDA has no fused Adagrad: asking for one there fails at the first step), found by trying one."""
    from sohsm.train import builders

    assert builders.fused_step_supported(torch.optim.Adagrad, "cpu")
    assert builders.fused_step_supported(torch.optim.Adam, "cpu")
    assert not builders.fused_step_supported(torch.optim.Adagrad, "meta")  # no fused step on this device
    config = apply_overrides(small_config(), {"optim.optimizer": "adagrad"})
    model, head = build_model_and_head(config, small_vocab())
    assert build_optimizer(config, model, head).defaults["fused"] is True
    # a device whose torch has no fused Adagrad (as CUDA's): the default step, which takes a step there
    monkeypatch.setattr(builders, "fused_step_supported", lambda cls, device: cls is not torch.optim.Adagrad)
    optimizer = build_optimizer(config, model, head)
    assert not optimizer.defaults["fused"]
    for p in optimizer.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    optimizer.step()
    adam = build_optimizer(apply_overrides(config, {"optim.optimizer": "adam"}), model, head)
    assert adam.defaults["fused"] is True


def test_ddp_is_told_not_to_sync_buffers_at_forward_in_the_spelling_of_its_torch():
    """torch 2.13 spells it ``forward_sync_buffers``, the releases before it (2.11 on a GPU machine) only
    ``broadcast_buffers``: passing the new name to an old DDP fails at construction."""
    from sohsm.train.distributed import no_buffer_sync_at_forward

    class OldDDP:
        def __init__(self, module, device_ids=None, broadcast_buffers=True, find_unused_parameters=False):
            pass

    class NewDDP(OldDDP):
        def __init__(self, module, device_ids=None, broadcast_buffers=None, find_unused_parameters=False,
                     forward_sync_buffers=None):
            pass

    assert no_buffer_sync_at_forward(OldDDP) == {"broadcast_buffers": False}
    assert no_buffer_sync_at_forward(NewDDP) == {"forward_sync_buffers": False}
    OldDDP(None, **no_buffer_sync_at_forward(OldDDP))  # accepted
