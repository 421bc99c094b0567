"""The ``Trainer``'s side: :class:`HeadCallback` attaches the model's sohsm head to the optimizer it builds."""
from __future__ import annotations

import weakref

import torch
from transformers import TrainerCallback

from sohsm.hf.head import head_of


def torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` that steps, inside the wrappers ``accelerate`` puts around it.

    The head hooks that one: its step is the one that happens (a skipped mixed-precision step, or a step
    between gradient accumulations, is none) and its state is the one re-clustering moves with the words.
    """
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


class HeadCallback(TrainerCallback):
    """Attach the model's sohsm head (:func:`~sohsm.hf.use_head`) to the ``Trainer``'s optimizer.

    ``head.attach(optimizer)`` lets the self-organized head re-cluster after optimizer steps (and move the
    optimizer's state with the words); the ``Trainer`` builds its optimizer inside ``train()``, so this
    callback attaches the head when training begins (``on_train_begin``), and again at a step's start if
    the optimizer was built or replaced later. Harmless for a head that does not re-cluster. Pass it to the
    ``Trainer``: ``Trainer(model, args, ..., callbacks=[sohsm.hf.HeadCallback()])``; nothing else is needed,
    and a run resumed from a checkpoint (``train(resume_from_checkpoint=...)``) re-clusters where the
    uninterrupted one would, as the head's step count, clusters and statistics are in the checkpoint.
    """

    def __init__(self) -> None:
        self._attached: weakref.ReferenceType | None = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._attach(model, optimizer)

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._attach(model, optimizer)

    def _attach(self, model, optimizer) -> None:
        if model is None or optimizer is None:
            return
        optimizer = torch_optimizer(optimizer)
        if self._attached is not None and self._attached() is optimizer:
            return
        head_of(model).attach(optimizer)
        self._attached = weakref.ref(optimizer)
