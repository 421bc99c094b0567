"""The start-up lines of a language model's training session (before the progress bar, on stderr)::

    ptb: 10,000 words, 887,521 train tokens | LSTM 1×512/512, tied | head self_organized: 5.2M parameters,
        100 clusters, K 43 (auto, ≈8 per epoch) | 11M parameters in all | cpu | memory: at least 180.2 MB
        (parameters, gradients, optimizer state and statistics q; activations on top)
    plan: 4,437,760 tokens (5 epochs)
"""
from __future__ import annotations

import torch
from torch import nn

from sohsm.data.loading import Corpus
from sohsm.data.subwords import bpe_size
from sohsm.heads import ClusteredHead, Head, SelfOrganizingHead
from sohsm.tasks.lm.config import LMConfig
from sohsm.tasks.lm.model import describe_model
from sohsm.tasks.lm.preflight import OPTIMIZER_STATE, activation_bytes, estimate_bytes, format_bytes, peak_estimate
from sohsm.train.progress import count_text, duration_text, parameter_count


def describe_k(head: Head, config: LMConfig) -> str | None:
    """K of a re-clustering head as the head will use it (its epoch is ``sum(counts) / (batch_size * bptt)``
    steps); ``None`` for heads that never re-cluster."""
    if not isinstance(head, SelfOrganizingHead):
        return None
    return head.describe_schedule(config.batch_size * config.bptt)


def describe_tying(config: LMConfig) -> str:
    """``tied``, or ``untied`` with the reason, so that a run untied by its sizes or its head is not untied
    silently (a new run ties where it can: :func:`~sohsm.tasks.lm.config.ties_by_default`)."""
    m, head = config.model, config.head
    if m.tie_weights:
        return "tied"
    refusal = head.spec(check=False).tying_refusal(m.hidden_size)
    if refusal is not None:
        return f"untied (head {head.name} cannot be tied: {refusal})"
    if m.emb_size != m.hidden_size:
        return f"untied (emb_size {m.emb_size} != hidden_size {m.hidden_size}; equal sizes tie)"
    return "untied (tie_weights false)"


def describe_vocabulary(corpus: Corpus, asked: str | None = None) -> str:
    """``10,000 words, 929,589 train tokens``; for subwords also what cuts them and how many tokens a word takes,
    and, where a BPE of ``asked`` (``bpe:SIZE``) learnt fewer tokens than asked, that it did and why."""
    tokens = corpus.train.numel()
    if corpus.tokenizer is None:
        return f"{len(corpus.vocab):,} words, {tokens:,} train tokens"
    words = corpus.words.get("train")
    per_word = f", {tokens / words:.2f} tokens a word" if words else ""
    size = bpe_size(asked) if asked else None
    short = (f" of the {size:,} asked (the training split has no more pairs to merge)"
             if size is not None and len(corpus.vocab) < size else "")
    return (f"{len(corpus.vocab):,} subwords{short} (tokenizer {corpus.tokenizer.digest}), {tokens:,} train "
            f"tokens{per_word}")


def startup_lines(config: LMConfig, corpus: Corpus, model: nn.Module, head: Head, device: torch.device,
                  planned_tokens: int, tokens_per_epoch: int, done_tokens: int = 0) -> list[str]:
    """The two lines a session prints before it trains: what runs (data, model, head, device) and the plan."""
    head_facts = [f"{count_text(parameter_count(head))} parameters"]
    if isinstance(head, ClusteredHead):
        head_facts.append(f"{head.n_clusters} clusters")
    k = describe_k(head, config)
    if k is not None:
        head_facts.append(k)
    what = (f"{corpus.name}: {describe_vocabulary(corpus, config.data.tokenizer)} | "
            f"{describe_model(config.model, config.bptt)}, {describe_tying(config)} | head {config.head.name}: "
            f"{', '.join(head_facts)} | "
            f"{count_text(parameter_count(model, head))} parameters in all | {device}")
    graph = torch.device(device).type == "cuda" and getattr(config, "step_graph", "off") != "off"
    if torch.device(device).type == "cpu":
        trained = sum(p.numel() * p.element_size() for p in {id(p): p for part in (model, head)
                                                              for p in part.parameters() if p.requires_grad}.values())
        needed, parts = peak_estimate(config, len(corpus.vocab), trained)
        what += f" | memory: about {format_bytes(needed)} at its peak ({parts})"
    else:
        needed, covers = estimate_bytes(config, len(corpus.vocab), graph=graph)
        needed += activation_bytes(config)
        what += f" | memory: about {format_bytes(needed)} on {device} ({covers} and activations)"
    epochs = planned_tokens / tokens_per_epoch
    if config.max_tokens is not None and config.max_tokens == planned_tokens:
        plan = f"plan: {planned_tokens:,} tokens (max_tokens; {epochs:.2f} epochs)"
    else:
        plan = f"plan: {planned_tokens:,} tokens ({config.epochs} epochs)"
    if config.time_budget is not None:
        plan += f" or {duration_text(config.time_budget)} of training (time_budget), whichever comes first"
    if done_tokens:
        plan += f"; resuming at {done_tokens:,}"
    last, best = checkpoint_bytes(model, head, config.optim.optimizer)
    plan += f"; checkpoints of about {format_bytes(last)} (last.pt) and {format_bytes(best)} (best.pt)"
    return [what, plan]


def checkpoint_bytes(model: nn.Module, head: Head, optimizer: str) -> tuple[int, int]:
    """About the bytes of ``last.pt`` and ``best.pt``: the weights and buffers of model and head (a tied weight
    once), ``last.pt`` also the optimizer's state (Adagrad one number a weight, Adam two). What a run writes,
    said before it writes it (a million-word run writes gigabytes)."""
    seen, weights, trained = set(), 0, 0
    for part in (model, head):
        for tensor in part.state_dict(keep_vars=True).values():
            if not isinstance(tensor, torch.Tensor) or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            weights += tensor.numel() * tensor.element_size()
            if isinstance(tensor, nn.Parameter) and tensor.requires_grad:
                trained += tensor.numel() * tensor.element_size()
    return weights + trained * OPTIMIZER_STATE.get(optimizer, 2), weights
