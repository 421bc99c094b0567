"""word2vec's per-word loop compiled by Numba: one row at a time, in place, as ``word2vec.c`` does.

:class:`~sohsm.tasks.w2v.fast.HandStep` updates a few dozen rows at once in torch
operations, because each operation costs microseconds whatever its size. A compiled
loop has no such cost, so this path updates after every row, as word2vec and gensim
do (sequential SGD: no groups of rows, no row cap)::

    for each row r of the piece (CBOW: a centre; skip-gram: a (context word, centre) pair), in order:
        alpha = lr * max(1 - (steps_done + r / R) / total_steps, min_ratio)      the linearly falling rate
        h     = the mean of r's context vectors (skip-gram: its one context vector)
        e     = 0
        for each scored pair (n, y) of r (tree: the path's nodes; pmi: the centre, then k noise words):
            f  = u_n . h - offset;   g = alpha * (y - sigma(f))
            e += g * u_n;            u_n += g * h                                  word2vec's neu1e, syn1
        v_c += e for each context word c of r  (the exact mean's gradient: e / |context|)

The rows, their contexts and their scored pairs are those the torch path builds for the
piece (the same windows, sub-sampling and noise words, from the same generators), so a
run resumes exactly whichever path trained it. Numba is an optional dependency
(``pip install 'sohsm[w2v]'``), imported and compiled on first use (the compiled code
is cached on disk).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

#: what a user runs to get this path
INSTALL_HINT = "pip install 'sohsm[w2v]'"

_compiled: Any = None  # a Numba dispatcher once compiled (numba is untyped): called, and its .signatures read

#: LLVM's freedoms for the loop: reassociate sums (the dot products run in SIMD lanes, as BLAS's ``sdot`` that
#: gensim calls), fuse multiply-adds, ignore the sign of zero and divide by multiplying with a reciprocal; not
#: ``nnan``/``ninf`` (the loss's tail handles infinities). The order is fixed at compile time, so a run and its
#: resumption on one CPU agree exactly; another CPU (another vector width) may round the last bits differently.
#: 1.5x the speed of the loop compiled without them (text8, CBOW with the Huffman tree, docs/results/word2vec.md).
FASTMATH = frozenset({"reassoc", "contract", "nsz", "arcp"})


def numba_available() -> bool:
    """Whether Numba can be imported (the compiled path's only dependency)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _train_rows(syn0, syn1, inputs, offsets, counts, keys, nodes, labels, pair_start, pair_length, lr, done, total,
                floor, offset, divide, hidden, error):  # pragma: no cover - compiled
    """Train the rows in order, in place; returns the summed loss ``-log sigma(+-f)`` (float64).

    Row ``r``'s pairs are ``nodes[pair_start[k]: pair_start[k] + pair_length[k]]`` with ``k = keys[r]``.
    ``hidden``, ``error`` ``[d]`` are scratch arrays of the weights' dtype; the rate, ``1 / |context|``
    and ``g`` are cast to it, so the vector loops run in the weights' dtype.
    Compiled with :data:`FASTMATH`: the vector loops may be reordered and fused into SIMD
    multiply-adds, an order fixed when the loop is compiled (the same result on every run on one CPU).
    """
    rows = offsets.shape[0]
    dim = syn0.shape[1]
    loss = 0.0
    kept = 1.0  # the product of the pairs' probabilities not yet in loss (one log per many pairs)
    real = syn0.dtype.type  # float32 or float64: the weights' own
    zero = real(0.0)
    for r in range(rows):
        start, count = offsets[r], counts[r]
        alpha = real(lr * max(1.0 - (done + r / rows) / total, floor))
        for k in range(dim):
            hidden[k] = zero
            error[k] = zero
        for c in range(start, start + count):
            w = inputs[c]
            for k in range(dim):
                hidden[k] += syn0[w, k]
        inv = real(1.0 / count if count > 0 else 0.0)  # no context (no such row in a piece): h = 0, an empty mean
        if count > 1:
            for k in range(dim):
                hidden[k] *= inv
        key = keys[r]
        for p in range(pair_start[key], pair_start[key] + pair_length[key]):
            n = nodes[p]
            s = zero
            for k in range(dim):
                s += hidden[k] * syn1[n, k]
            f = s - offset
            y = labels[p]
            sigma = 1.0 / (1.0 + math.exp(-f))
            chance = sigma if y > 0.5 else 1.0 - sigma  # the probability of the pair's label
            if chance > 1e-30:
                kept *= chance
                if kept < 1e-200:
                    loss -= math.log(kept)
                    kept = 1.0
            else:  # far in the tail: -log sigma(x) directly, without overflow
                x = -f if y > 0.5 else f
                loss += max(x, 0.0) + math.log1p(math.exp(-abs(x)))
            g = real(alpha * (y - sigma))
            for k in range(dim):
                error[k] += g * syn1[n, k]
                syn1[n, k] += g * hidden[k]
        if divide:
            for k in range(dim):
                error[k] *= inv
        for c in range(start, start + count):
            w = inputs[c]
            for k in range(dim):
                syn0[w, k] += error[k]
    return loss - math.log(kept)


