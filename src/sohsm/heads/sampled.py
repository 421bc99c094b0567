"""Sampled training objectives, exact at evaluation: importance sampling, NCE and PMI-LM.

Each head keeps one output vector per word (and, for NCE, a bias). Training
scores the target and ``k`` noise words drawn from the unigram distribution,
shared by the whole batch, so a step costs ``O(B k d)`` instead of ``O(B N d)``;
evaluation scores every word and normalises, so perplexities compare with every
other head. The noise words come from a :class:`torch.Generator` that the head
owns and saves in its state dict, so a resumed run draws the same samples.

    objective            training score of word w for hidden h          test-time log P(w | h)
    importance_sampling  s_w - log q(w), softmax over target + samples   log_softmax(h.u + b)_w
    nce                  sigma(s_w - log(k q(w))), Z_c = 1, b = log q    log_softmax(h.u + b)_w
    negative_sampling    sigma(h.u_w - log k)                            log_softmax(h.u + log q)_w

with ``s_w = h . u_w + b_w`` and ``q`` the noise distribution.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.base import Head, HeadOutput, init_word_vectors, upcast
from sohsm.heads.registry import register_head
from sohsm.lazy import outside_compile


def noise_distribution(counts: Tensor | None, n_classes: int, power: float = 1.0) -> Tensor:
    """``[N]`` float64 noise probabilities ``q(w) ∝ max(count_w, 1) ** power``; uniform without counts.

    A word never seen in training counts as seen once, so every word can be drawn
    and has a finite ``log q``.

    >>> noise_distribution(torch.tensor([3, 1, 0]), 3).tolist()
    [0.6, 0.2, 0.2]
    """
    if counts is None:
        return torch.full((n_classes,), 1.0 / n_classes, dtype=torch.float64)
    counts = torch.as_tensor(counts).reshape(-1)
    if counts.numel() != n_classes:
        raise ValueError(f"counts must have shape [{n_classes}] (one per word), got {tuple(counts.shape)}")
    if bool((counts < 0).any()):
        raise ValueError(f"counts must be non-negative, got min {counts.min().item()}")
    weights = counts.to(torch.float64).clamp(min=1.0) ** float(power)
    return weights / weights.sum()


class SampledSoftmax(Head):
    """Base of the heads trained on ``k`` noise samples; exact log-probabilities at evaluation.

    In training mode ``forward`` returns the objective's per-row term as
    ``output`` and ``-output.mean()`` as ``loss`` (see :attr:`objective`); in eval
    mode it returns the exact ``log P(target | hidden)`` and the NLL, like every
    head. Subclasses define :meth:`sampled_output` and :meth:`logits`.

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.
        counts: ``[N]`` training counts for the noise distribution. Default:
            ``None`` (uniform noise).
        n_samples: noise words ``k`` per batch, shared by all its rows.
        noise_power: ``q(w) ∝ count_w ** noise_power`` (1 = unigram, word2vec uses 0.75).
        bias: learn a bias per word.
        seed: seed of the head's noise generator.
        sparse: give the word vectors a row-sparse gradient (the batch's targets
            and noise words only) as :class:`torch.nn.Embedding` does; it needs an
            optimizer that takes sparse gradients (``SGD``, ``Adagrad``, ``SparseAdam``).
        noise_per_row: draw ``k`` noise words for every row (word2vec's negative
            sampling) instead of ``k`` shared by the whole batch. Default: ``False``.
    """

    noise_log_probs: Tensor  # a buffer (register_buffer), declared for the checker

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        *,
        counts: Tensor | None = None,
        n_samples: int = 100,
        noise_power: float = 1.0,
        bias: bool = False,
        seed: int = 0,
        sparse: bool = False,
        noise_per_row: bool = False,
    ) -> None:
        super().__init__(in_features, n_classes)
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        if not math.isfinite(float(noise_power)) or float(noise_power) < 0:
            raise ValueError(f"noise_power must be a non-negative number, got {noise_power}")
        self.n_samples = n_samples
        self.noise_power = float(noise_power)
        self.sparse = bool(sparse)
        self.noise_per_row = bool(noise_per_row)
        self.weight = nn.Parameter(torch.empty(n_classes, in_features))
        self.bias = nn.Parameter(torch.zeros(n_classes)) if bias else None
        noise = noise_distribution(counts, n_classes, noise_power)
        #: log q(w) of the noise distribution (float64, so sampling does not depend on the head's dtype)
        self.register_buffer("noise_log_probs", noise.log())
        self._cdf: Tensor | None = None
        self.generator = torch.Generator().manual_seed(int(seed))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_word_vectors(self.weight, self.bias)

    # -- the noise ----------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())

    def _apply(self, fn, recurse=True):
        self._cdf = None  # the noise buffer may have changed dtype or device
        return super()._apply(fn, recurse)

    @outside_compile  # drawn on the host from the head's own generator; torch.compile cannot trace it
    def noise_samples(self, n: int | None = None) -> Tensor:
        """Draw ``n`` (default :attr:`n_samples`) word ids from the noise distribution, with replacement.

        Uniform numbers come from :attr:`generator` on the CPU and are looked up
        in the cumulative distribution, so the samples do not depend on the device.
        """
        if self._cdf is None:
            cdf = self.noise_log_probs.detach().double().cpu().exp().cumsum(0)
            self._cdf = cdf / cdf[-1]
        n = self.n_samples if n is None else n
        uniform = torch.rand(n, generator=self.generator, dtype=torch.float64)
        ids = torch.searchsorted(self._cdf, uniform, right=True).clamp_(max=self.n_classes - 1)
        return ids.to(self.weight.device)

    # -- scores -------------------------------------------------------------------
    def _scores(self, hidden: Tensor, target: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """``(s_target [B], s_noise [B, k])`` with ``s_w = h . u_w + b_w``, gathering only those rows.

        ``noise`` is ``[k]`` (shared by the batch) or ``[B, k]`` (drawn per row)."""
        target_vectors = F.embedding(target, self.weight, sparse=self.sparse)  # [B, d]
        noise_vectors = F.embedding(noise, self.weight, sparse=self.sparse)  # [k, d] or [B, k, d]
        s_target = upcast((hidden * target_vectors).sum(dim=1))  # [B]
        if noise.dim() == 1:
            s_noise = upcast(hidden @ noise_vectors.t())  # [B, k]
        else:
            s_noise = upcast(torch.bmm(noise_vectors, hidden.unsqueeze(2)).squeeze(2))  # [B, k]
        if self.bias is not None:
            s_target = s_target + self.bias[target]
            s_noise = s_noise + self.bias[noise]
        return s_target, s_noise

    def logits(self, hidden: Tensor) -> Tensor:
        """``[B, N]`` unnormalised test-time log-scores; ``log_prob`` is their log-softmax."""
        return upcast(F.linear(hidden, self.weight, self.bias))

    def sampled_output(self, hidden: Tensor, target: Tensor, noise: Tensor) -> Tensor:  # pragma: no cover
        """The objective's per-row term for checked ``hidden`` ``[B, d]``, ``target`` ``[B]`` and ``noise``
        ``[k]`` (or ``[B, k]`` with ``noise_per_row``)."""
        raise NotImplementedError

    # -- the interface ------------------------------------------------------------
    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:
        hidden, target = self._check_inputs(hidden, target)
        if self.training:
            if self.noise_per_row:
                noise = self.noise_samples(target.numel() * self.n_samples).view(target.numel(), self.n_samples)
            else:
                noise = self.noise_samples()
            output = self.sampled_output(hidden, target, noise)
        else:
            output = -F.cross_entropy(self.logits(hidden), target, reduction="none")
        return HeadOutput(output, -output.mean())

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Exact ``[B, N]`` test-time log-probabilities: every word is scored and the scores normalised."""
        return F.log_softmax(self.logits(self._flatten_hidden(hidden)), dim=1)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Same as ``log_prob(hidden).topk(k)``; the normaliser is computed once, after the top-k."""
        k = self._check_k(k)
        logits = self.logits(self._flatten_hidden(hidden))
        values, indices = logits.topk(k, dim=1)
        return values - logits.logsumexp(dim=1, keepdim=True), indices

    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        return ("a sampled head's word vectors are trained by its sampled objective (only the sampled words' rows "
                "move, a row-sparse update with sparse=true); tying them is not supported")

    def predict(self, hidden: Tensor) -> Tensor:
        """Same as ``log_prob(hidden).argmax(1)``, without normalising."""
        return self.logits(self._flatten_hidden(hidden)).argmax(dim=1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, n_classes={self.n_classes}, objective={self.objective}, "
                f"n_samples={self.n_samples}, noise_power={self.noise_power}, bias={self.bias is not None}, "
                f"sparse={self.sparse}, noise_per_row={self.noise_per_row}")


class ImportanceSamplingSoftmax(SampledSoftmax):
    """Softmax trained by importance sampling; exact softmax at evaluation.

    The normaliser is estimated from ``k`` words drawn from the noise
    distribution ``q``, each score corrected by ``-log q(w)``: the training
    output of a row is the estimate
    ``s~_t - logsumexp(s~_t, s~_u1, ..., s~_uk)`` of ``log P(t | h)``, with
    ``s~_w = h . u_w + b_w - log q(w)``. Noise words equal to the row's target
    are left out of its sum (``remove_accidental_hits``).

    Papers: Bengio and Senécal (2008), "Adaptive importance sampling to
    accelerate training of a neural probabilistic language model"; the form
    with the target in the normaliser is Jean et al. (2015),
    https://arxiv.org/abs/1412.2007, as in Jozefowicz et al. (2016).

    Args:
        remove_accidental_hits: drop noise words equal to the target. Default: ``True``.
        others: see :class:`SampledSoftmax` (``bias`` defaults to ``False`` here,
            as in :class:`~sohsm.heads.FullSoftmax`).

    Example::

        >>> head = ImportanceSamplingSoftmax(8, 50, counts=torch.arange(50, 0, -1), n_samples=10)
        >>> head.objective, head.loss_is_nll
        ('importance_sampling', False)
        >>> output, loss = head(torch.randn(4, 8), torch.tensor([0, 1, 2, 49]))  # the sampled estimate
        >>> _ = head.eval()
        >>> head.loss_is_nll  # exact log P(target | hidden) and NLL in eval mode
        True
    """

    objective = "importance_sampling"

    def __init__(self, in_features: int, n_classes: int, *, counts: Tensor | None = None, n_samples: int = 100,
                 noise_power: float = 1.0, bias: bool = False, remove_accidental_hits: bool = True, seed: int = 0,
                 sparse: bool = False, noise_per_row: bool = False) -> None:
        super().__init__(in_features, n_classes, counts=counts, n_samples=n_samples, noise_power=noise_power,
                         bias=bias, seed=seed, sparse=sparse, noise_per_row=noise_per_row)
        self.remove_accidental_hits = bool(remove_accidental_hits)

    def sampled_output(self, hidden: Tensor, target: Tensor, noise: Tensor) -> Tensor:
        s_target, s_noise = self._scores(hidden, target, noise)
        log_q = self.noise_log_probs.to(s_target.dtype)
        s_target = s_target - log_q[target]  # [B]
        s_noise = s_noise - log_q[noise]  # [B, k]
        if self.remove_accidental_hits:
            hits = (noise[None, :] if noise.dim() == 1 else noise) == target[:, None]  # [B, k]
            s_noise = s_noise.masked_fill(hits, float("-inf"))
        return s_target - torch.cat([s_target[:, None], s_noise], dim=1).logsumexp(dim=1)


class NCESoftmax(SampledSoftmax):
    """Softmax trained by noise-contrastive estimation; exact softmax at evaluation.

    Each (target, hidden) pair is told apart from ``k`` noise words by a logistic
    classifier on ``Δ_w = h . u_w + b_w - log Z_c - log(k q(w))`` with ``Z_c = 1``;
    the training output of a row is ``log σ(Δ_t) + Σ_j log σ(-Δ_uj)``. The bias
    starts at ``log q(w)`` so that ``exp(s_w)`` starts near the normalised unigram
    distribution (the papers' ``-log N``, a uniform start, is ``bias_init="uniform"``).
    At evaluation ``P(w | h) = softmax(h . u + b)_w``, normalised exactly.

    Papers: Gutmann and Hyvärinen (2012); Mnih and Teh (2012),
    https://arxiv.org/abs/1206.6426; the ``Z_c = 1`` and bias heuristics of Vaswani
    et al. (2013) and Zoph et al. (2016), as described by Melamud et al. (2017) §2,
    https://arxiv.org/abs/1708.01276.

    Why not ``-log N``: a rare word is drawn as noise only about ``k q(w)`` times
    per position, so in a short training it keeps much of its starting score, and
    a uniform start gives the rare words far more than their share
    (docs/results/lm.md measures both; the default was chosen by them).

    Args:
        bias_init: ``"unigram"`` (``log q(w)``) or ``"uniform"`` (``-log N``, the
            heuristic of Vaswani et al. and Zoph et al. the PMI paper follows).
            Default: ``"unigram"``.
        others: see :class:`SampledSoftmax`; the bias is always learned.

    Example::

        >>> head = NCESoftmax(8, 50, counts=torch.arange(50, 0, -1), n_samples=10)
        >>> bool(torch.allclose(head.bias.detach().double(), head.noise_log_probs))  # log q(w)
        True
        >>> paper = NCESoftmax(8, 50, n_samples=10, bias_init="uniform")
        >>> bool(torch.allclose(paper.bias.detach(), torch.full((50,), -math.log(50))))
        True
    """

    objective = "nce"

    def __init__(self, in_features: int, n_classes: int, *, counts: Tensor | None = None, n_samples: int = 100,
                 noise_power: float = 1.0, seed: int = 0, sparse: bool = False, bias_init: str = "unigram",
                 noise_per_row: bool = False) -> None:
        if bias_init not in ("uniform", "unigram"):
            raise ValueError(f"bias_init must be 'uniform' or 'unigram', got {bias_init!r}")
        self.bias_init = bias_init
        super().__init__(in_features, n_classes, counts=counts, n_samples=n_samples, noise_power=noise_power,
                         bias=True, seed=seed, sparse=sparse, noise_per_row=noise_per_row)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            assert self.bias is not None  # NCE's scores have one
            if self.bias_init == "unigram":
                self.bias.copy_(self.noise_log_probs)
            else:
                self.bias.fill_(-math.log(self.n_classes))

    def sampled_output(self, hidden: Tensor, target: Tensor, noise: Tensor) -> Tensor:
        s_target, s_noise = self._scores(hidden, target, noise)
        log_kq = self.noise_log_probs.to(s_target.dtype) + math.log(self.n_samples)
        delta_target = s_target - log_kq[target]  # log Z_c = 0
        delta_noise = s_noise - log_kq[noise]
        return F.logsigmoid(delta_target) + F.logsigmoid(-delta_noise).sum(dim=1)


class PMISoftmax(SampledSoftmax):
    """PMI language model: word2vec's negative-sampling objective, normalised at test time.

    The paper's training maximises ``log σ(u_t . h) + Σ_j log σ(-u_uj . h)`` with
    ``u_j ~ q``, which drives ``u_w . h`` towards ``PMI_k(w, h) = log(P(w | h) / (k q(w)))``.
    At test time ``P(w | h) = exp(u_w . h) q(w) / Σ_v exp(u_v . h) q(v)``: the
    unigram distribution (the noise distribution for ``noise_power != 1``)
    puts back what the PMI divides out. No bias, no normalising constant.

    By default (``shift=True``) the training scores are ``u_w . h - log k``, so ``u_w . h``
    is driven towards the PMI itself instead of ``PMI - log k``; the test-time
    formula is unchanged (a constant cancels in the normalisation). What changes
    is where an untrained word starts: at ``u . h = 0`` it stands at independence
    (``P(w | h) = q(w)``) rather than ``k`` times above it. A rare word is drawn
    as noise about ``k q(w)`` times per position, so in a short training it keeps
    its starting score, and unshifted those words take far more than their
    unigram share of the probability (docs/results/lm.md measures this; the
    default was chosen by those measurements).

    Paper: Melamud, Dagan and Goldberger (2017), "A Simple Language Model based
    on PMI Matrix Approximations", https://arxiv.org/abs/1708.01276 (§3, Algorithm 1);
    ``shift=False`` is the paper's objective.

    word2vec's negative sampling (Mikolov et al. 2013, https://arxiv.org/abs/1310.4546)
    is this objective with ``n_samples=5, noise_power=0.75, shift=False,
    noise_per_row=True``: ``k`` words from the unigram distribution raised to 3/4,
    drawn for every row (:data:`NEGATIVE_SAMPLING`, the head's ``"word2vec"`` preset, which
    ``sohsm w2v train --head pmi`` takes).

    Args:
        shift: train ``u . h`` towards the PMI (subtract ``log k`` from the training
            scores). Default: ``True``; ``False`` is the paper's objective.
        others: see :class:`SampledSoftmax`.

    Example::

        >>> head = PMISoftmax(8, 50, counts=torch.arange(50, 0, -1), n_samples=10)
        >>> head.objective
        'negative_sampling'
        >>> head.eval().log_prob(torch.randn(3, 8)).shape
        torch.Size([3, 50])
    """

    objective = "negative_sampling"

    @property
    def binary_pairs(self) -> str | None:
        """``"noise"`` with ``noise_per_row`` and no bias (word2vec's negative sampling), else ``None``."""
        return "noise" if self.noise_per_row and self.bias is None else None

    def __init__(self, in_features: int, n_classes: int, *, counts: Tensor | None = None, n_samples: int = 100,
                 noise_power: float = 1.0, seed: int = 0, sparse: bool = False, shift: bool = True,
                 noise_per_row: bool = False) -> None:
        super().__init__(in_features, n_classes, counts=counts, n_samples=n_samples, noise_power=noise_power,
                         bias=False, seed=seed, sparse=sparse, noise_per_row=noise_per_row)
        self.shift = bool(shift)

    def logits(self, hidden: Tensor) -> Tensor:
        logits = upcast(F.linear(hidden, self.weight))
        return logits + self.noise_log_probs.to(logits.dtype)

    def sampled_output(self, hidden: Tensor, target: Tensor, noise: Tensor) -> Tensor:
        s_target, s_noise = self._scores(hidden, target, noise)
        if self.shift:
            s_target, s_noise = s_target - math.log(self.n_samples), s_noise - math.log(self.n_samples)
        return F.logsigmoid(s_target) + F.logsigmoid(-s_noise).sum(dim=1)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", shift={self.shift}"


#: word2vec's negative sampling, as options of the ``pmi`` head: k = 5 noise words per row from unigram^0.75, no shift
#: of the scores (the ``pmi`` head's training objective is then word2vec's NEG), row-sparse gradients
NEGATIVE_SAMPLING = {"n_samples": 5, "noise_power": 0.75, "shift": False, "noise_per_row": True, "sparse": True}
#: word2vec's updates touch the rows a step scores: the ``"word2vec"`` preset of every sampled head
_SPARSE = {"word2vec": {"sparse": True}}


@register_head("importance_sampling", presets=_SPARSE)
def _importance_sampling(in_features: int, n_classes: int, counts=None, seed: int = 0, n_samples: int = 100,
                         noise_power: float = 1.0, bias: bool = False, remove_accidental_hits: bool = True,
                         sparse: bool = False, noise_per_row: bool = False) -> ImportanceSamplingSoftmax:
    return ImportanceSamplingSoftmax(in_features, n_classes, counts=counts, n_samples=n_samples,
                                     noise_power=noise_power, bias=bias,
                                     remove_accidental_hits=remove_accidental_hits, seed=seed, sparse=sparse,
                                     noise_per_row=noise_per_row)


@register_head("nce", presets=_SPARSE)
def _nce(in_features: int, n_classes: int, counts=None, seed: int = 0, n_samples: int = 100,
         noise_power: float = 1.0, sparse: bool = False, bias_init: str = "unigram",
         noise_per_row: bool = False) -> NCESoftmax:
    return NCESoftmax(in_features, n_classes, counts=counts, n_samples=n_samples, noise_power=noise_power,
                      seed=seed, sparse=sparse, bias_init=bias_init, noise_per_row=noise_per_row)


@register_head("pmi", presets={"word2vec": NEGATIVE_SAMPLING})
def _pmi(in_features: int, n_classes: int, counts=None, seed: int = 0, n_samples: int = 100,
         noise_power: float = 1.0, sparse: bool = False, shift: bool = True,
         noise_per_row: bool = False) -> PMISoftmax:
    return PMISoftmax(in_features, n_classes, counts=counts, n_samples=n_samples, noise_power=noise_power,
                      seed=seed, sparse=sparse, shift=shift, noise_per_row=noise_per_row)
