"""What the loop builds for every task: the device, the optimizer, the run's signature.

A task builds its own model and head (:meth:`sohsm.train.task.Task.build`); the
head of any task is built by :func:`sohsm.tasks.heads.build_run_head`.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sohsm.data.vocab import Vocabulary
from sohsm.fields import FieldError
from sohsm.heads import ClusteredHead, Head, SelfOrganizingHead
from sohsm.train.config import RunConfig
from sohsm.train.early import unavailable
from sohsm.version import __version__

#: optimizer classes by config name
OPTIMIZER_CLASSES: dict[str, Callable[..., torch.optim.Optimizer]] = {  # classes called with lr=, fused=
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}


#: device types a run can train and evaluate on
DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)``, refusing a device this machine does not have or that cannot run a model.

    ``meta`` (shapes without data) and other special devices are refused by name.
    """
    device = torch.device(name)
    if device.type not in DEVICE_TYPES:
        raise FieldError.on("device",
                            f"{name!r} cannot train or evaluate a model; use one of {', '.join(DEVICE_TYPES)}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(unavailable(name, "CUDA"))
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(unavailable(name, "MPS"))
    return device


def unique_parameters(*modules: nn.Module) -> list[nn.Parameter]:
    """Parameters of all ``modules``, each once (a tied weight belongs to two modules)."""
    seen: set[int] = set()
    out = []
    for p in itertools.chain.from_iterable(m.parameters() for m in modules):
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def build_optimizer(config: RunConfig, model: nn.Module, head: Head) -> torch.optim.Optimizer:
    """The run's optimizer with two parameter groups: those weight decay applies to and the rest (none).

    The model says which of its parameters decay (``model.decayed_parameters()``: an LSTM's, a
    transformer's linear maps); the head's never do.
    """
    decay = model.decayed_parameters()  # type: ignore[operator]  # nn.Module's stub reads any unknown attribute as
    # Tensor | Module (its __getattr__); the run's model classes (sohsm.models) define this method
    decay_ids = {id(p) for p in decay}
    rest = [p for p in unique_parameters(model, head) if id(p) not in decay_ids]
    groups = [{"params": decay, "weight_decay": config.optim.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    optimizer_class = OPTIMIZER_CLASSES[config.optim.optimizer]
    params = [*decay, *rest]
    fused = (config.optim.fused and can_fuse(params, head)
             and all(fused_step_supported(optimizer_class, p.device.type) for p in params))
    if (optimizer_class is torch.optim.Adagrad and not fused and not head.sparse and params
            and getattr(config, "step_graph", "off") != "off" and params[0].device.type == "cuda"):
        # no fused step here (--no-fused, or a torch without a fused CUDA Adagrad; 2.13 has one): the same step,
        # sync-free, that a captured graph can replay
        from sohsm.train.device_adagrad import DeviceAdagrad

        return DeviceAdagrad(groups, lr=config.optim.learning_rate)
    return optimizer_class(groups, lr=config.optim.learning_rate, **({"fused": True} if fused else {}))


@functools.cache
def fused_step_supported(optimizer_class: Callable[..., torch.optim.Optimizer], device_type: str) -> bool:
    """Whether torch has a fused step of ``optimizer_class`` on ``device_type``, found by taking one.

    Which optimizer torch fuses where changes between releases (torch 2.13 fuses Adam, AdamW, SGD
    and Adagrad on CUDA and on the CPU; older releases fused no Adagrad on CUDA), so a tiny step is
    tried rather than a table kept. Where it fails, torch's default step is used (foreach on CUDA).
    """
    try:
        param = torch.zeros(1, device=device_type, requires_grad=True)
        param.grad = torch.zeros_like(param)
        optimizer_class([param], lr=0.1, fused=True).step()
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def can_fuse(params: list[nn.Parameter], head: Head) -> bool:
    """Whether torch's fused optimizer step takes these parameters: dense floating tensors on the CPU or CUDA.

    A head that hands out row-sparse gradients (:attr:`Head.sparse <sohsm.heads.Head.sparse>`: the
    ``sparse=True`` option of the tree and sampled heads) needs the default step, which takes them.
    """
    if head.sparse:
        return False
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def run_signature(config: RunConfig, head: Head, vocab: Vocabulary, corpus_signature: str) -> dict[str, Any]:
    """What every reported number of the run is tied to: head, clusters, K, vocabulary, corpus, seed, version."""
    return {
        "head": config.head.name,
        "clusters": head.n_clusters if isinstance(head, ClusteredHead) else None,
        "K": head_k(head),
        "vocab": len(vocab),
        "corpus": corpus_signature,
        "seed": config.seed,
        "version": __version__,
    }


def head_k(head: Head, default: int | None = None) -> int | None:
    """K of a self-organizing head (optimizer steps between re-clusterings), else ``default``."""
    return head.update_every if isinstance(head, SelfOrganizingHead) else default