def compiled_train_rows() -> Callable:
    """The Numba-compiled :func:`_train_rows` (compiled on the first call, then cached on disk).

    Raises:
        ImportError: Numba is not installed (the message says how to install it).
    """
    global _compiled
    if _compiled is None:
        try:
            import numba
        except ImportError as error:
            raise ImportError(f"the compiled word2vec loop needs numba: {INSTALL_HINT}") from error
        _compiled = numba.njit(cache=True, nogil=True, fastmath=set(FASTMATH))(_train_rows)
    return _compiled


def train_rows(syn0: np.ndarray, syn1: np.ndarray, inputs: np.ndarray, offsets: np.ndarray, counts: np.ndarray,
               keys: np.ndarray, nodes: np.ndarray, labels: np.ndarray, pair_start: np.ndarray,
               pair_length: np.ndarray, lr: float, done: int, total: int, floor: float, offset: float,
               divide: bool) -> float:
    """Run word2vec's loop over a piece's rows with the compiled kernel, updating ``syn0`` and ``syn1`` in place.

    Args:
        syn0: the input vectors, updated in place (C-contiguous, float32 or float64).
        syn1: the output vectors (the tree's nodes or the words' output vectors), same dtype.
        inputs: the context words of all rows, row after row (int64).
        offsets: where each row's context starts in ``inputs``.
        counts: each row's number of context words (at least 1).
        keys: which pair list each row scores: row ``r``'s pairs are ``nodes[pair_start[keys[r]]:][:
            pair_length[keys[r]]]`` (a tree: the target word, indexing every word's path; negative sampling:
            ``r``, indexing the rows' own lists).
        nodes: the scored output rows, list after list (int64).
        labels: each pair's label, 1 or 0, in ``syn0``'s dtype.
        pair_start: where each list starts in ``nodes``.
        pair_length: each list's number of pairs.
        lr: the run's starting rate.
        done: pieces trained before this one.
        total: the run's pieces.
        floor: the rate's floor, a fraction of ``lr``.
        offset: subtracted from every score (the ``pmi`` head's shift, else 0).
        divide: the exact mean's gradient (each context word gets ``1 / |context|`` of the row's error).

    Shape:
        - syn0: ``[N, d]``, syn1: ``[M, d]``
        - inputs: ``[C]``; offsets, counts, keys: ``[R]``; pair_start, pair_length: ``[K]``; nodes, labels: ``[P]``

    Returns:
        the summed loss ``-log sigma(+-f)`` over every pair, each at the weights it was scored with (summed as
        the log of products of the pairs' probabilities, one logarithm per many pairs).
    """
    dim = syn0.shape[1]
    hidden = np.zeros(dim, dtype=syn0.dtype)
    error = np.zeros(dim, dtype=syn0.dtype)
    kernel = compiled_train_rows()
    return float(kernel(syn0, syn1, inputs, offsets, counts, keys, nodes, labels, pair_start, pair_length, float(lr),
                        int(done), int(total), float(floor), float(offset), bool(divide), hidden, error))


def _window_rows(kept, spans, window, cbow, inputs, counts, targets):  # pragma: no cover - compiled
    """:func:`sohsm.tasks.w2v.data.window_examples`'s rows, written into ``inputs``, ``counts``, ``targets``
    (each at least ``[n * 2 * window]`` long); returns ``(inputs used, rows)``."""
    n = kept.shape[0]
    used = 0
    rows = 0
    for i in range(n):
        span = spans[i]
        first = used
        for d in range(-window, window + 1):
            j = i + d
            if d != 0 and -span <= d <= span and 0 <= j < n:
                inputs[used] = kept[j]
                used += 1
                if not cbow:
                    targets[rows] = kept[i]
                    rows += 1
        if cbow and used > first:
            counts[rows] = used - first
            targets[rows] = kept[i]
            rows += 1
    return used, rows


_compiled_windows: Any = None  # (as _compiled)


def compilations() -> int:
    """How many machine-code versions of the loops above this process has compiled, or loaded from Numba's cache: a
    step that raises it spent its time compiling, which the training loop leaves out of the training time
    (:meth:`sohsm.train.task.Task.compilations`)."""
    return sum(len(loop.signatures) for loop in (_compiled, _compiled_windows) if loop is not None)


def window_rows(kept: np.ndarray, spans: np.ndarray, window: int, cbow: bool):
    """A piece's CBOW rows or skip-gram pairs by a compiled loop: ``(inputs, offsets, counts, targets)``,
    equal to :func:`sohsm.tasks.w2v.data.window_examples` (``offsets`` and ``counts`` ``None`` for skip-gram).

    Raises:
        ImportError: Numba is not installed.
    """
    global _compiled_windows
    if _compiled_windows is None:
        import numba

        _compiled_windows = numba.njit(cache=True, nogil=True)(_window_rows)
    kept = np.ascontiguousarray(kept, dtype=np.int64)
    spans = np.ascontiguousarray(spans, dtype=np.int64)
    size = kept.shape[0] * 2 * int(window)
    inputs, counts, targets = np.empty(size, np.int64), np.empty(kept.shape[0], np.int64), np.empty(size, np.int64)
    used, rows = _compiled_windows(kept, spans, int(window), bool(cbow), inputs, counts, targets)
    if not cbow:
        return inputs[:used], None, None, targets[:rows]
    counts = counts[:rows]
    offsets = np.zeros(rows, np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return inputs[:used], offsets, counts, targets[:rows]
