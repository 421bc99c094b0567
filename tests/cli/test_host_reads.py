"""The proof, on any machine, that a language model trains without reading values back to the host every step.

On a GPU every read of a tensor's value (``item``, ``tolist``, ``bool()``, ...) waits
for the device. This test runs ``sohsm lm train`` on the CPU through the code path a
GPU takes (the sync-free in-cluster softmax, Algorithm 1 on ``q``'s device), counts
every such read, and sorts them by where they happen: inside an ordinary step (none
allowed), inside a re-clustering, and between steps (log lines, checkpoints).
"""
from __future__ import annotations

import collections

import pytest
import torch

from sohsm.heads.two_level.self_organizing.self_organized import SelfOrganizedSoftmax
from sohsm.train import step as train_step

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
STEPS, LOG_EVERY, CHECKPOINT_EVERY = 90, 20, 30


class _Counter:
    """Counts host reads into the bucket named by :attr:`phase`."""

    def __init__(self):
        self.phase = None
        self.counts = collections.Counter()

    def read(self):
        if self.phase is not None:
            self.counts[self.phase] += 1


@pytest.mark.parametrize("head_options", [
    ["--head", "self_organized", "--head-option", "backend=grouped_torch",
     "--head-option", "solver=deferred_acceptance", "--head-option", "update_every=25"],
    ["--head", "two_level_frequency", "--head-option", "backend=grouped_torch"],
    ["--head", "adaptive"],
    ["--head", "full"],
])
def test_training_steps_read_nothing_back(tmp_path, ptb_slice, small, cli, monkeypatch, head_options):
    counter = _Counter()
    for name in READS:
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _real=real, **k: (counter.read(), _real(self, *a, **k))[1])
    call, reassign = train_step.TrainStep.__call__, SelfOrganizedSoftmax.reassign

    def counted_step(self, batch, step):
        counter.phase = ("step", step)
        try:
            return call(self, batch, step)
        finally:
            counter.phase = ("after", step)  # the loop's work until the next step: log lines, checkpoints

    def counted_reassign(self, *args, **kwargs):
        outer = counter.phase
        counter.phase = ("recluster", outer[1])
        try:
            return reassign(self, *args, **kwargs)
        finally:
            counter.phase = outer

    monkeypatch.setattr(train_step.TrainStep, "__call__", counted_step)
    monkeypatch.setattr(SelfOrganizedSoftmax, "reassign", counted_reassign)
    tokens_per_step = 16 * 10  # the small model's batch x BPTT
    code, out, err = cli("lm", "train", "--corpus", ptb_slice, *head_options, "--run-dir", tmp_path / "run", *small,
                         "--max-tokens", STEPS * tokens_per_step, "--eval-every", 0, "--log-every", LOG_EVERY,
                         "--checkpoint-every", CHECKPOINT_EVERY)
    assert code == 0, err
    steps = {step: counter.counts[("step", step)] for step in range(2, STEPS + 1)}
    assert steps == dict.fromkeys(steps, 0), "a training step read a value back"
    # the first step of a session may read the self-organized head's step count once (then kept on the host)
    assert counter.counts[("step", 1)] <= (head_options[1] == "self_organized")
    reclusters = {k[1]: v for k, v in counter.counts.items() if k[0] == "recluster"}
    if head_options[1] == "self_organized":
        assert sorted(reclusters) == [25, 50, 75]
        assert max(reclusters.values()) <= 64, reclusters  # a bounded number per re-clustering
    else:
        assert reclusters == {}
    between = {step: counter.counts[("after", step)] for step in range(1, STEPS)}
    for step, reads in between.items():
        events = (step % LOG_EVERY == 0) + (step % CHECKPOINT_EVERY == 0)
        if events == 0:
            assert reads == 0, f"between steps {step} and {step + 1}: {reads} reads with nothing to log or save"
        else:
            assert reads <= 64 * events, f"after step {step}: {reads} reads for {events} log line(s)/checkpoint(s)"
