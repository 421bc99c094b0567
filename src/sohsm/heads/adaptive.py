"""Adaptive softmax (Grave et al. 2017): torch's own module behind the head interface."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.base import Head, HeadMemory, HeadOutput, init_word_vectors
from sohsm.heads.registry import register_head
from sohsm.heads.tying import HeadEmbedding

#: torch's module, whose methods run on :class:`AdaptiveSoftmax`'s own ``head`` and ``tail``
_TORCH = nn.AdaptiveLogSoftmaxWithLoss
#: ``tail`` as it iterates, for the checker (torch's ModuleList does not say what it holds): each cluster's
#: ``nn.Sequential`` of its ``d -> d_i`` projection and its word vectors, two ``nn.Linear``
_Tails: TypeAlias = Iterable[Iterable[nn.Linear]]

#: the text8 setting (2k / 10k of 44k words), as fractions of the vocabulary
_TEXT8_CUTOFFS = (2000 / 44000, 10000 / 44000)


def default_cutoffs(n_classes: int) -> list[int]:
    """Cutoffs of the text8 setting (a 2k-word shortlist and a 10k-word boundary of 44k) scaled to ``N``.

    >>> default_cutoffs(44000)
    [2000, 10000]
    >>> default_cutoffs(10000)
    [455, 2273]
    """
    if int(n_classes) < 2:
        raise ValueError(f"n_classes must be at least 2, got {n_classes}")
    return sorted({min(max(1, round(n_classes * f)), n_classes - 1) for f in _TEXT8_CUTOFFS})


def check_cutoffs(cutoffs: Sequence[int] | None, n_classes: int) -> list[int]:
    """``cutoffs`` as a list of increasing integers in ``[1, N - 1]`` (``None``: :func:`default_cutoffs`)."""
    cutoffs = default_cutoffs(n_classes) if cutoffs is None else list(cutoffs)
    if (not cutoffs or any(isinstance(c, bool) or int(c) != c for c in cutoffs)
            or cutoffs != sorted(set(cutoffs)) or cutoffs[0] < 1 or cutoffs[-1] > n_classes - 1):
        raise ValueError(f"cutoffs must be increasing integers in [1, {n_classes - 1}], got {cutoffs}")
    return cutoffs


def frequency_ranks(counts: Tensor | None, n_classes: int) -> Tensor:
    """``[N]`` word ids by descending count (ties: lower id first); ``counts=None`` keeps id order."""
    if counts is None:
        return torch.arange(n_classes)
    counts = torch.as_tensor(counts).reshape(-1)
    if counts.numel() != n_classes:
        raise ValueError(f"counts must have shape [{n_classes}] (one per word), got {tuple(counts.shape)}")
    if bool((counts < 0).any()):
        raise ValueError(f"counts must be non-negative, got min {counts.min().item()}")
    return torch.sort(counts.to(torch.float64), descending=True, stable=True).indices


#: the most bytes of one copy of a static step's tail scores (``rows x sum n_i`` float32) for ``step_graph="auto"``
#: to capture adaptive softmax's step: a batch of 2,560 rows over WikiText-2's 33k words holds 0.3 GiB (captured),
#: over 256k words 2.3 GiB (eager); the static form's peak is a few such copies (docs/benchmarks/adaptive-static.md).
#: Where on a GPU the bytes start to cost more than the launches a graph saves has not been measured yet
STATIC_SCORE_BYTES = 2**30


class AdaptiveSoftmax(Head):
    """Adaptive softmax: :class:`torch.nn.AdaptiveLogSoftmaxWithLoss` as a head.

    The most frequent words form a shortlist scored with the clusters' entries
    in one head softmax; rarer words sit in tail clusters whose vectors are
    projected to ``d / div_value^i`` dimensions, so a batch pays the full ``d``
    only for frequent words. Exact: ``log_prob`` is normalised over all words.

    Paper: Grave, Joulin, Cissé, Grangier and Jégou (2017), "Efficient softmax
    approximation for GPUs", https://arxiv.org/abs/1609.04309.

    It is torch's module, laid out as torch lays it out: ``head``, ``tail``, ``cutoffs`` (ending with
    ``n_classes``), ``div_value``, ``head_bias``, ``shortlist_size``, ``n_clusters``, ``head_size``, and
    torch's state_dict keys (a checkpoint of torch's module loads into it, and its own into torch's module
    while its words are in id order). torch's module wants class ids sorted by frequency; with ``counts``
    this head ranks words by them and translates ids both ways (saving that order with the weights), so any
    vocabulary order works.

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        cutoffs: increasing frequency ranks in ``[1, N - 1]`` where clusters
            start, e.g. ``[2000, 10000]`` for 44k words: a 2000-word shortlist,
            then ranks 2000-9999 and 10000-43999 as two tail clusters. Default:
            :func:`default_cutoffs` (that text8 setting scaled to ``N``).
        div_value: the ``i``-th tail cluster projects to ``d // div_value**i``
            dimensions. Default: ``4.0``.
        head_bias: learn a bias in the head softmax. Default: ``False``.
        device, dtype: where and in what dtype the parameters are made, as torch's modules take them.
        counts: ``[N]`` training counts that rank the words (keyword only). Default: ``None``
            (word ids are taken to be frequency ranks, as sohsm's vocabularies are).

    Shape:
        - hidden: ``[B, d]`` (``[*, d]`` is flattened)
        - target: ``[B]`` word ids in ``[0, N)``
        - returns :class:`HeadOutput` with ``output`` ``[B]`` and scalar ``loss``

    Example::

        >>> head = AdaptiveSoftmax(16, 1000, cutoffs=[50, 300])
        >>> output, loss = head(torch.randn(4, 16), torch.tensor([0, 7, 120, 999]))
        >>> output.shape, loss.shape
        (torch.Size([4]), torch.Size([]))
        >>> bool(torch.allclose(head.log_prob(torch.randn(4, 16)).logsumexp(1), torch.zeros(4), atol=1e-5))
        True
    """

    skips_parameters = True  # a tail cluster no target falls in gets no gradient in that step

    # its buffers (register_buffer), declared for the checker
    word_of_rank: Tensor
    rank_of_word: Tensor
    tail_starts: Tensor

    #: torch's computation of the full log-distribution, run on this head's own ``head`` and ``tail``
    _get_full_log_prob = nn.AdaptiveLogSoftmaxWithLoss._get_full_log_prob

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        cutoffs: Sequence[int] | None = None,
        div_value: float = 4.0,
        head_bias: bool = False,
        device=None,
        dtype=None,
        *,
        counts: Tensor | None = None,
    ) -> None:
        super().__init__(in_features, n_classes)
        cutoffs = check_cutoffs(cutoffs, n_classes)
        if isinstance(div_value, bool) or not isinstance(div_value, (int, float)) or not float(div_value) > 0:
            raise ValueError(f"div_value must be a positive number, got {div_value!r}")
        smallest = int(in_features // (float(div_value) ** len(cutoffs)))
        if smallest < 1:
            raise ValueError(f"div_value={div_value} leaves tail cluster {len(cutoffs)} no dimension "
                             f"(in_features // div_value**{len(cutoffs)} = {smallest}); use a smaller div_value "
                             f"or fewer cutoffs")
        device = torch.get_default_device() if device is None else torch.device(device)
        # torch's module, built without drawing (reset_parameters draws); its parts become this head's own, under
        # torch's names, so that its state_dict, attributes and methods are those of AdaptiveLogSoftmaxWithLoss
        module = nn.AdaptiveLogSoftmaxWithLoss(in_features, n_classes, [int(c) for c in cutoffs],
                                               div_value=float(div_value), head_bias=bool(head_bias),
                                               device="meta", dtype=dtype).to_empty(device=device)
        #: torch's attributes: ``cutoffs`` ends with ``n_classes``; ``head`` scores the shortlist and one entry per
        #: tail cluster; ``tail[i]`` is cluster ``i``'s ``d -> d_i`` projection and its ``[n_i, d_i]`` word vectors
        self.cutoffs: list[int] = module.cutoffs
        self.div_value, self.head_bias = module.div_value, module.head_bias
        self.shortlist_size, self.n_clusters, self.head_size = (module.shortlist_size, module.n_clusters,
                                                                module.head_size)
        self.head, self.tail = module.head, module.tail
        self.reset_parameters()
        word_of_rank = frequency_ranks(counts, n_classes)
        rank_of_word = torch.empty_like(word_of_rank)
        rank_of_word[word_of_rank] = torch.arange(n_classes)
        self.register_buffer("word_of_rank", word_of_rank.to(device))
        self.register_buffer("rank_of_word", rank_of_word.to(device))
        self._save_word_order(not torch.equal(word_of_rank, torch.arange(n_classes)))
        self.register_load_state_dict_pre_hook(_before_load)
        self.register_load_state_dict_post_hook(_after_load)
        self._static = False  # see set_static
        #: where each tail cluster starts among the frequency ranks (a static step's buckets; not saved)
        self.register_buffer("tail_starts", torch.tensor(self.cutoffs[:-1], device=device), persistent=False)
        #: each tail cluster's share of the training tokens (by ``counts``; without them, of the words): the rows an
        #: ordinary step scores against it (:meth:`static_overhead`)
        edges = self.cutoffs
        weights = (torch.ones(n_classes, dtype=torch.float64) if counts is None
                   else torch.as_tensor(counts, dtype=torch.float64)[word_of_rank].clamp_min(0))
        total = float(weights.sum()) or 1.0
        self.tail_shares = [float(weights[low:high].sum()) / total for low, high in zip(edges[:-1], edges[1:])]

    def _save_word_order(self, reordered: bool) -> None:
        """The word order (``word_of_rank``, ``rank_of_word``) is saved only where ``counts`` reordered the words:
        in id order the state_dict holds torch's module's keys alone, and loads into it and back."""
        for name in ("word_of_rank", "rank_of_word"):
            if reordered:
                self._non_persistent_buffers_set.discard(name)
            else:
                self._non_persistent_buffers_set.add(name)

    def reset_parameters(self) -> None:
        """Word vectors (the head softmax's rows, each tail's ``[n_i, d_i]`` vectors) by :func:`init_word_vectors`,
        the tails' ``d -> d_i`` projections as ``nn.Linear``; in the order, and so with the values, of torch's
        own initialisation (a head bias starts at zero)."""
        init_word_vectors(self.head.weight, self.head.bias)
        for projection, vectors in cast(_Tails, self.tail):
            projection.reset_parameters()
            init_word_vectors(vectors.weight)

    def _run(self, method, hidden: Tensor, *args):
        """``method(self, hidden, *args)`` (torch's module's, on this head's parts) outside ``torch.autocast``, in the
        weights' dtype.

        torch's module mixes the dtypes autocast gives its products and fails (``index_copy_``
        of bf16 into float32); the head is cheap enough to score in the weights' precision.
        """
        if not torch.is_autocast_enabled(hidden.device.type):
            return method(self, hidden, *args)
        with torch.autocast(hidden.device.type, enabled=False):
            return method(self, hidden.to(self.head.weight.dtype), *args)

    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        if self._static and self.training:
            output = self._run(AdaptiveSoftmax._static_output, hidden, self.rank_of_word[target])
            return HeadOutput(output, -output.mean())
        output, loss = self._run(_TORCH.forward, hidden, self.rank_of_word[target])
        return HeadOutput(output, loss)

    # -- a static step (a captured CUDA graph) ----------------------------------------
    def set_static(self, static: bool) -> None:
        """In a static step every tail cluster scores every row and keeps the rows whose target it holds: no shape
        depends on the batch, nothing is read back (torch's module picks each cluster's rows with ``nonzero``).
        The same log-probabilities; more arithmetic and a ``[B, n_i]`` buffer per tail, which a GPU's step,
        bound by the ops it issues, does not notice."""
        self._static = bool(static)

    def graph_refusal(self, device: torch.device, compute: torch.dtype | None = None) -> str | None:
        """``None``: a static step (:meth:`set_static`) reads nothing back."""
        return None

    @classmethod
    def memory_estimate(cls, in_features: int, n_classes: int, options: dict, rows: int) -> HeadMemory:
        """Its word vectors (the base's bound), and captured as a CUDA graph its static form's tail scores: three
        ``[rows, sum n_i]`` float32 copies (scores, log-softmax, gradient) where ``auto`` captures it."""
        cutoffs = check_cutoffs(options.get("cutoffs"), n_classes)
        one_copy = rows * (n_classes - cutoffs[0]) * 4
        memory = super().memory_estimate(in_features, n_classes, options, rows)
        return memory._replace(graph_bytes=3 * one_copy if one_copy <= STATIC_SCORE_BYTES else 0)

    def static_overhead(self) -> float:
        """Scores a static step computes over those of an ordinary one, per row: every row against the head softmax
        and every tail (``h + sum n_i``), where torch's module scores a tail's rows only (``h + sum p_i n_i``, ``p_i``
        the tail's share of the tokens). About 7 over WikiText-2's 33k words with the stock cutoffs, 10 at 256k:
        the static form holds that many times the bytes of the ordinary step's scores (a ``[B, n_i]`` float32 buffer
        per tail and its gradient; docs/benchmarks/adaptive-static.md measures the peaks)."""
        head = self.shortlist_size + self.n_clusters
        sizes = [high - low for low, high in zip(self.cutoffs[:-1], self.cutoffs[1:])]
        return (head + sum(sizes)) / (head + sum(p * n for p, n in zip(self.tail_shares, sizes)))

    def static_decline(self, rows: int | None = None) -> str | None:
        """Why ``step_graph="auto"`` keeps this head's step eager: a static step over ``rows`` rows would hold a
        ``[rows, n_i]`` float32 score buffer per tail, more than :data:`STATIC_SCORE_BYTES` in all (``"on"``
        captures it anyway). ``rows`` unknown: ``None``."""
        if rows is None:
            return None
        tails = self.cutoffs[-1] - self.cutoffs[0]
        nbytes = rows * tails * 4
        if nbytes <= STATIC_SCORE_BYTES:
            return None
        return (f"adaptive softmax's static step would score all {rows:,} rows against every tail, "
                f"{nbytes / 2**30:.1f} GiB a copy ({self.static_overhead():.1f}x the scores of its ordinary step; "
                f"auto captures up to {STATIC_SCORE_BYTES / 2**30:g} GiB, --step-graph on captures it anyway)")

    def _static_output(self, hidden: Tensor, ranks: Tensor) -> Tensor:
        """``log P(target | h)`` per row with static shapes: every row scored by the head softmax and every tail."""
        cutoffs = self.cutoffs
        cluster = torch.bucketize(ranks, self.tail_starts, right=True)  # 0: the shortlist, i + 1: tail cluster i
        in_head = torch.where(cluster == 0, ranks, self.shortlist_size + cluster - 1)
        output = F.log_softmax(self.head(hidden), dim=1).gather(1, in_head[:, None]).squeeze(1)
        for i, (projection, words) in enumerate(cast(_Tails, self.tail)):
            low, high = cutoffs[i], cutoffs[i + 1]
            local = (ranks - low).clamp(0, high - low - 1)
            tail = F.log_softmax(words(projection(hidden)), dim=1).gather(1, local[:, None]).squeeze(1)
            output = output + torch.where(cluster == i + 1, tail, torch.zeros_like(tail))
        return output

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` log-probabilities in word-id order (every tail cluster is scored)."""
        return self._run(_TORCH.log_prob, self._flatten_hidden(hidden))[:, self.rank_of_word]

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``."""
        k = self._check_k(k)
        values, ranks = self._run(_TORCH.log_prob, self._flatten_hidden(hidden)).topk(k, dim=1)
        return values, self.word_of_rank[ranks]

    def predict(self, hidden: Tensor) -> Tensor:
        """Same as ``log_prob(hidden).argmax(1)``; rows whose best head entry is a shortlist word skip the tails."""
        return self.word_of_rank[self._run(_TORCH.predict, self._flatten_hidden(hidden))]

    # -- weight tying: adaptive input ------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        """``[*] -> [*, d]``: adaptive input (Baevski & Auli 2019), read from this head's own parameters.

        A shortlist word's vector is its row of the head softmax's weight (``head.weight``, ``[d]``). A word
        ranked ``r`` in tail cluster ``i`` (``cutoffs[i] <= r < cutoffs[i+1]``) has its ``d_i``-entry output vector
        ``v = tail[i][1].weight[r - cutoffs[i]]``, read back up to ``d`` through the transpose of the
        cluster's ``d -> d_i`` projection ``P = tail[i][0].weight`` (``[d_i, d]``): ``v @ P``. The projection is
        shared by input and output as Baevski & Auli share theirs; the shortlist has none (its vectors have ``d``
        entries already). Every band is computed for every id and the right one kept, so no shape depends on
        the ids (no host sync); the gradient reaches only the rows read.

        Paper: Baevski and Auli (2019), "Adaptive input representations for neural language modeling",
        https://arxiv.org/abs/1809.10853.
        """
        ranks = self.rank_of_word[ids].reshape(-1)  # [M]
        vectors = F.embedding(ranks.clamp(max=self.shortlist_size - 1), self.head.weight)  # [M, d]
        for i, (projection, words) in enumerate(cast(_Tails, self.tail)):
            low, high = self.cutoffs[i], self.cutoffs[i + 1]
            in_cluster = ((ranks >= low) & (ranks < high)).unsqueeze(1)  # [M, 1]
            tail = F.embedding((ranks - low).clamp(0, high - low - 1), words.weight) @ projection.weight  # [M, d]
            vectors = torch.where(in_cluster, tail, vectors)
        return vectors.reshape(*ids.shape, self.in_features)

    def embedding_matrix(self) -> Tensor:
        """``[N, d]``: :meth:`embed` of every word, in word-id order (a differentiable function of the parameters)."""
        return self.embed(torch.arange(self.n_classes, device=self.rank_of_word.device))

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        """``None``: tied through adaptive input whatever ``cutoffs`` and ``div_value`` (a head bias stays the
        head's)."""
        return None

    def tied_embedding(self) -> HeadEmbedding:
        """Adaptive input (:meth:`embed`): the embedding reads the shortlist rows and the tails' vectors and
        projections."""
        return HeadEmbedding(self)

    def tied_vectors(self) -> list[Tensor]:
        """The shortlist's rows of the head softmax and every tail's word vectors (their projections keep theirs)."""
        return [self.head.weight[: self.shortlist_size], *(words.weight for _, words in cast(_Tails, self.tail))]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, n_classes={self.n_classes}, cutoffs={self.cutoffs[:-1]}, "
                f"div_value={self.div_value}, head_bias={self.head_bias}")


def _before_load(module: AdaptiveSoftmax, state_dict: dict, prefix: str, *args) -> None:
    """A checkpoint saved while torch's module sat under ``asm`` loads under torch's names; one with a word order
    loads it (the buffers saved for the load); one without (torch's module's, or one in id order) keeps the head's."""
    for key in [k for k in state_dict if k.startswith(prefix + "asm.")]:
        state_dict[prefix + key[len(prefix) + 4:]] = state_dict.pop(key)
    saved = prefix + "rank_of_word" in state_dict
    if saved:
        module._save_word_order(True)
    elif "rank_of_word" not in module._non_persistent_buffers_set:
        state_dict[prefix + "word_of_rank"] = module.word_of_rank
        state_dict[prefix + "rank_of_word"] = module.rank_of_word


def _after_load(module: AdaptiveSoftmax, incompatible_keys) -> None:
    """Save the word order from now on only if the head's words are reordered
    (:meth:`AdaptiveSoftmax._save_word_order`)."""
    ranks = module.rank_of_word
    if ranks.device.type != "meta":
        module._save_word_order(not torch.equal(ranks.cpu(), torch.arange(module.n_classes)))


@register_head("adaptive")
def _adaptive(in_features: int, n_classes: int, counts=None, cutoffs: Sequence[int] | None = None,
              div_value: float = 4.0, head_bias: bool = False) -> AdaptiveSoftmax:
    return AdaptiveSoftmax(in_features, n_classes, cutoffs=cutoffs, div_value=div_value, head_bias=head_bias,
                           counts=counts)
