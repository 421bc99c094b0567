"""Using a trained summariser (loaded by :func:`sohsm.train.loading.load_run`): write headlines with beam search.

Decoding settings (the paper's §5.2):

* Gigaword: beam 5, at most 30 words, a headline ends at ``</s>``.
* DUC (``duc=True``): no end tag, exactly 30 words; the scorer cuts each
  headline to 75 bytes (:mod:`sohsm.rouge`), so decoding writes them whole.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sohsm.data.pairs import Pairs, bos_id, encode, make_batch
from sohsm.data.reverse import reverse_data
from sohsm.models.beam import Hypothesis, beam_search
from sohsm.models.seq2seq import AttentionSeq2Seq
from sohsm.tasks.s2s.config import S2SConfig
from sohsm.train.loading import LoadedRun


@dataclass
class Decoded:
    """Headlines of a set of inputs.

    Attributes:
        headlines: one per input, words joined by spaces.
        hypotheses: the beam search's results (ids, score, whether it ended).
        seconds: decoding time.
    """

    headlines: list[str]
    hypotheses: list[Hypothesis]
    seconds: float

    @property
    def sentences_per_s(self) -> float:
        return len(self.headlines) / self.seconds if self.seconds > 0 else float("inf")


def decode(run: LoadedRun, inputs: Pairs, *, beam: int = 5, max_len: int = 30, duc: bool = False,
           batch_size: int = 64, on_batch: Callable[[int], None] | None = None) -> Decoded:
    """Write a headline for every article of ``inputs`` with beam search on the head's exact top-k.

    Articles are decoded longest first (less padding), results returned in input order.

    Args:
        beam, max_len: the search's width and most words (the paper's 5 and 30).
        duc: the DUC setting: no end tag, exactly ``max_len`` words.
        batch_size: articles decoded together.
        on_batch: called with the number of articles after each batch (a progress bar).
    """
    vocab, device = run.vocab, next(run.model.parameters()).device
    assert isinstance(run.model, AttentionSeq2Seq) and vocab.eos_id is not None  # a summariser's run: titles end
    sources = encode(inputs.sources, vocab)
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    found: list[Hypothesis | None] = [None] * len(sources)
    start = time.perf_counter()
    for lo in range(0, len(order), batch_size):
        rows = order[lo: lo + batch_size]
        batch = make_batch([sources[i] for i in rows], None, vocab, device)
        results = beam_search(run.model, run.head, batch.source, batch.source_lengths, bos_id=bos_id(vocab),
                              eos_id=vocab.eos_id, beam=beam, max_len=max_len, allow_eos=not duc)
        for i, hypothesis in zip(rows, results):
            found[i] = hypothesis
        if on_batch is not None:
            on_batch(len(rows))
    seconds = time.perf_counter() - start
    hypotheses = [h for h in found if h is not None]
    return Decoded([" ".join(vocab.decode(h.ids)) for h in hypotheses], hypotheses, seconds)


def sequence_accuracy(run: LoadedRun, pairs: Pairs, batch_size: int = 256) -> float:
    """Share of ``pairs`` whose greedy decoding (beam 1, the head's exact top-1) equals the target exactly."""
    if not pairs.targets:
        raise ValueError("sequence accuracy needs pairs with targets")
    longest = max(len(t) for t in pairs.targets)
    out = decode(run, Pairs(pairs.sources, None), beam=1, max_len=longest + 1, batch_size=batch_size)
    return sum(h == " ".join(t) for h, t in zip(out.headlines, pairs.targets)) / len(pairs.targets)


def held_out_pairs(config: S2SConfig) -> Pairs:
    """The held-out pairs of a reverse-task run, generated again from its config.

    Raises:
        ValueError: the run is not on the reverse task.
    """
    d = config.data
    if d.dataset != "reverse":
        raise ValueError(f"held-out pairs are generated for the reverse task only; this run is on {d.dataset}")
    return reverse_data(d.symbols, d.train_pairs, d.valid_pairs, d.pairs_seed).valid
