"""Checks that can run before training starts, so a refused run is refused before it writes anything.

:func:`check_run_fits` is called once the corpus is loaded and before the model
is built or the run directory created: a batch wider than the training split,
an evaluation batch wider than the dev split, and a model too large for the
device's memory would otherwise fail only after training began (the evaluation
batch at the first evaluation, which then loses the step's checkpoint).
"""
from __future__ import annotations

import os

import torch

from sohsm.data.loading import Corpus
from sohsm.fields import FieldError, escape, has
from sohsm.tasks.lm.config import LMConfig

#: bytes of a float32 value
_FLOAT = 4
#: optimizer state per parameter value (Adagrad's sum, Adam's two moments; SGD without momentum keeps none)
OPTIMIZER_STATE = {"adagrad": 1, "adam": 2, "adamw": 2, "sgd": 0}


def check_run_fits(config: LMConfig, corpus: Corpus, device: torch.device) -> None:
    """Refuse settings that cannot train on ``corpus`` on ``device``.

    Raises:
        ValueError: a split too short for its batch size, or a model whose
            parameters, gradients and optimizer state alone exceed the device's memory.
    """
    _check_split("training", corpus.train.numel(), "batch_size", config.batch_size)
    _check_split("dev", corpus.valid.numel(), "eval_batch_size", config.eval_batch_size)
    check_memory(config, len(corpus.vocab), device)


def _check_split(what: str, tokens: int, field: str, batch_size: int) -> None:
    """``batchify`` needs two rows of ``batch_size`` columns: a window and its next row."""
    if tokens < 2 * batch_size:
        raise FieldError(escape(f"the {what} split has {tokens:,} tokens, too few for ") + "{} "
                         + escape(f"(two tokens per column are needed; at most {max(1, tokens // 2):,} columns)"),
                         has(field, batch_size))


def estimate_bytes(config: LMConfig, n_words: int, graph: bool = False) -> tuple[int, str]:
    """A lower bound on the memory a training step needs, and what it covers.

    Counts the parameters of the model (LSTM or transformer) and the head, their gradients
    and the optimizer's state (float32), and what the head says a step holds besides
    (:meth:`~sohsm.heads.Head.memory_estimate`: the full softmax's logits, the self-organized
    head's statistics). With ``graph`` (the step captured as a CUDA graph) also what the check of a replay
    copies (:class:`~sohsm.train.step_graph.StepGraph`: the weights, gradients and optimizer state, and the
    weights an eager step wrote) and the head's static buffers. Activations of the model are left out: the
    bound stays a bound.
    """
    m, h = config.model, config.model.hidden_size
    if m.architecture == "transformer":  # per block: attention 4h^2 + 4h, MLP 8h^2 + 5h, two LayerNorms 4h
        body = m.layers * (12 * h * h + 13 * h) + 2 * h + (config.bptt * h if m.positions == "learned" else 0)
    else:
        body = sum(4 * h * ((m.emb_size if layer == 0 else h) + h) + 8 * h for layer in range(m.layers))
    head = config.head.spec(check=False).memory_estimate(h, n_words, config.bptt * config.batch_size)
    # tied, the embedding is the head's word vectors (at a large vocabulary in bands of fewer dimensions): no rows
    params = (0 if m.tie_weights else n_words * m.emb_size) + body + head.parameters
    state = params * _FLOAT * (2 + OPTIMIZER_STATE.get(config.optim.optimizer, 2))
    total = state + head.extra_bytes
    extras = [head.extra] if head.extra else []
    if graph:  # the check of a captured step: a copy of all that, the weights one eager step wrote, static buffers
        total += state + params * _FLOAT + head.graph_bytes
        extras.append("the captured step's check")
    covers = "parameters, gradients" + (f", optimizer state and {' and '.join(extras)}" if extras
                                        else " and optimizer state")
    return total, covers


def device_memory(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes (the machine's RAM for the CPU), or ``None`` if unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None


def check_memory(config: LMConfig, n_words: int, device: torch.device) -> None:
    """Refuse a model that cannot fit in ``device``'s memory, before allocating any of it.

    Raises:
        ValueError: naming the estimate, the memory available and the settings that set the size.
    """
    available = device_memory(device)
    if available is None:
        return
    needed, covers = estimate_bytes(config, n_words, graph=device.type == "cuda"
                                    and getattr(config, "step_graph", "off") != "off")
    if needed > available:
        m = config.model
        other = head_that_fits(config, n_words, available)
        advice = (f"; --head {other[0]} would need at least {format_bytes(other[1])}" if other is not None
                  else "; no head fits at these sizes")
        raise FieldError(
            escape(f"the model does not fit: its {covers} need at least {format_bytes(needed)}, more than the "
                   f"{format_bytes(available)} of memory of {device} (") + "{}, {}, {}, {}, "
            + escape(f"{n_words:,} words{advice})"), has("model.emb_size", m.emb_size),
            has("model.hidden_size", m.hidden_size), has("model.layers", m.layers), has("batch_size", config.batch_size)
        )


def head_that_fits(config: LMConfig, n_words: int, available: int) -> tuple[str, int] | None:
    """``(name, bytes)`` of the first head the registry suggests (:func:`~sohsm.heads.registry.suggested_heads`) other
    than the run's that fits in ``available`` bytes with its defaults for this model and vocabulary
    (:func:`~sohsm.tasks.lm.config.with_vocabulary_options`), or ``None``."""
    import dataclasses

    from sohsm.heads.registry import suggested_heads
    from sohsm.tasks.lm.config import with_vocabulary_options

    for name in suggested_heads():
        if name == config.head.name:
            continue
        other = dataclasses.replace(config, head=dataclasses.replace(config.head, name=name, options={}))
        needed = estimate_bytes(with_vocabulary_options(other, n_words)[0], n_words)[0]
        if needed <= available:
            return name, needed
    return None


def format_bytes(n: float) -> str:
    """``16.0 TB``, ``125.6 GB``, ``512 B`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover
