"""Building a run's model, head and optimizer from its config (shared by training, evaluation, decoding)."""
from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

from sohsm import __version__
from sohsm.data.vocab import Vocabulary
from sohsm.heads import Head, build_head, head_options
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.train.config import TrainConfig
from sohsm.train.hierarchies import LoadedHierarchy, hierarchy_options, set_clusters, takes_tree

#: optimizer classes by config name
OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
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
        raise ValueError(f"device {name!r} cannot train or evaluate a model; use one of {', '.join(DEVICE_TYPES)}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was requested but CUDA is not available on this machine")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} was requested but MPS is not available on this machine")
    return device


def build_run_head(config: TrainConfig, vocab: Vocabulary, hierarchy: LoadedHierarchy | None = None,
                   saved_head: dict | None = None) -> Head:
    """The head named by ``config.head``, with the vocabulary's counts and the run's seed.

    The run's seed goes to heads that take a ``seed`` option (the random clusters
    of the two-level heads) unless ``config.head.options`` sets one. With
    ``hierarchy`` (from ``data.clusters_from``) the ``tree`` head takes the whole
    tree and a two-level head its clusters, fixed; with ``saved_head`` (a
    checkpoint's head state) a head built from a hierarchy takes the checkpoint's.

    Raises:
        ValueError: the head does not take one of the options (naming it and the
            head's options), or refuses a value, or takes no hierarchy.
    """
    name, d, n = config.head.name, config.model.hidden_size, len(vocab)
    options: dict[str, Any] = dict(config.head.options)
    if config.head.update_every is not None:
        options["update_every"] = config.head.update_every
    if "seed" not in options and "seed" in (head_options(name) or {}):
        options["seed"] = config.seed
    assignment = None
    if saved_head is not None and getattr(config.data, "clusters_from", None) and not takes_tree(name):
        assignment = saved_head["assignment"].cpu()
        options["n_clusters"] = int(assignment.max()) + 1
    elif hierarchy is not None:
        options, assignment = hierarchy_options(name, options, hierarchy, n)
    head = build_head(name, d, n, counts=torch.from_numpy(vocab.counts.copy()), **options)
    if assignment is not None:
        set_clusters(head, assignment, name)
    return head


def build_model_and_head(config: TrainConfig, vocab: Vocabulary, device: torch.device | str = "cpu",
                         hierarchy: LoadedHierarchy | None = None,
                         saved_head: dict | None = None) -> tuple[LSTMLanguageModel, Head]:
    """The LSTM and the head of a run, initialised from ``config.seed`` and moved to ``device``.

    Seeds torch's global generator with ``config.seed`` first, so the initial
    weights, and the dropout masks drawn afterwards, follow from the seed.
    """
    torch.manual_seed(config.seed)
    m = config.model
    model = LSTMLanguageModel(len(vocab), emb_size=m.emb_size, hidden_size=m.hidden_size, layers=m.layers,
                              dropout=m.dropout)
    head = build_run_head(config, vocab, hierarchy, saved_head)
    if m.tie_weights:
        model.tie_weights(head)
    return model.to(device), head.to(device)


def unique_parameters(*modules: nn.Module) -> list[nn.Parameter]:
    """Parameters of all ``modules``, each once (a tied weight belongs to two modules)."""
    seen: set[int] = set()
    out = []
    for p in itertools.chain.from_iterable(m.parameters() for m in modules):
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def build_optimizer(config: TrainConfig, model: LSTMLanguageModel, head: Head) -> torch.optim.Optimizer:
    """The run's optimizer with two parameter groups: the LSTM's (weight decay) and the rest (none)."""
    decay = model.lstm_parameters()
    decay_ids = {id(p) for p in decay}
    rest = [p for p in unique_parameters(model, head) if id(p) not in decay_ids]
    groups = [{"params": decay, "weight_decay": config.optim.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    fused = getattr(config.optim, "fused", False) and can_fuse([*decay, *rest], head)
    return OPTIMIZER_CLASSES[config.optim.optimizer](groups, lr=config.optim.learning_rate,
                                                     **({"fused": True} if fused else {}))


def can_fuse(params: list[nn.Parameter], head: Head) -> bool:
    """Whether torch's fused optimizer step takes these parameters: dense floating tensors on the CPU or CUDA.

    A head that hands out row-sparse gradients (``sparse=True`` of the tree and sampled heads) needs
    the default step, which takes them.
    """
    if getattr(head, "sparse", False):
        return False
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def run_signature(config: TrainConfig, head: Head, vocab: Vocabulary, corpus_signature: str) -> dict[str, Any]:
    """What every reported number of the run is tied to: head, clusters, K, vocabulary, corpus, seed, version."""
    return {
        "head": config.head.name,
        "clusters": getattr(head, "n_clusters", None),
        "K": getattr(head, "update_every", None),
        "vocab": len(vocab),
        "corpus": corpus_signature,
        "seed": config.seed,
        "version": __version__,
    }
