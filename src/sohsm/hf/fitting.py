"""Fitting a two-level head to the trained ``lm_head`` it replaces: what :func:`sohsm.hf.use_head` does with ``data``.

With the trained layer's rows as its word vectors (:mod:`sohsm.heads.two_level.takeover`), a two-level head's
softmax inside a cluster is the trained one's, and all it lacks is each cluster's probability: the trained
layer's ``P(c | h) = sum_{w in c} softmax(W h)_w``, which the head scores as ``softmax_c(V h)``. Fitting ``V`` to
it is a soft-label logistic regression, convex, solved by L-BFGS on hidden states of the user's data
(:func:`fit_to_layer`), then the words re-clustered by Algorithm 1 on what the fitted clusters predict of them (the
self-organized head's statistic, the trained layer's probabilities standing in for the next word) and ``V`` fitted
again, while the training KL falls; where the words have fewer dimensions than ``d`` (bands, ``word_dim``) a second
stage
trains all the head's parameters on the full KL divergence to the trained layer (Adam, minibatches), for the
rest of the time budget, and keeps the better of the two. Progress shows on a ``tqdm`` bar; :class:`FitReport`
says the gap reached on held-out positions (KL, and the perplexity of both on the data's next tokens).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from sohsm.heads.two_level.takeover import reassigned

#: the label HF's losses ignore (a position with no next token)
IGNORE_INDEX = -100
#: share of the positions kept out of the fit, on which the gap is reported
HELD_OUT = 0.1


@dataclass
class FitReport:
    """The gap a fitted head left to the trained layer, on ``tokens`` held-out positions of the data.

    Attributes:
        tokens: positions the gap is measured on (not fitted on).
        kl_start: ``KL(trained || head)`` in nats per position before the fit (the kept vectors and clusters).
        kl: the same after it.
        perplexity_original / perplexity_head: on the data's next tokens at those positions (``None`` where the
            data were hidden states, without tokens).
        seconds: the fit's time (hidden states collected, clustering and fit).
        steps: optimizer steps taken.
    """

    tokens: int
    kl_start: float
    kl: float
    perplexity_original: float | None
    perplexity_head: float | None
    seconds: float
    steps: int

    def __str__(self) -> str:
        ppl = "" if self.perplexity_head is None or self.perplexity_original is None else (
            f", perplexity {self.perplexity_head:.2f} against the trained lm_head's {self.perplexity_original:.2f} "
            f"({self.perplexity_head / self.perplexity_original:.4f}x)")
        return (f"head fitted to the trained lm_head in {self.seconds:.1f} s ({self.steps} steps): KL "
                f"{self.kl:.4f} nats/token (from {self.kl_start:.4f}) on {self.tokens} held-out positions{ppl}")


def _batches(data) -> Iterable:
    if isinstance(data, (Tensor, Mapping)):
        return [data]
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ValueError(f"data must be batches of input ids ([B, T] integer tensors, or dicts with input_ids) or of "
                         f"hidden states ([..., d] float tensors), got {type(data).__name__}")
    return data


@torch.no_grad()
def collect_hidden(model: nn.Module, output: nn.Module, data, n_classes: int, in_features: int,
                   max_tokens: int) -> tuple[Tensor, Tensor | None]:
    """``(hidden [M, d], next tokens [M] or None)``: what ``output`` (the trained ``lm_head``) reads on ``data``.

    Batches of input ids run through ``model`` (in eval mode, no gradient), the hidden states taken where they
    enter ``output``; an ``attention_mask`` drops the padded positions. Batches of hidden states are taken as they
    are. At most ``max_tokens`` positions (the first ones).

    Raises:
        ValueError: a batch of another shape or type, ids outside the model's vocabulary, or no position at all.
    """
    kept: list[Tensor] = []
    hook = output.register_forward_hook(lambda module, args, result: kept.append(args[0].detach()))
    hidden, targets, total, with_ids = [], [], 0, None
    was_training = model.training
    model.eval()
    try:
        for i, batch in enumerate(_batches(data)):
            mask = None
            if isinstance(batch, Mapping):
                if "input_ids" not in batch:
                    raise ValueError(f"data batch {i} is a mapping without input_ids (keys: "
                                     f"{', '.join(map(str, batch))})")
                batch, mask = batch["input_ids"], batch.get("attention_mask")
            if not isinstance(batch, Tensor):
                raise ValueError(f"data batch {i} is a {type(batch).__name__}: give [B, T] integer tensors of input "
                                 "ids "
                                 f"or [..., {in_features}] float tensors of hidden states")
            ids = not batch.is_floating_point()
            if with_ids is not None and ids != with_ids:
                raise ValueError(f"data batch {i} mixes input ids and hidden states with the batches before it")
            with_ids = ids
            if ids:
                h, t = _run(model, batch, mask, kept, n_classes, i)
            else:
                if batch.dim() < 2 or batch.size(-1) != in_features:
                    raise ValueError(f"data batch {i} of hidden states has shape {tuple(batch.shape)}: the model's "
                                     f"lm_head reads [..., {in_features}]")
                h, t = batch.reshape(-1, in_features), None
            hidden.append(h[: max_tokens - total])
            if t is not None:
                targets.append(t[: max_tokens - total])
            total += hidden[-1].size(0)
            if total >= max_tokens:
                break
    finally:
        hook.remove()
        model.train(was_training)
    if total == 0:
        raise ValueError("data holds no position to fit the head on")
    return torch.cat(hidden).float(), (torch.cat(targets) if targets else None)


def _run(model: nn.Module, ids: Tensor, mask: Tensor | None, kept: list[Tensor], n_classes: int,
         i: int) -> tuple[Tensor, Tensor]:
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.size(1) < 1:
        raise ValueError(f"data batch {i} of input ids has shape {tuple(ids.shape)}: give [B, T] (a row per sequence)")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_classes):
        raise ValueError(f"data batch {i} holds token id "
                         f"{int(ids.max()) if int(ids.max()) >= n_classes else int(ids.min())} but the model scores "
                         f"{n_classes} tokens (ids 0..{n_classes - 1}): a tokenizer larger than "
                         "the model's vocabulary (resize_token_embeddings first)")
    if mask is not None and tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"data batch {i}: attention_mask of shape {tuple(mask.shape)} for input ids "
                         f"{tuple(ids.shape)}")
    kept.clear()
    device = next(model.parameters()).device
    model(input_ids=ids.to(device), **({} if mask is None else {"attention_mask": mask.to(device)}))
    if len(kept) != 1:
        raise RuntimeError(f"lm_head ran {len(kept)} times in one forward")  # pragma: no cover
    hidden = kept[0]
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[:, :-1] = ids[:, 1:]
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    if mask is not None:
        targets[:, :-1] = torch.where(keep[:, 1:], targets[:, :-1], IGNORE_INDEX)
    keep = keep.to(hidden.device)
    return hidden[keep].reshape(-1, hidden.size(-1)), targets.to(hidden.device)[keep].reshape(-1)


def _teacher(weight: Tensor, hidden: Tensor) -> Tensor:
    return F.log_softmax(F.linear(hidden, weight), dim=-1)


def _gap(head, weight: Tensor, hidden: Tensor, targets: Tensor | None,
         chunk: int = 2048) -> tuple[float, float | None, float | None]:
    """``(KL nats/position, perplexity of the trained layer, of the head)`` on ``hidden``."""
    kl, nll_t, nll_h, n = 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for start in range(0, hidden.size(0), chunk):
            h = hidden[start:start + chunk]
            teacher = _teacher(weight, h)
            mine = head.log_prob(h.to(head.cluster_weight.dtype)).float()
            kl += float((teacher.exp() * (teacher - mine)).sum())
            if targets is not None:
                t = targets[start:start + chunk]
                keep = t != IGNORE_INDEX
                nll_t -= float(teacher[keep].gather(1, t[keep, None]).sum())
                nll_h -= float(mine[keep].gather(1, t[keep, None]).sum())
                n += int(keep.sum())
    kl /= max(hidden.size(0), 1)
    if not n:
        return kl, None, None
    return kl, math.exp(nll_t / n), math.exp(nll_h / n)


def fit_to_layer(head, weight: Tensor, hidden: Tensor, targets: Tensor | None = None, seconds: float = 30.0,
                 joint: bool = False, progress: bool = True, started: float | None = None,
                 seed: int = 0, rounds: int = 3) -> FitReport:
    """Fit ``head`` to the trained layer ``weight`` (logits ``weight @ h``) on ``hidden`` ``[M, d]``; see the module.

    Args:
        head: a two-level head holding the trained layer's vectors (:func:`~sohsm.heads.two_level.takeover.
            keep_output_layer`).
        weight: the trained layer, ``[N, d]``, frozen.
        hidden: the hidden states it reads; the last :data:`HELD_OUT` of them are held out for the report.
        targets: ``[M]`` the next token at each position (``-100``: none), for the report's perplexities.
        seconds: the time budget (both stages; L-BFGS stops earlier once converged).
        joint: train every parameter of the head in a second stage (its word vectors are approximations: bands,
            ``word_dim``); else the cluster vectors alone, whose fit is then the whole gap.
        progress: show a ``tqdm`` bar.
        started: when the conversion began (``time.perf_counter()``), for the report's seconds.
        rounds: at most this many re-clusterings (Algorithm 1 on what the fitted cluster vectors predict of each
            word, the trained layer's probabilities standing in for the next word), each kept while the KL falls.
    """
    started = time.perf_counter() if started is None else started
    deadline = time.perf_counter() + seconds
    weight = weight.detach().float().to(hidden.device)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(hidden.size(0), generator=generator).to(hidden.device)
    n_held = max(1, int(hidden.size(0) * HELD_OUT)) if hidden.size(0) > 1 else 0
    held, train = order[:n_held], order[n_held:] if n_held < hidden.size(0) else order
    held_targets = None if targets is None else targets[held]
    kl_start = _gap(head, weight, hidden[held], held_targets)[0]
    dtype = head.cluster_weight.dtype
    h_train = hidden[train].to(dtype)
    steps = 0
    bar = tqdm(desc="fitting the head to the trained lm_head", unit="step", disable=not progress, leave=False)
    try:
        # stage 1: the cluster vectors, on the trained layer's cluster probabilities (convex), then Algorithm 1 on
        # what they predict of each word, and the vectors again, while the training KL falls
        frozen = {p: p.requires_grad for p in head.parameters()}
        fitted = _cluster_parameters(head)
        for p in head.parameters():
            p.requires_grad_(any(p is q for q in fitted))
        stage_one = deadline if not joint else time.perf_counter() + seconds / 2
        kl_train, taken = _fit_clusters(head, weight, h_train, stage_one, bar)
        steps += taken
        best = (kl_train, head.assignment.clone(), [p.detach().clone() for p in fitted])
        for _ in range(rounds):
            if time.perf_counter() >= stage_one:
                break
            new = reassigned(head, *_cluster_statistics(head, weight, h_train)).to(head.assignment.device)
            if torch.equal(new, head.assignment):
                break
            head.set_assignment(new)
            kl_train, taken = _fit_clusters(head, weight, h_train, stage_one, bar)
            steps += taken
            if kl_train >= best[0]:
                break
            best = (kl_train, head.assignment.clone(), [p.detach().clone() for p in fitted])
        with torch.no_grad():  # the best clusters seen, with their vectors (and biases)
            head.set_assignment(best[1])
            for p, value in zip(fitted, best[2]):
                p.copy_(value)
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        head.zero_grad(set_to_none=True)
        if joint:
            steps += _joint(head, weight, h_train, deadline, bar, hidden[held], held_targets, generator)
        _seed_statistics(head, weight, h_train)
    finally:
        bar.close()
    kl, ppl_t, ppl_h = _gap(head, weight, hidden[held], held_targets)
    return FitReport(int(held.numel()), kl_start, kl, ppl_t, ppl_h, time.perf_counter() - started, steps)


def _cluster_probs(head, weight: Tensor, hidden: Tensor, chunk: int = 4096) -> Tensor:
    """``[M, C]`` the trained layer's probability of each of ``head``'s clusters."""
    assignment = head.assignment.to(hidden.device)
    out = torch.zeros(hidden.size(0), head.n_clusters, device=hidden.device, dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, hidden.size(0), chunk):
            out[start:start + chunk].index_add_(1, assignment,
                                                _teacher(weight, hidden[start:start + chunk].float()).exp())
    return out


def _fit_clusters(head, weight: Tensor, hidden: Tensor, until: float, bar) -> tuple[float, int]:
    """The cluster vectors fitted by L-BFGS to the trained layer's cluster probabilities on ``hidden`` (a soft-label
    logistic regression: convex) until converged or ``until``; returns the training KL of the clusters and the steps."""
    target = _cluster_probs(head, weight, hidden)
    entropy = float((target * target.clamp_min(1e-30).log()).sum(1).mean())
    optimizer = torch.optim.LBFGS(_cluster_parameters(head), lr=1.0, max_iter=20, history_size=20,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-7, tolerance_change=1e-10)

    def closure():
        optimizer.zero_grad()
        loss = -(target * head._cluster_log_probs(hidden).float().clamp_min(-1e4)).sum(1).mean()
        loss.backward()
        return loss.detach()

    previous, loss, steps = math.inf, math.inf, 0
    while time.perf_counter() < until:
        loss = float(optimizer.step(closure))
        steps += 1
        bar.update(1)
        bar.set_postfix(stage="clusters", kl=f"{loss + entropy:.4f}")
        if previous - loss < 1e-6:
            break
        previous = loss
    for p in _cluster_parameters(head):
        p.grad = None
    return loss + entropy, steps


def _cluster_parameters(head) -> list[nn.Parameter]:
    """What scores the clusters: their vectors, and their biases where the head has them."""
    return [head.cluster_weight] + ([head.cluster_bias] if head.cluster_bias is not None else [])


@torch.no_grad()
def _cluster_statistics(head, weight: Tensor, hidden: Tensor, chunk: int = 4096) -> tuple[Tensor, Tensor]:
    """``(q [N, C], tf [N])``: the self-organized head's statistic ``E[log2 P(c | h) | next word = w]`` with the
    trained layer's ``P(w | h)`` as the soft next word, and each word's expected share of the tokens."""
    q = torch.zeros(head.n_classes, head.n_clusters, dtype=torch.float64)
    mass = torch.zeros(head.n_classes, dtype=torch.float64)
    for start in range(0, hidden.size(0), chunk):
        h = hidden[start:start + chunk]
        probs = _teacher(weight, h.float()).exp().double()
        q += (probs.T @ head._cluster_log_probs(h).double().clamp_min(-1e4)).cpu()
        mass += probs.sum(0).cpu()
    return q / mass.clamp_min(1e-30)[:, None] / math.log(2), mass / mass.sum()


def _seed_statistics(head, weight: Tensor, hidden: Tensor) -> None:
    """A self-organized head's statistics ``q`` started from what the fitted head and the trained layer say of each
    word (:func:`_cluster_statistics`), not from "no information": else its first re-clustering in fine-tuning
    moves every word the steps before it did not show away from the clusters fitted here (docs/results/pretrained.md
    measures fine-tuning with and without re-clustering). A word the data never makes likely keeps the uniform
    start."""
    statistics = getattr(head, "statistics", None)
    if statistics is None:
        return
    q, tf = _cluster_statistics(head, weight, hidden)
    shortlist = int(getattr(head, "shortlist", 0) or 0)
    q = q[:, shortlist:]
    q[tf <= 0] = -math.log2(head.n_clusters - shortlist)
    statistics.seed(q)


def _joint(head, weight: Tensor, hidden: Tensor, deadline: float, bar, held: Tensor, held_targets,
           generator: torch.Generator, batch: int = 512, lr: float = 1e-3) -> int:
    """Stage 2: every parameter of the head on ``KL(trained || head)``, Adam on minibatches until ``deadline``;
    the head ends at the better of where it started and where it got, by the held-out KL."""
    before = _gap(head, weight, held, None)[0]
    saved = [(p, p.detach().clone()) for p in head.parameters()]
    optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=lr)
    steps = 0
    while time.perf_counter() < deadline:
        rows = torch.randint(0, hidden.size(0), (min(batch, hidden.size(0)),), generator=generator)
        h = hidden[rows.to(hidden.device)]
        teacher = _teacher(weight, h.float())
        loss = (teacher.exp() * (teacher - head.log_prob(h).float())).sum(1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        bar.update(1)
        bar.set_postfix(stage="all", kl=f"{float(loss.detach()):.4f}")
    head.zero_grad(set_to_none=True)
    if _gap(head, weight, held, None)[0] > before:
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    return steps
