"""Checks that can run before training starts, so a refused run is refused before it writes anything.

:func:`check_run_fits` is called once the corpus is loaded and before the model
is built or the run directory created: a batch wider than the training split,
an evaluation batch wider than the dev split, and a model too large for the
device's memory would otherwise fail only after training began (the evaluation
batch at the first evaluation, which then loses the step's checkpoint).
"""
from __future__ import annotations

import os
import sys

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


def activation_bytes(config: LMConfig) -> int:
    """About the bytes of what one training step keeps for its backward pass in the model (float32): an LSTM's
    embeddings, dropout masks, gates and states per token and layer; a transformer's per block (Korthikanti et al.
    2022: 34 numbers a token and width, 5 an attention head and position, which float32 doubles), and the head's
    input. The head's own (the full softmax's logits) is the head's :meth:`~sohsm.heads.Head.memory_estimate`."""
    m, h, tokens = config.model, config.model.hidden_size, config.bptt * config.batch_size
    if m.architecture == "transformer":
        per_block = 2 * (34 * h + 5 * m.attention_heads * config.bptt)  # bytes a token
        return tokens * (m.layers * per_block + 4 * _FLOAT * h)
    per_token = 3 * m.emb_size + 8 * h * m.layers + 2 * h  # embedding, its dropout and mask; gates, states; output
    return tokens * per_token * _FLOAT


def peak_estimate(config: LMConfig, n_words: int, trained: int, graph: bool = False) -> tuple[int, str]:
    """About the peak memory of a run whose model and head are built (``trained``: the bytes of their trained
    weights), on the CPU, and how it adds up: what the process holds now (the runtime, the corpus, the weights,
    Adagrad's state), the gradients, Adam's moments (made at the first step), the head's step (:meth:`~sohsm.heads
    .Head.memory_estimate`) and the model's activations (:func:`activation_bytes`)."""
    now = process_bytes()
    head = config.head.spec(check=False).memory_estimate(config.model.hidden_size, n_words,
                                                         config.bptt * config.batch_size)
    later = trained * (1 + (OPTIMIZER_STATE.get(config.optim.optimizer, 2) if config.optim.optimizer != "adagrad"
                            else 0))
    step = head.extra_bytes + activation_bytes(config)
    if graph:
        step += estimate_bytes(config, n_words, graph=True)[0] - estimate_bytes(config, n_words)[0]
    parts = f"{format_bytes(now)} held now, {format_bytes(later)} of gradients" + (
        " and optimizer state" if config.optim.optimizer != "adagrad" else "") + f", {format_bytes(step)} a step"
    reached = peak_so_far()
    if reached > now + later + step:  # loading the corpus or building the model took more than a step will
        return reached, f"reached while loading and building; training: {parts}"
    return now + later + step, parts


def peak_so_far() -> int:
    """The most memory this process has held so far (its maximum resident set; 0 where the system gives none)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kilobytes on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def process_bytes() -> int:
    """The memory this process holds now (resident, read from ``/proc``; 0 where it cannot be read): the runtime,
    the corpus and, once built, the model."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0


def device_memory(device: torch.device) -> int | None:
    """The memory a run on ``device`` can still take, in bytes, or ``None`` if unknown: a GPU's total, the CPU's
    available RAM (``MemAvailable``: free and reclaimable, not what other processes hold), else its total."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
        try:
            with open("/proc/meminfo", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
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
    needed += activation_bytes(config)
    covers += " and activations"
    if needed > available:
        m = config.model
        other = head_that_fits(config, n_words, available)
        advice = (f"; --head {other[0]} would need at least {format_bytes(other[1])}" if other is not None
                  else "; no head fits at these sizes")
        raise FieldError(
            escape(f"the model does not fit: its {covers} need about {format_bytes(needed)}, more than the "
                   f"{format_bytes(available)} of memory {device} has free (") + "{}, {}, {}, {}, "
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
        other = with_vocabulary_options(other, n_words)[0]
        needed = estimate_bytes(other, n_words)[0] + activation_bytes(other)
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
