"""A Trainer with sohsm.hf.HeadCallback: the self-organized head re-clusters, is checkpointed, reloads, and a run
resumed from a checkpoint takes the steps the uninterrupted run took, to the bit (same machine, one thread)."""
import pytest
import torch

from needs import HF_HOW, need_packages

need_packages("transformers", "accelerate", how=HF_HOW)

from transformers import Trainer, TrainingArguments  # noqa: E402

import sohsm.hf  # noqa: E402
from tiny import VOCAB, counts, gpt2  # noqa: E402

STEPS, SAVE_EVERY, K = 16, 6, 4  # 40 rows of 4: 10 steps an epoch; checkpoints at 6 and 12, re-clusterings every 4


class LossRecorder(Trainer):
    """A Trainer that keeps every training step's loss (its logs round them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.losses.append(loss.item())
        return loss


def _rows(n=40, length=16, seed=0):
    ids = torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row} for row in ids]


def _trainer(output_dir, **arguments):
    model = gpt2()
    # stay_margin=0: words free to move in this untrained model (a take-over's default margin keeps them put)
    head = sohsm.hf.use_head(model, "self_organized", counts=counts(), update_every=K, stay_margin=0.0)
    arguments = {"max_steps": STEPS, "save_strategy": "steps", "save_steps": SAVE_EVERY, **arguments}
    args = TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=4, learning_rate=3e-3,
                             logging_steps=4, report_to=[], use_cpu=True, seed=0, data_seed=0, disable_tqdm=True,
                             dataloader_num_workers=0, **arguments)
    trainer = LossRecorder(model=model, args=args, train_dataset=_rows(), callbacks=[sohsm.hf.HeadCallback()])
    return trainer, head


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    trainer, head = _trainer(output_dir)
    start = head.assignment.clone()
    trainer.train()
    return trainer, head, start, output_dir


def test_the_head_re_clusters_under_the_trainer(uninterrupted):
    trainer, head, start, _ = uninterrupted
    assert [record["step"] for record in head.history] == [4, 8, 12, 16]
    assert int(head.steps) == STEPS
    moved = int((head.assignment != start).sum())
    assert moved > 0 and sum(record["change_rate"] for record in head.history) > 0
    assert len(trainer.losses) == STEPS


def test_a_trainer_checkpoint_loads_back_with_the_head(uninterrupted):
    trainer, head, _, output_dir = uninterrupted
    last = output_dir / f"checkpoint-{STEPS}"
    assert (last / "optimizer.pt").is_file()
    loaded = sohsm.hf.load(last)
    again = sohsm.hf.head_of(loaded)
    assert torch.equal(again.assignment, head.assignment) and torch.equal(again.q, head.q)
    assert again.history == head.history and int(again.steps) == STEPS
    ids = torch.stack([row["input_ids"] for row in _rows()[:4]])
    trainer.model.eval()
    assert torch.equal(loaded(ids, labels=ids).loss, trainer.model(ids, labels=ids).loss)


def test_a_resumed_run_takes_the_uninterrupted_runs_steps(uninterrupted, tmp_path):
    trainer, head, _, output_dir = uninterrupted
    resumed, resumed_head = _trainer(tmp_path)  # a new model and head: the checkpoint brings their state
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-12"))
    assert len(resumed.losses) == STEPS - 12
    assert resumed.losses == trainer.losses[12:]
    assert [record["step"] for record in resumed_head.history] == [4, 8, 12, 16]  # 16: re-clustered after resuming
    assert resumed_head.history == head.history
    assert torch.equal(resumed_head.assignment, head.assignment) and torch.equal(resumed_head.q, head.q)
    final = dict(trainer.model.named_parameters())
    for name, parameter in resumed.model.named_parameters():
        assert torch.equal(parameter, final[name]), name


def test_with_gradient_accumulation_the_head_counts_optimizer_steps(tmp_path):
    trainer, head = _trainer(tmp_path, gradient_accumulation_steps=2, max_steps=8, save_strategy="no")
    trainer.train()
    assert int(head.steps) == 8 and [record["step"] for record in head.history] == [4, 8]
