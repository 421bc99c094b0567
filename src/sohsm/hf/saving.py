"""A model with a sohsm head, read back from what ``save_pretrained`` wrote: :func:`load`.

``model.save_pretrained(path)`` (and every checkpoint a ``Trainer`` writes) already holds all of it:
``config.json`` records the head's name and options (``sohsm_head``, written by :func:`~sohsm.hf.use_head`)
and ``model.safetensors`` its state (``lm_head.head.*``: weights, clusters, statistics, step count, its
extra state as bytes) beside the ``counts`` it was built with (``lm_head.counts``). A plain
``from_pretrained`` cannot read it, as it builds an ``nn.Linear`` ``lm_head``; :func:`load` builds the model
from the config, gives it the same head with :func:`~sohsm.hf.use_head` and loads the state dict into both.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from sohsm.hf.head import SPEC, SPEC_VERSION, _install

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def load(path: str | os.PathLike[str], model_class: type[PreTrainedModel] | None = None) -> PreTrainedModel:
    """The model ``save_pretrained`` wrote to ``path``, with its sohsm head, in eval mode (as ``from_pretrained``).

    The model is built from its config in the dtype it was saved in (the class its ``architectures`` names,
    else ``AutoModelForCausalLM``; ``model_class`` chooses another), given its head again, and loaded
    exactly: every weight, the head's clusters and statistics, its options and counts.

    Raises:
        ValueError: ``path`` holds no saved model, or one without a sohsm head, or weights that do not fit.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} holds no saved model (no config.json): save one with model.save_pretrained")
    config = AutoConfig.from_pretrained(path)
    spec = getattr(config, SPEC, None)
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"{path} holds a model without a sohsm head (its config has no {SPEC}): load it with "
                         "from_pretrained")
    if int(spec.get("version", 0)) > SPEC_VERSION:
        raise ValueError(f"{path} was saved by a newer sohsm (head record version {spec['version']})")
    state = _read_weights(path)
    cls = _model_class(config, model_class)
    model = cls.from_config(config) if cls is AutoModelForCausalLM else cls._from_config(config)
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype):
        model.to(dtype)
    lm_head_name = _lm_head_name(model)
    counts = state.get(f"{lm_head_name}.counts") if spec.get("counts") else None
    if spec.get("counts") and counts is None:
        raise ValueError(f"{path}: its head was built with counts, but the weights hold no {lm_head_name}.counts")
    _install(model, spec["name"], counts, True, bool(spec.get("logits_with_loss", False)), spec.get("options", {}),
             take_over=False)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - set(model._tied_weights_keys)  # one parameter, saved once under the embedding's name
    if missing or unexpected:
        raise ValueError(f"{path}: its weights do not fit the model its config builds"
                         + (f"; missing: {', '.join(sorted(missing))}" if missing else "")
                         + (f"; unexpected: {', '.join(sorted(unexpected))}" if unexpected else ""))
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


def _model_class(config, model_class):
    if model_class is not None:
        return model_class
    for name in getattr(config, "architectures", None) or ():
        found = getattr(transformers, name, None)
        if isinstance(found, type) and issubclass(found, PreTrainedModel):
            return found
    return AutoModelForCausalLM


def _lm_head_name(model: PreTrainedModel) -> str:
    output = model.get_output_embeddings()
    for name, module in model.named_modules():
        if module is output:
            return name
    raise ValueError(f"{type(model).__name__} has no output embedding")  # pragma: no cover


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict ``save_pretrained`` wrote to ``path``: one safetensors file, or the shards its index names."""
    if (path / WEIGHTS).is_file():
        return load_file(path / WEIGHTS)
    if (path / WEIGHTS_INDEX).is_file():
        shards = sorted(set(json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(path / shard))
        return state
    raise ValueError(f"{path} holds no weights ({WEIGHTS} or {WEIGHTS_INDEX})")
