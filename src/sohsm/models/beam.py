"""Batched beam search and greedy decoding for :class:`~sohsm.models.seq2seq.AttentionSeq2Seq` with any head.

Each step asks the head for its exact top ``k`` words per beam (:meth:`Head.topk`;
for a two-level head a best-first search over clusters), so the search
never scores the whole vocabulary with a hierarchical head. A hypothesis's
score is the sum of the log-probabilities of its words, ``</s>`` included when
it ended: no length normalisation, as in Rush et al. (2015) and the paper. A
hypothesis ends at ``</s>`` or after ``max_len`` words; the best ended one wins,
else (none ended) the best unfinished one. A source stops early once its best
ended hypothesis scores at least as well as its best open one, since scores
only fall as words are added.

Without an end tag (``allow_eos=False``, the DUC setting) ``</s>`` is never
chosen and every hypothesis has exactly ``max_len`` words.

A beam wider than the vocabulary is cut to it (there are no more distinct next
words). A step scores ``beam * beam`` candidates per source, so memory grows with
the square of the beam: before it starts, the search estimates what one source
needs (:func:`beam_memory_bytes`), decodes the batch in as many pieces as the
memory at hand requires, and refuses with :class:`BeamTooWide` a beam of which
not even one source would fit.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor

from sohsm.heads.base import Head
from sohsm.models.seq2seq import AttentionSeq2Seq


class Hypothesis(NamedTuple):
    """A decoded headline.

    Attributes:
        ids: the words (``</s>`` left out).
        score: sum of the log-probabilities of the words (and of ``</s>`` when ``ended``).
        ended: whether the decoder chose ``</s>``.
    """

    ids: list[int]
    score: float
    ended: bool


class BeamTooWide(ValueError):
    """A beam whose search would not fit in the memory at hand, even for one source."""


def beam_memory_bytes(beam: int, n_classes: int, source_len: int, hidden_size: int, max_len: int) -> int:
    """An upper estimate of the memory a beam search needs for one source, in bytes.

    Counts the per-step candidate tensors (``beam * beam`` scores, ids and orderings), a head's
    ``[beam, n_classes]`` scores (a full softmax's worst case), the encoder states repeated per beam
    and the hypotheses' words.

    Args:
        beam: hypotheses kept per source (after the cut to the vocabulary).
        n_classes: the head's vocabulary size.
        source_len: the longest source's length, in words.
        hidden_size: the model's ``d``.
        max_len: most words per hypothesis.
    """
    candidates = 120 * beam * beam  # scores, ids, orders and masks of beam * beam candidates (measured, rounded up)
    scores = 100 * beam * n_classes  # a head's [beam, N] scores and its search (measured: tree heads, rounded up)
    encoder = 4 * (3 * source_len + 4) * beam * hidden_size  # states, keys, attention, LSTM state per beam
    words = 16 * beam * max_len  # the hypotheses' words (two copies while they grow)
    return candidates + scores + encoder + words


def available_memory_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory free for new tensors on ``device``, in bytes; ``None`` where it cannot be told.

    CUDA: the driver's free memory. CPU: the kernel's ``MemAvailable`` (Linux), bounded by the
    process's cgroup limit where one is set.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as limit, open(usage_file, encoding="ascii") as usage:
                text = limit.read().strip()
                if text != "max" and int(text) < 1 << 60:
                    found.append(max(0, int(text) - int(usage.read().strip())))
            break
        except (OSError, ValueError):
            continue
    if not found and hasattr(os, "sysconf"):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            pass
    return min(found) if found else None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale // 4:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def plan_beam(beam: int, n_classes: int, source_len: int, hidden_size: int, max_len: int, batch: int = 1, *,
              allow_eos: bool = True, device: torch.device | str = "cpu", memory_limit: int | None = None) -> int:
    """How many sources a beam search decodes together within the memory at hand (at most ``batch``).

    Call it before a long decoding to refuse a beam that cannot fit before any work is done;
    :func:`beam_search` calls it on every batch.

    Args:
        beam: the beam asked for (cut to the vocabulary here).
        n_classes: the head's vocabulary size.
        source_len: the longest source's length, in words.
        hidden_size: the model's ``d``.
        max_len: most words per hypothesis.
        batch: sources to decode.
        allow_eos: whether ``</s>`` may be chosen (without it, one word fewer to choose from).
        device: where the search runs.
        memory_limit: bytes the search may use. Default: half the memory free on ``device``
            (no bound where that cannot be told).

    Raises:
        BeamTooWide: not even one source fits; the message names the widest beam that does.
    """
    k = max(1, min(beam, n_classes - (0 if allow_eos else 1)))
    if memory_limit is None:
        available = available_memory_bytes(device)
        if available is None:
            return batch
        memory_limit = available // 2  # leave room for the model, the allocator and other processes
    one = beam_memory_bytes(k, n_classes, source_len, hidden_size, max_len)
    if one <= memory_limit:
        return max(1, min(batch, memory_limit // one))
    low, high = 0, k  # the widest beam that fits: low fits (or is 0), high does not
    while high - low > 1:
        mid = (low + high) // 2
        if beam_memory_bytes(mid, n_classes, source_len, hidden_size, max_len) <= memory_limit:
            low = mid
        else:
            high = mid
    cut = f" (cut to the vocabulary's {k:,} words)" if k < beam else ""
    advice = f"the widest that fits is {low:,}" if low else "no beam fits"
    raise BeamTooWide(f"beam {beam:,}{cut} needs about {_size(one)} per source, more than the "
                      f"{_size(memory_limit)} this search may use; {advice}")


def _next_words(head: Head, hidden: Tensor, k: int, eos_id: int, allow_eos: bool) -> tuple[Tensor, Tensor]:
    """The ``k`` best next words per row, ``(log-probs, ids)`` each ``[R, k]``; without ``</s>`` if not allowed."""
    if allow_eos:
        return head.topk(hidden, k)
    values, ids = head.topk(hidden, min(k + 1, head.n_classes))
    values = values.masked_fill(ids == eos_id, float("-inf"))
    best = values.topk(k, dim=1).indices  # the top k that are not </s>, order kept
    return values.gather(1, best), ids.gather(1, best)


@torch.no_grad()
def beam_search(model: AttentionSeq2Seq, head: Head, source: Tensor, source_lengths: Tensor, *, bos_id: int,
                eos_id: int, beam: int = 5, max_len: int = 30, allow_eos: bool = True,
                memory_limit: int | None = None) -> list[Hypothesis]:
    """The best hypothesis for every source of a batch.

    A beam wider than the vocabulary is cut to it. The batch is decoded in pieces when the whole of
    it would not fit in ``memory_limit`` (:func:`beam_memory_bytes` per source); the results are
    the same.

    Args:
        model, head: the trained summariser (put in eval mode by the caller).
        source: ``[S, B]`` padded source ids; ``source_lengths``: ``[B]``.
        bos_id: the decoder's first input; eos_id: the end tag.
        beam: hypotheses kept per source. Default: 5 (the paper's).
        max_len: most words per hypothesis. Default: 30 (the paper's).
        allow_eos: ``False`` for the DUC setting: no end tag, exactly ``max_len`` words.
        memory_limit: bytes the search may use. Default: half the memory free on ``source``'s
            device (no bound where that cannot be told).

    Returns:
        one :class:`Hypothesis` per source, in order.

    Raises:
        BeamTooWide: not even one source fits in ``memory_limit``; the message names the widest
            beam that does.
    """
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam must be an integer >= 1, got {beam!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    k = min(beam, head.n_classes - (0 if allow_eos else 1))
    together = plan_beam(beam, head.n_classes, source.size(0), model.hidden_size, max_len, source.size(1),
                         allow_eos=allow_eos, device=source.device, memory_limit=memory_limit)
    if together < source.size(1):
        found: list[Hypothesis] = []
        for lo in range(0, source.size(1), together):
            lengths = source_lengths[lo: lo + together]
            piece = source[: int(lengths.max()), lo: lo + together]
            found += _beam_search(model, head, piece, lengths, bos_id, eos_id, k, max_len, allow_eos)
        return found
    return _beam_search(model, head, source, source_lengths, bos_id, eos_id, k, max_len, allow_eos)


def _beam_search(model: AttentionSeq2Seq, head: Head, source: Tensor, source_lengths: Tensor, bos_id: int,
                 eos_id: int, k: int, max_len: int, allow_eos: bool) -> list[Hypothesis]:
    """:func:`beam_search` of a batch that fits, with ``k`` already cut to the vocabulary."""
    batch, device = source.size(1), source.device
    encoded = model.encode(source, source_lengths).repeat(k)  # batch B -> B * k rows, beam-major per source
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: only the first one expands at step 0
    tokens = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    previous = torch.full((batch * k,), bos_id, dtype=torch.long, device=device)
    state = None
    ended: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_len):
        hidden, state = model.step(previous, encoded, state)  # [B*k, d]
        values, words = _next_words(head, hidden, k, eos_id, allow_eos)  # [B*k, k]
        candidates = (scores.reshape(-1, 1) + values).reshape(batch, k * k)
        order = candidates.argsort(dim=1, descending=True, stable=True)  # [B, k*k]
        cand_scores = candidates.gather(1, order)
        cand_words = words.reshape(batch, k * k).gather(1, order)
        cand_beams = order // k
        is_eos = (cand_words == eos_id) & torch.isfinite(cand_scores)
        _collect_ended(ended, done, is_eos[:, :k], cand_scores[:, :k], cand_beams[:, :k], tokens)
        # the k best candidates that go on: the first k that are not </s>
        rank = (~is_eos).cumsum(dim=1)
        keep = (~is_eos) & (rank <= k)
        pick = keep.float().argsort(dim=1, descending=True, stable=True)[:, :k]  # positions of the kept, in order
        beams = cand_beams.gather(1, pick)
        scores = cand_scores.gather(1, pick).masked_fill(done[:, None] | ~keep.gather(1, pick), float("-inf"))
        tokens = torch.cat([tokens.gather(1, beams[:, :, None].expand(-1, -1, tokens.size(2))),
                            cand_words.gather(1, pick)[:, :, None]], dim=2)
        rows = (beams + torch.arange(batch, device=device)[:, None] * k).reshape(-1)
        state = (state[0][:, rows], state[1][:, rows])
        previous = tokens[:, :, -1].reshape(-1)
        done |= _settled(ended, scores)
        if bool(done.all()):
            break
    return [_best(ended[b], tokens[b], scores[b]) for b in range(batch)]


def _collect_ended(ended: list[list[Hypothesis]], done: Tensor, is_eos: Tensor, scores: Tensor, beams: Tensor,
                   tokens: Tensor) -> None:
    """Move the hypotheses that chose ``</s>`` among a source's ``k`` best candidates to its ended list."""
    for b, j in is_eos.nonzero().tolist():
        if not bool(done[b]):
            ended[b].append(Hypothesis(tokens[b, int(beams[b, j])].tolist(), float(scores[b, j]), True))


def _settled(ended: list[list[Hypothesis]], scores: Tensor) -> Tensor:
    """Sources whose best ended hypothesis no open one can beat any more."""
    best_open = scores.max(dim=1).values.tolist()
    return torch.tensor([bool(e) and max(h.score for h in e) >= o for e, o in zip(ended, best_open)],
                        dtype=torch.bool, device=scores.device)


def _best(ended: list[Hypothesis], tokens: Tensor, scores: Tensor) -> Hypothesis:
    if ended:
        return max(ended, key=lambda h: h.score)
    j = int(scores.argmax())
    return Hypothesis(tokens[j].tolist(), float(scores[j]), False)


@torch.no_grad()
def greedy_decode(model: AttentionSeq2Seq, head: Head, source: Tensor, source_lengths: Tensor, *, bos_id: int,
                  eos_id: int, max_len: int = 30, allow_eos: bool = True) -> list[Hypothesis]:
    """The most probable word at every step (``head.predict``), until ``</s>`` or ``max_len`` words."""
    batch, device = source.size(1), source.device
    encoded = model.encode(source, source_lengths)
    previous = torch.full((batch,), bos_id, dtype=torch.long, device=device)
    state, out = None, [Hypothesis([], 0.0, False) for _ in range(batch)]
    open_rows = list(range(batch))
    for _ in range(max_len):
        hidden, state = model.step(previous, encoded, state)
        values, words = _next_words(head, hidden, 1, eos_id, allow_eos)
        for b in list(open_rows):
            word, value = int(words[b, 0]), float(values[b, 0])
            h = out[b]
            if word == eos_id:
                out[b] = Hypothesis(h.ids, h.score + value, True)
                open_rows.remove(b)
            else:
                out[b] = Hypothesis(h.ids + [word], h.score + value, False)
        if not open_rows:
            break
        previous = words[:, 0]
    return out
