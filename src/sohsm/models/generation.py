"""Continuing a text with a language model and a head: greedy or sampled, one word at a time."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sohsm.heads.base import Head
from sohsm.models.lstm_lm import LSTMLanguageModel
from sohsm.models.transformer_lm import TransformerLM

#: the most words one call adds (a word costs a model step and a head evaluation: about a millisecond on a CPU
#: at PTB's size, so this bound is minutes of work, not hours)
MAX_LENGTH = 100_000


@torch.no_grad()
def generate(model: LSTMLanguageModel | TransformerLM, head: Head, prompt: Tensor, length: int, *, greedy: bool = False,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             on_word: Callable[[], None] | None = None) -> Tensor:
    """Continue ``prompt`` by ``length`` words.

    Greedy decoding takes ``head.predict`` (the most probable word); sampling
    draws from ``softmax(head.log_prob(h) / temperature)`` (``head.sample``: a two-level head at temperature 1
    draws a cluster, then a word of it, scoring one cluster's words). An LSTM carries its
    state from word to word; a transformer reads the last ``model.context`` words
    again for each new one (the window it was trained on).

    Args:
        model: produces the hidden states.
        head: scores them.
        prompt: ``[P]`` word ids, ``P >= 1``.
        length: number of words to add.
        greedy: take the most probable word instead of sampling.
        temperature: sharpens (< 1) or flattens (> 1) the sampling distribution.
        generator: the random generator sampling draws from (seed it for reproducible text).
        on_word: called after each added word (a progress bar's update).

    Returns:
        ``[length]`` word ids (the continuation only).

    Raises:
        ValueError: an empty prompt, a length outside ``[0, MAX_LENGTH]`` or a non-positive temperature.
    """
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of word ids, got shape {tuple(prompt.shape)}")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_LENGTH:
        raise ValueError(f"length must be an integer in [0, {MAX_LENGTH}], got {length!r}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    was_training = model.training, head.training
    model.eval()
    head.eval()
    try:
        device = next(model.parameters()).device
        window = model.context if isinstance(model, TransformerLM) else None
        text = prompt.to(device)
        hidden, state = model((text if window is None else text[-window:])[:, None])  # [P, 1, d]
        last = hidden[-1]  # [1, d]
        out = torch.empty(length, dtype=torch.long, device=device)
        for i in range(length):
            if greedy:
                word = head.predict(last)  # [1]
            else:
                word = head.sample(last, temperature, generator)  # [1]
            out[i] = word[0]
            if window is None:
                hidden, state = model(word[None, :], state)
            else:
                text = torch.cat([text, word])[-window:]  # the last `window` words
                hidden, _ = model(text[:, None])
            last = hidden[-1]
            if on_word is not None:
                on_word()
        return out.cpu()
    finally:
        model.train(was_training[0])
        head.train(was_training[1])
