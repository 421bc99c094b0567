"""A head's extra state (``get_extra_state``: a Python dict) as a tensor, so that safetensors can hold it.

``save_pretrained`` and the ``Trainer``'s checkpoints write the model's state dict with safetensors, which
holds tensors only. A sohsm head keeps part of its state in ``_extra_state`` entries (the self-organized
head's re-clustering history, tokens seen and K; a sampled head's generator): :func:`encode_extra_states`
writes each as the bytes of ``torch.save`` in a ``uint8`` tensor under the same key, marked by
:data:`MAGIC`, and :func:`decode_extra_states` reads them back (``torch.load(weights_only=True)``: plain
containers and tensors only) before the head loads them. Both are state-dict hooks of
:class:`~sohsm.hf.head.LMHead`, so every state dict of the model, whoever writes or reads it, carries them.
"""
from __future__ import annotations

import io

import torch
from torch import Tensor, nn

#: the first bytes of an encoded extra state
MAGIC = b"sohsm.extra_state/1\n"
_KEY = "_extra_state"


def _is_extra_state(key: str, prefix: str) -> bool:
    return key.startswith(prefix) and (key == _KEY or key.endswith("." + _KEY))


def encode(value) -> Tensor:
    """``value`` (what ``get_extra_state`` returned) as a 1-D ``uint8`` tensor: :data:`MAGIC`, then ``torch.save``'s
    bytes."""
    buffer = io.BytesIO()
    buffer.write(MAGIC)
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def decode(tensor: Tensor):
    """The value :func:`encode` wrote into ``tensor``; ``tensor`` itself where it holds no encoded state."""
    if not (isinstance(tensor, Tensor) and tensor.dtype == torch.uint8 and tensor.dim() == 1):
        return tensor
    data = tensor.cpu().numpy().tobytes()
    if not data.startswith(MAGIC):
        return tensor
    return torch.load(io.BytesIO(data[len(MAGIC):]), weights_only=True)


def encode_extra_states(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """State-dict post-hook: every non-tensor ``_extra_state`` under ``prefix`` becomes an encoded tensor."""
    for key, value in list(state_dict.items()):
        if _is_extra_state(key, prefix) and not isinstance(value, Tensor):
            state_dict[key] = encode(value)


def decode_extra_states(module: nn.Module, state_dict: dict, prefix: str, local_metadata, strict, missing_keys,
                        unexpected_keys, error_msgs) -> None:
    """Load-state-dict pre-hook: every encoded ``_extra_state`` under ``prefix`` is read back into its value."""
    for key, value in list(state_dict.items()):
        if _is_extra_state(key, prefix):
            state_dict[key] = decode(value)
