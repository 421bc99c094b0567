"""word2vec's training written by hand: forward, gradient and sparse in-place update, no autograd.

The generic path (:class:`~sohsm.tasks.w2v.model.Word2Vec` -> any head -> autograd ->
:class:`~sohsm.tasks.w2v.model.LinearDecaySGD`) scores a whole step's rows at one point.
word2vec updates after every word. This path trains the two output layers word2vec
has, the binary trees (``tree_huffman``, ``tree_random``, ``tree_file``: hierarchical
softmax) and ``pmi`` (negative sampling), with word2vec's own update. Two loops do it:
:class:`CompiledStep`, word2vec's per-row loop compiled by Numba (:mod:`sohsm.tasks.w2v.kernel`:
one row at a time, as word2vec and gensim; taken where Numba imports), and :class:`HandStep`,
torch operations on a few rows at a time (below; no dependency beyond torch)::

    piece (one loop step, batch_words corpus words)  ->  rows r = 0 .. R-1 (CBOW: a centre; skip-gram: a pair)
    each row r: h_r (CBOW: the mean of its context vectors; skip-gram: its context word's vector)
                scored pairs (r, n, y): tree: the nodes n on the centre's path, y = 1 towards child 0
                                         pmi:  the centre (y = 1) and k noise words (y = 0)
    every update_rows rows, at the current weights (alpha: the rate, falling linearly within the run):
        f   = u_n . h_r                                  one score per pair
        g   = alpha * (y - sigma(f))                     word2vec's g
        e_r = sum over r's pairs of g * u_n              word2vec's neu1e
        u_n += g * h_r          (index_add_, in place)   the output rows of the pairs
        v_c += e_r              (index_add_, in place)   every context word of r (CBOW: undivided, cbow_mean=1)

``-log sigma(+-f)`` summed over the pairs is the head's own training loss (the tree's NLL;
the ``pmi`` head's negative-sampling objective), so the records read as the generic path's.
The indices of a whole piece (paths, noise words, context rows, row counts) are built at
once, vectorised, with a few host synchronisations per piece; an update is then a fixed
sequence of about fifteen tensor operations on views, with no sorting, coalescing, checks
or synchronisation.

Why groups of rows and not one word: each tensor operation costs microseconds of dispatch
whatever its size, so one word per update would run at a few thousand words a second.
The rows of one update are computed at the same weights and their updates summed, so a
row that many of them touch (the Huffman root is on every path; a word repeated in a
piece's contexts) would take all those updates at once and overshoot: with 64 rows an
update, training diverged on text8 within a few hundred pieces. ``row_cap`` bounds it:
a row touched ``c`` times in one update moves by ``min(1, row_cap / c)`` of its summed
update (the counts are exact, per update and row; an expected count from the word
frequencies is not enough, because words come in bursts). Measured on text8
(docs/results/word2vec.md): 64 rows an update with a cap of 32 keeps word2vec's quality,
where the generic path's pieces of a thousand words lost it.

Why not "hogwild" (many independent small updates at once): on one thread nothing runs
at once, and at 64 rows an update the time goes to moving the ``[pairs, d]`` gathered
vectors through memory, not to dispatch (a twice larger group was only ~13% faster over an epoch), so
independent updates would cost the same traffic.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads import Head, binary_pairs
from sohsm.tasks.w2v.data import W2VBatch
from sohsm.tasks.w2v.model import LinearDecaySGD, Word2Vec

#: ``torch.embedding_bag``'s modes (called directly: ``F.embedding_bag`` re-checks what this module makes valid)
_SUM, _MEAN = 0, 1


def trains_by_hand(head: Head) -> bool:
    """Whether :class:`HandStep` can train ``head``: one whose loss splits into logistic decisions
    (:attr:`~sohsm.heads.Head.binary_pairs`: a binary tree, or ``pmi`` with per-row noise and no bias)."""
    return head.binary_pairs is not None


class HandStep:
    """Train a piece (a :class:`~sohsm.tasks.w2v.data.W2VBatch`) with word2vec's per-row SGD, by hand.

    Args:
        model: the input vectors (CBOW or skip-gram).
        head: a binary-tree head or ``pmi`` with per-row noise (see :func:`trains_by_hand`).
        optimizer: the run's :class:`~sohsm.tasks.w2v.model.LinearDecaySGD`: its rate schedule and step
            count are used and advanced (one step per piece), so a checkpoint resumes the schedule exactly.
        update_rows: rows per in-place update (word2vec: 1).
        row_cap: a parameter row touched ``c`` times in one update moves by
            ``min(1, row_cap / c)`` of its summed update; ``None``: uncapped. Default: ``None``.

    Calling it with a batch trains on the batch's rows in order, ``update_rows`` at a
    time, and returns ``(loss_sum, rows)``: the summed training loss (float64 scalar) and
    the number of rows. The weights are the model's and the head's own, updated in place
    (no ``.grad``); the rate of update ``j`` of ``n`` in the piece is
    ``lr * max(1 - (steps_done + j / n) / total_steps, min_ratio)``, word2vec's linear decay.

    Shape:
        - batch: CBOW ``inputs [C]``, ``offsets [R]``, ``counts [R]``, ``targets [R]``;
          skip-gram ``inputs [R]``, ``targets [R]``
        - returns ``(loss_sum [], rows)``

    Example::

        >>> from sohsm.head_catalogue import WORD2VEC_HEAD
        >>> from sohsm.heads import build_head
        >>> model = Word2Vec(10, 4, "cbow")
        >>> head = build_head(WORD2VEC_HEAD, 4, 10, counts=torch.arange(10, 0, -1))
        >>> opt = LinearDecaySGD([*model.parameters(), *head.parameters()], lr=0.05, total_steps=10, rows=lambda: 1)
        >>> step = HandStep(model, head, opt, update_rows=2)
        >>> batch = W2VBatch(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 3]), torch.tensor([3, 2]),
        ...                  torch.tensor([0, 9]), 5)
        >>> loss_sum, rows = step(batch)
        >>> rows, opt.param_groups[0]["steps_done"]
        (2, 1)
    """

    def __init__(self, model: Word2Vec, head: Head, optimizer: LinearDecaySGD, update_rows: int,
                 row_cap: float | None = None) -> None:
        if not trains_by_hand(head):
            raise ValueError(f"head must be a binary tree or pmi with noise_per_row=True and no bias to be trained "
                             f"by hand, got {type(head).__name__}")
        if update_rows < 1:
            raise ValueError(f"update_rows must be >= 1, got {update_rows}")
        if row_cap is not None and not row_cap > 0:
            raise ValueError(f"row_cap must be positive or None, got {row_cap}")
        if model.embedding.weight.device.type != "cpu":
            raise ValueError(f"the hand-written step runs on the CPU, got vectors on {model.embedding.weight.device}")
        self.model, self.head, self.optimizer = model, head, optimizer
        self.update_rows = int(update_rows)
        self.cbow = model.architecture == "cbow"
        self.divide = self.cbow and model.exact_mean_gradient
        pairs = binary_pairs(head)
        assert pairs is not None  # trains_by_hand(head) holds
        self.pairs = pairs
        self.offset = self.pairs.offset  # the pmi head's shifted scores
        self.row_cap = row_cap
        self._counts = torch.zeros(0, dtype=model.embedding.weight.dtype)  # kept across pieces (all zeros)
        self._ones = torch.ones(0, dtype=model.embedding.weight.dtype)

    def _scale(self, update: Tensor, index: Tensor, size: int) -> Tensor | None:
        """``[n]`` ``min(1, row_cap / c)`` for each entry, ``c`` the entries of its update that touch its row."""
        if self.row_cap is None:
            return None
        key = update.mul(size).add_(index)  # [n]
        need = (int(update[-1]) + 1) * size if update.numel() else 0
        if self._counts.numel() < need:
            self._counts = torch.zeros(need, dtype=self._counts.dtype)
        if self._ones.numel() < key.numel():
            self._ones = torch.ones(key.numel(), dtype=self._counts.dtype)
        counts = self._counts.index_add_(0, key, self._ones[: key.numel()]).index_select(0, key)  # [n]
        self._counts.index_fill_(0, key, 0)  # all zero again for the next piece
        return counts.clamp_(min=self.row_cap).reciprocal_().mul_(self.row_cap)

    @torch.no_grad()
    def __call__(self, batch: W2VBatch) -> tuple[Tensor, int]:
        syn0, syn1 = self.model.embedding.weight, self.pairs.vectors
        rows, per = batch.targets.numel(), self.update_rows
        n_updates = -(-rows // per)
        group = self.optimizer.param_groups[0]
        start, done, total, floor = group["start_lr"], group["steps_done"], group["total_steps"], group["min_ratio"]
        # the whole piece's indices at once; then each update reads its slices (views made by one split each)
        update = torch.arange(rows) // per  # [R] the update of each row
        first = update * per  # [R] the first row of each row's update
        row = torch.arange(rows) - first  # [R] a row's place in its update
        nodes, labels, lengths = self.pairs(batch.targets)  # [P], [P], [R]
        pair_row = torch.repeat_interleave(row, lengths, output_size=nodes.numel())  # [P]
        pair_start = torch.cumsum(lengths, 0) - lengths  # [R]
        pair_sizes = _group_sums(lengths, per, n_updates)
        out_scale = self._scale(torch.repeat_interleave(update, lengths, output_size=nodes.numel()), nodes,
                                syn1.size(0))  # [P]
        pieces = {"node": nodes.split(pair_sizes), "label": labels.split(pair_sizes),
                  "pair_row": pair_row.split(pair_sizes), "pair_offset": (pair_start - pair_start[first]).split(per),
                  "out_scale": out_scale.split(pair_sizes) if out_scale is not None else [None] * n_updates}
        if self.cbow:
            inputs, counts, offsets = batch.inputs, batch.counts, batch.offsets
            assert counts is not None and offsets is not None  # a CBOW batch has them
            context_sizes = _group_sums(counts, per, n_updates)
            in_scale = self._scale(torch.repeat_interleave(update, counts, output_size=inputs.numel()), inputs,
                                   syn0.size(0))  # [C]
            if self.divide:  # the exact mean's gradient: 1 / |context| of the row's error to each context word
                divide = torch.repeat_interleave(1.0 / counts.to(syn0.dtype), counts, output_size=inputs.numel())
                in_scale = divide if in_scale is None else in_scale * divide
            pieces.update(context=inputs.split(context_sizes), offset=(offsets - offsets[first]).split(per),
                          context_row=torch.repeat_interleave(row, counts, output_size=inputs.numel())
                          .split(context_sizes))
        else:
            in_scale = self._scale(update, batch.inputs, syn0.size(0))  # [R]
            pieces.update(context=batch.inputs.split(per))
        pieces["in_scale"] = (in_scale.split(context_sizes if self.cbow else per) if in_scale is not None
                              else [None] * n_updates)
        scores = []
        for j in range(n_updates):
            alpha = start * max(1.0 - (done + j / n_updates) / total, floor)
            ctx, node, scale = pieces["context"][j], pieces["node"][j], pieces["in_scale"][j]
            if self.cbow:
                hidden = torch.embedding_bag(syn0, ctx, pieces["offset"][j], False, _MEAN)[0]  # [b, d]
            else:
                hidden = syn0.index_select(0, ctx)  # [b, d]
            h = hidden.index_select(0, pieces["pair_row"][j])  # [p, d]
            score = torch.linalg.vecdot(h, syn1.index_select(0, node))  # [p]
            if self.offset:
                score = score - self.offset
            scores.append(score)
            g = (pieces["label"][j] - torch.sigmoid(score)).mul_(alpha)  # [p]
            # [b, d] word2vec's neu1e: each row's sum of g * u over its pairs, before u moves
            error = torch.embedding_bag(syn1, node, pieces["pair_offset"][j], False, _SUM, False, g)[0]
            if pieces["out_scale"][j] is not None:
                g = g * pieces["out_scale"][j]
            syn1.index_add_(0, node, h.mul_(g.unsqueeze(1)))
            if self.cbow:
                error = error.index_select(0, pieces["context_row"][j])  # [c, d] the row's error to each context word
            if scale is not None:
                error.mul_(scale.unsqueeze(1))
            syn0.index_add_(0, ctx, error)
        group["steps_done"] = done + 1
        group["lr"] = start * max(1.0 - done / total, floor)
        # -log sigma(+-f) summed: the head's training loss (scores as they were before each update)
        loss = (F.binary_cross_entropy_with_logits(torch.cat(scores), labels, reduction="sum") if scores
                else syn0.new_zeros(()))
        return loss.to(torch.float64), rows


def _group_sums(values: Tensor, size: int, groups: int) -> list[int]:
    """Sums of ``values`` ``[n]`` over consecutive groups of ``size`` (the last may be shorter), as ints."""
    padded = values.new_zeros(groups * size)
    padded[: values.numel()] = values
    return padded.view(groups, size).sum(dim=1).tolist()


class CompiledStep:
    """Train a piece with word2vec's own loop, one row at a time, compiled by Numba (:mod:`~sohsm.tasks.w2v.kernel`).

    The same rows, scored pairs (tree paths; the head's noise words, from its generator)
    and rate schedule as :class:`HandStep`, updated after every row in place on the
    weights' memory (``tensor.numpy()``: CPU only), as ``word2vec.c`` and gensim do: no
    groups of rows, so no row cap. With ``update_rows=1`` :class:`HandStep` computes the
    same update (up to float rounding; a noise word drawn twice for one row moves between
    its two scores here, as in word2vec's loop).

    Args:
        model: the input vectors (CBOW or skip-gram), on the CPU.
        head: a binary-tree head or ``pmi`` with per-row noise (see :func:`trains_by_hand`).
        optimizer: the run's :class:`~sohsm.tasks.w2v.model.LinearDecaySGD`: its rate schedule and step
            count are used and advanced (one step per piece), so a checkpoint resumes the schedule exactly.

    Shape:
        - batch: CBOW ``inputs [C]``, ``offsets [R]``, ``counts [R]``, ``targets [R]``;
          skip-gram ``inputs [R]``, ``targets [R]``
        - returns ``(loss_sum [], rows)``

    Raises:
        ImportError: Numba is not installed (``pip install 'sohsm[w2v]'``).
    """

    def __init__(self, model: Word2Vec, head: Head, optimizer: LinearDecaySGD) -> None:
        from sohsm.tasks.w2v.kernel import compiled_train_rows

        if not trains_by_hand(head):
            raise ValueError(f"head must be a binary tree or pmi with noise_per_row=True and no bias to be trained "
                             f"by the compiled loop, got {type(head).__name__}")
        pairs = binary_pairs(head)
        assert pairs is not None  # trains_by_hand(head) holds
        self.pairs = pairs
        syn0, syn1 = model.embedding.weight, self.pairs.vectors
        for name, weight in (("model.embedding.weight", syn0), ("head.weight", syn1)):
            if weight.device.type != "cpu" or not weight.is_contiguous() or weight.dtype not in (torch.float32,
                                                                                                   torch.float64):
                raise ValueError(f"{name} must be a contiguous float32 or float64 CPU tensor for the compiled loop, "
                                 f"got {weight.dtype} on {weight.device}")
        if syn0.dtype != syn1.dtype:
            raise ValueError(f"the vectors and the head must share a dtype, got {syn0.dtype} and {syn1.dtype}")
        compiled_train_rows()  # Numba imported now (an ImportError before training starts); compiled on first call
        self.model, self.head, self.optimizer = model, head, optimizer
        self.cbow = model.architecture == "cbow"
        self.divide = self.cbow and model.exact_mean_gradient
        self.dtype = syn0.dtype
        #: a tree's paths as flat tables (nodes, labels, starts, lengths), each word's looked up by its id
        self.tree, self.offset = None, self.pairs.offset
        if self.pairs.by_word is not None:
            nodes, labels, start, length = self.pairs.by_word
            self.tree = (_long(nodes), labels.to(self.dtype).numpy(), _long(start), _long(length))

    @torch.no_grad()
    def __call__(self, batch: W2VBatch) -> tuple[Tensor, int]:
        from sohsm.tasks.w2v.kernel import train_rows

        rows = batch.targets.numel()
        group = self.optimizer.param_groups[0]
        done, total = group["steps_done"], group["total_steps"]
        if self.cbow:
            inputs, offsets, counts = batch.inputs, batch.offsets, batch.counts
            assert offsets is not None and counts is not None  # a CBOW batch has them
        else:
            inputs, offsets, counts = batch.inputs, torch.arange(rows), torch.ones(rows, dtype=torch.long)
        if self.tree is not None:  # every word's path, looked up by the row's target
            keys, nodes, labels, starts, lengths = batch.targets, *self.tree
        else:  # the rows' own pairs: the centre and its noise words, drawn as HandStep draws them
            keys = torch.arange(rows)
            pair_nodes, pair_labels, pair_lengths = self.pairs(batch.targets)
            starts = _long(torch.cumsum(pair_lengths, 0) - pair_lengths)
            nodes, labels, lengths = _long(pair_nodes), pair_labels.to(self.dtype).numpy(), _long(pair_lengths)
        loss = 0.0
        if rows:
            syn0, syn1 = self.model.embedding.weight, self.pairs.vectors
            for name, ids in (("batch.inputs", inputs), ("batch.targets", batch.targets)):
                if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < syn0.size(0):
                    raise ValueError(f"{name} must hold word ids in [0, {syn0.size(0)}), got "
                                     f"[{int(ids.min())}, {int(ids.max())}]")  # the compiled loop checks no index
            loss = train_rows(syn0.detach().numpy(), syn1.detach().numpy(), _long(inputs), _long(offsets),
                              _long(counts), _long(keys), nodes, labels, starts, lengths, group["start_lr"], done,
                              total, group["min_ratio"], self.offset, self.divide)
        group["steps_done"] = done + 1
        group["lr"] = group["start_lr"] * max(1.0 - done / total, group["min_ratio"])
        return torch.tensor(loss, dtype=torch.float64), rows


def _long(values: Tensor):
    """``values`` as a contiguous int64 numpy array (a view where it already is one)."""
    return values.to(torch.long).contiguous().numpy()
