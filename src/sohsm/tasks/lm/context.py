"""Average context vectors of a trained language model, and the bootstrapped tree built from them."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor, nn

from sohsm.clustering import bootstrap_tree
from sohsm.data.batching import batchify, bptt_batches
from sohsm.tasks.lm.config import LMConfig
from sohsm.tasks.lm.task import check_vocabulary, load_lm_corpus
from sohsm.train.loading import LoadedRun, load_run


@torch.no_grad()
def average_context_vectors(model: nn.Module, ids: Tensor, n_words: int, batch_size: int = 32,
                            bptt: int = 20, max_tokens: int | None = None) -> tuple[Tensor, Tensor]:
    """The mean hidden state that predicted each word: ``([N, d] vectors, [N] counts)``.

    The stream is read as in :func:`sohsm.train.evaluate` (``batch_size`` columns,
    windows of ``bptt`` rows, state carried across windows), model in eval mode.
    A word never predicted gets the mean of all context vectors.

    Args:
        max_tokens: stop after about this many predicted tokens (``None``: all).
    """
    device = next(model.parameters()).device
    data = batchify(ids, batch_size, device)  # [T, B]
    was_training = model.training
    model.eval()
    sums: Tensor | None = None
    counts: Tensor | None = None
    seen = 0
    try:
        state = None
        for inputs, targets in bptt_batches(data, bptt):
            hidden, state = model(inputs, state)  # [t, B, d]
            hidden = hidden.reshape(-1, hidden.size(-1)).double()  # [t*B, d]
            targets = targets.reshape(-1)
            if sums is None or counts is None:  # (both are made at the first window)
                sums = hidden.new_zeros(n_words, hidden.size(1))
                counts = torch.zeros(n_words, dtype=torch.long, device=device)
            sums.index_add_(0, targets, hidden)
            counts += torch.bincount(targets, minlength=n_words)
            seen += targets.numel()
            if max_tokens is not None and seen >= max_tokens:
                break
    finally:
        model.train(was_training)
    if sums is None or counts is None:
        raise ValueError(f"cannot read {ids.numel()} tokens in {batch_size} columns")
    overall = sums.sum(0) / counts.sum()
    vectors = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], overall)
    return vectors.float().cpu(), counts.cpu()


class BootstrappedTree(NamedTuple):
    """A tree built from a run's context vectors.

    Attributes:
        children: ``[N - 1, 2]`` children table (:mod:`sohsm.clustering.trees`).
        counts: ``[N]`` how many contexts were averaged for each word.
        run: the run whose model made the context vectors.
    """

    children: Tensor
    counts: Tensor
    run: LoadedRun


def build_bootstrap_tree(run_dir: str | os.PathLike[str], variant: str = "balanced", *, checkpoint: str = "best",
                         seed: int = 0, max_tokens: int | None = None, data_dir: str | None = None,
                         cache_dir: str | None = None, device: str = "cpu") -> BootstrappedTree:
    """Mnih and Hinton's (2009) bootstrapped tree from a trained run (e.g. one with ``tree_random``).

    Averages, over the run's training split, the hidden state that predicted each
    word, then splits the words recursively with 2-component spherical Gaussian
    mixtures (:func:`sohsm.clustering.bootstrap_tree`).

    Raises:
        ValueError: no such run or checkpoint, a bad variant, or a corpus whose
            vocabulary differs from the run's.
        sohsm.data.DataError: the corpus is missing or corrupt.
    """
    run = load_run(run_dir, checkpoint, device, task="lm")
    assert isinstance(run.config, LMConfig)  # a language model's run
    corpus = load_lm_corpus(run.config, data_dir=data_dir, cache_dir=cache_dir, run_dir=run.run_dir)
    check_vocabulary(corpus, run.vocab, run.signature["corpus"], run.path)
    vectors, counts = average_context_vectors(run.model, corpus.train, len(run.vocab), run.config.eval_batch_size,
                                              run.config.bptt, max_tokens)
    children = bootstrap_tree(vectors, variant, torch.Generator().manual_seed(seed))
    return BootstrappedTree(children, counts, run)
