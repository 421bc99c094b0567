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
"""
from __future__ import annotations

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
                eos_id: int, beam: int = 5, max_len: int = 30, allow_eos: bool = True) -> list[Hypothesis]:
    """The best hypothesis for every source of a batch.

    Args:
        model, head: the trained summariser (put in eval mode by the caller).
        source: ``[S, B]`` padded source ids; ``source_lengths``: ``[B]``.
        bos_id: the decoder's first input; eos_id: the end tag.
        beam: hypotheses kept per source. Default: 5 (the paper's).
        max_len: most words per hypothesis. Default: 30 (the paper's).
        allow_eos: ``False`` for the DUC setting: no end tag, exactly ``max_len`` words.

    Returns:
        one :class:`Hypothesis` per source, in order.
    """
    if beam < 1 or max_len < 1:
        raise ValueError(f"beam and max_len must be >= 1, got {beam} and {max_len}")
    batch, k, device = source.size(1), min(beam, head.n_classes - (0 if allow_eos else 1)), source.device
    encoded = model.encode(source, source_lengths).repeat(k)  # batch B -> B * k rows, beam-major per source
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: only the first one expands at step 0
    tokens = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    previous = torch.full((batch * k,), bos_id, dtype=torch.long, device=device)
    state = None
    ended: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for length in range(1, max_len + 1):
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
