"""A sohsm head in place of the ``lm_head`` of a Hugging Face causal language model: :func:`use_head`.

The model keeps its class, its forward and its ``generate``. :func:`use_head` puts an :class:`LMHead` where
the output embedding (``lm_head``) was, and two hooks around the model's forward:

* called without ``labels`` (as ``generate`` calls it), ``lm_head(hidden)`` returns the head's exact
  next-token log-probabilities (``head.log_prob``) as the logits, for the positions the model keeps
  (``logits_to_keep``: the last one in ``generate``), so greedy search, sampling and beam search read them;
* called with ``labels``, the pre-hook takes them out of the call, so the model never scores the whole
  vocabulary nor computes its own loss: ``lm_head`` keeps the hidden states it is given and returns an empty
  ``[..., 0]`` tensor, and the post-hook returns the head's loss over the shifted labels (``-100`` ignored,
  the mean over the other tokens, or their sum over ``num_items_in_batch`` where the ``Trainer`` gives it).
  ``logits`` is then ``None``, unless the head was given ``logits_with_loss=True`` (the ``Trainer``'s
  ``compute_metrics`` needs them): log-probabilities cost a full softmax, which the loss avoids.

Hooks rather than a subclass or a new forward: the model's forward keeps its signature (the ``Trainer``
and ``generate`` read it) and its class (``save_pretrained`` names it), and whatever the forward does
before ``lm_head`` (the final norm, slicing the kept positions) runs as it did. A model whose forward
changes the logits after ``lm_head`` (a soft cap, a scale) changes the log-probabilities ``generate``
reads the same way; the loss is the head's own. Hooks run where the model is called (``model(...)``, as
``generate`` and the ``Trainer`` call it); ``model.forward(...)`` skips them, and the model's own loss of
the head's log-probabilities is then the same NLL, at the price of the full softmax, and with no statistics
for a self-organizing head.
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from sohsm.heads import Head, TwoLevelSoftmax, build_head, head_options, tying_refusal
from sohsm.heads.base import check_counts
from sohsm.hf.extra_state import decode_extra_states, encode_extra_states
from sohsm.hf.fitting import FitReport
from sohsm.hf.pretrained import TAKEOVER_STAY_MARGIN, check_bias, check_fit_options, take_over as keep_pretrained
from sohsm.models.tying import tie_embedding

#: the label HF's losses ignore
IGNORE_INDEX = -100
#: the version of :data:`SPEC`'s record in ``config.sohsm_head``
SPEC_VERSION = 1
#: the config attribute that records the head, so that :func:`sohsm.hf.load` can build it again
SPEC = "sohsm_head"


@dataclass
class _Call:
    """What the pre-hook took from a forward call with labels, for the post-hook."""

    labels: Tensor
    shift_labels: Tensor | None
    num_items_in_batch: Tensor | int | None
    kept: list[Tensor]


class LMHead(nn.Module):
    """What ``lm_head`` is after :func:`use_head`: a sohsm ``head`` behind the call ``lm_head(hidden) -> logits``.

    ``lm_head(hidden [*, d])`` returns ``head.log_prob(hidden)`` as ``[*, N]`` logits. While the model runs a
    forward with ``labels`` it keeps ``hidden`` for the loss instead and returns an empty ``[*, 0]`` tensor.

    Attributes:
        head: the sohsm head; its state is saved with the model's, under ``lm_head.head.``.
        counts: the ``counts`` the head was built with (a buffer, saved, so that :func:`sohsm.hf.load` can
            build the same head again), or ``None``.
        logits_with_loss: a forward with ``labels`` returns the log-probabilities as ``logits`` too.
    """

    def __init__(self, head: Head, counts: Tensor | None = None, logits_with_loss: bool = False,
                 labels_position: int | None = None) -> None:
        super().__init__()
        self.head = head
        if counts is not None:
            self.register_buffer("counts", counts)
        else:
            self.counts = None
        self.logits_with_loss = bool(logits_with_loss)
        self._labels_position = labels_position  # where the model's forward takes labels positionally
        self._call: _Call | None = None
        #: the gap to the trained ``lm_head`` the head was fitted to (:class:`~sohsm.hf.fitting.FitReport`), or ``None``
        self.fit_report: FitReport | None = None
        # safetensors holds tensors only: the head's extra state (a dict) travels as bytes in a tensor
        self.register_state_dict_post_hook(encode_extra_states)
        self.register_load_state_dict_pre_hook(decode_extra_states)

    def forward(self, hidden: Tensor) -> Tensor:
        if self._call is not None:  # a forward with labels: the loss is computed from these, after it
            self._call.kept.append(hidden)
            return hidden.new_empty(*hidden.shape[:-1], 0)
        return self.head.log_prob(hidden).view(*hidden.shape[:-1], self.head.n_classes)

    # -- the hooks around the model's forward ------------------------------------------------------
    def before_forward(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Forward pre-hook: take ``labels`` out of the call (and note how the loss is to be reduced)."""
        labels = kwargs.pop("labels", None)
        at = self._labels_position
        if labels is None and at is not None and len(args) > at and args[at] is not None:
            labels, args = args[at], (*args[:at], None, *args[at + 1:])
        if labels is None:
            self._call = None
            return args, kwargs
        self._call = _Call(labels, kwargs.get("shift_labels"), kwargs.get("num_items_in_batch"), [])
        return args, kwargs

    def after_forward(self, model: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        """Forward hook: the head's loss over the kept hidden states and the labels, in the model's output."""
        call, self._call = self._call, None
        if call is None or output is None:  # no labels, or the forward raised
            return None
        if len(call.kept) != 1:
            raise RuntimeError(f"lm_head ran {len(call.kept)} times in one forward of {type(model).__name__}; "
                               "sohsm.hf computes the loss from its one call")
        hidden = call.kept[0]
        loss = causal_loss(self.head, hidden, call.labels, call.shift_labels, call.num_items_in_batch)
        aux_loss = output.get("aux_loss") if isinstance(output, ModelOutput) else None
        coefficient = getattr(model, "router_aux_loss_coef", None)
        if aux_loss is not None and coefficient is not None:  # a mixture of experts adds its router's loss
            loss = loss + coefficient * aux_loss.to(loss.device)
        logits = self.head.log_prob(hidden).view(*hidden.shape[:-1], self.head.n_classes) \
            if self.logits_with_loss else None
        if isinstance(output, ModelOutput):
            fields = {key: value for key, value in output.items() if key not in ("loss", "logits")}
            return type(output)(loss=loss, logits=logits, **fields)
        rest = tuple(output[1:]) if isinstance(output, tuple) else ()  # return_dict=False: (logits, *rest)
        return (loss, *([logits] if logits is not None else []), *rest)

    def extra_repr(self) -> str:
        return f"logits_with_loss={self.logits_with_loss}"


def _before_forward(model: PreTrainedModel, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The model's forward pre-hook: its ``lm_head``'s :meth:`LMHead.before_forward`.

    The hooks find the ``lm_head`` of the model they run on, rather than holding one: a copy of the model
    (``copy.deepcopy``, the replicas of ``nn.DataParallel``, which share the hooks) uses its own.
    """
    lm_head = model.get_output_embeddings()
    return lm_head.before_forward(model, args, kwargs) if isinstance(lm_head, LMHead) else None


def _after_forward(model: PreTrainedModel, args: tuple, kwargs: dict, output: Any) -> Any:
    """The model's forward hook: its ``lm_head``'s :meth:`LMHead.after_forward`."""
    lm_head = model.get_output_embeddings()
    return lm_head.after_forward(model, args, kwargs, output) if isinstance(lm_head, LMHead) else None


def causal_loss(head: Head, hidden: Tensor, labels: Tensor, shift_labels: Tensor | None = None,
                num_items_in_batch: Tensor | int | None = None) -> Tensor:
    """The head's loss of predicting token ``t + 1`` from position ``t``, as HF's causal LM loss reduces it.

    Labels ``-100`` are ignored and their hidden states never reach the head (so a self-organizing head
    gathers no statistics from padding). The mean over the other tokens; with ``num_items_in_batch``
    (the ``Trainer``'s count over the accumulated batches), their sum divided by it. ``shift_labels``
    (already shifted, as HF takes them) replace the shift of ``labels``. No token to predict: ``0``.

    Raises:
        ValueError: the labels do not cover the positions the model kept.
    """
    if shift_labels is not None:
        targets = shift_labels
    else:
        targets, hidden = labels[..., 1:], hidden[..., :-1, :]
    if hidden.dim() < 2 or tuple(hidden.shape[:-1]) != tuple(targets.shape):
        raise ValueError(f"labels of shape {tuple(labels.shape)} do not cover the hidden states the model kept "
                         f"({tuple(hidden.shape)}, before the shift): give labels for every position, and no "
                         "logits_to_keep with labels")
    targets = targets.to(hidden.device).reshape(-1)
    hidden = hidden.reshape(-1, hidden.size(-1))
    keep = targets != IGNORE_INDEX
    rows, targets = hidden[keep], targets[keep]
    if rows.size(0) == 0:
        return hidden.sum() * 0.0  # zero, with a gradient path, where HF's mean over no token is NaN
    output = head(rows, targets)
    if num_items_in_batch is None:
        return output.loss
    if isinstance(num_items_in_batch, Tensor):
        num_items_in_batch = num_items_in_batch.to(output.output.device)
    return -output.output.sum() / num_items_in_batch


def use_head(model: PreTrainedModel, name: str, counts=None, *, keep_weights: bool = True, data=None,
             fit_seconds: float = 30.0, progress: bool = True, logits_with_loss: bool = False, **options) -> Head:
    """Give the causal language model ``model`` the sohsm head ``name`` in place of its ``lm_head``; returns the head.

    The head scores the rows of the model's output embedding (``N`` = its rows, which may be more than the
    tokenizer's vocabulary) from hidden states of its width ``d``, in the model's dtype and on its device.
    After it, ``model(input_ids, labels=labels).loss`` is the head's loss and ``model.generate`` decodes
    with the head's exact log-probabilities (see the module's docstring); the head is
    ``model.get_output_embeddings().head`` (:func:`head_of`). A head that re-clusters needs
    ``head.attach(optimizer)`` after the optimizer is built (:class:`~sohsm.hf.HeadCallback` does it for the
    ``Trainer``). The head, its options and ``counts`` are recorded in ``model.config.sohsm_head`` and the
    model's state dict, so ``model.save_pretrained(path)`` saves them and :func:`sohsm.hf.load` reads them.

    Where the config ties (``tie_word_embeddings``, as GPT-2's does) the head is tied to the model's input
    embedding, keeping the embedding's weights: a head that lends its weight itself (``full``) takes the
    embedding's parameter (one parameter, as HF ties); a two-level head takes the embedding's rows into its
    cluster layout and the model reads its input vectors through the head (``head.embed``, which follows every
    re-clustering). Untied, the ``full`` head takes ``lm_head``'s weight (and bias), so the model computes what
    it computed before.

    A two-level head (``self_organized``, ``two_level_frequency``, ``two_level_random``), tied or not, keeps what
    the ``lm_head`` learned (:mod:`sohsm.hf.pretrained`): its rows become the word vectors (a band's rows, with
    ``div_value``, the best low-rank fit of their scores), the words it scores alike start in one cluster (within
    Algorithm 1's bounds), each cluster gets a bias (``cluster_bias=True`` unless the options say otherwise:
    a cluster's trained probability is a log-sum-exp of its words' scores, a vector plus a constant), a
    self-organized head moves a word at a re-clustering only by a margin (``stay_margin=3.0`` unless given: its
    clusters start fitted), and with ``data`` the cluster vectors and biases are fitted to the frozen
    ``lm_head``'s distribution on it (and a self-organized head's statistics start from it) (``fit_seconds``, a
    ``tqdm`` bar; the gap reached, KL and perplexity against the
    ``lm_head``, is :class:`~sohsm.hf.fitting.FitReport` ``model.get_output_embeddings().fit_report``). Every other
    head scores words its own way and starts from its own initialisation, with a warning.

    Args:
        model: a ``transformers`` causal language model (``AutoModelForCausalLM``, ``*ForCausalLM``, GPT-2's
            ``GPT2LMHeadModel``) whose output embedding is its ``lm_head``.
        name: a registered head (:func:`sohsm.heads.head_names`).
        counts: ``[N]`` token counts of the training data, for the heads that use them (one per row of
            the output embedding: zeros for rows no token uses).
        keep_weights: ``False``: the head starts from its own initialisation, and a tied head's vectors are
            re-drawn as the model initialises its embedding (``normal(0, initializer_range)``), which is how a
            head whose vectors cannot hold the embedding's (``adaptive``: adaptive input) is tied.
        data: batches of input ids (``[B, T]`` integer tensors, or dicts with ``input_ids`` and an optional
            ``attention_mask``) or of hidden states (``[..., d]``) to fit a two-level head to the trained
            ``lm_head`` on (its first 16,384 positions, a tenth of them held out for the report); ``None``: no fit.
        fit_seconds: the fit's time budget.
        progress: show the fit's progress bar.
        logits_with_loss: a forward with ``labels`` also returns the log-probabilities as ``logits``.
        options: the head's options (:func:`sohsm.heads.head_options`); JSON values, as they are saved in
            the config.

    Raises:
        ValueError: a model without an output embedding, or given a sohsm head already; an unknown head
            name or option; counts not one per row; a head that cannot be tied while the config ties, or
            whose word vectors cannot keep the embedding's; an input embedding of another size than the
            head; an ``lm_head`` with a bias for a head without one (unless ``keep_weights=False``); ``data``
            of another shape, or with ids the model does not score.
    """
    return _install(model, name, counts, keep_weights, logits_with_loss, options, take_over=True, data=data,
                    fit_seconds=fit_seconds, progress=progress)


def _install(model: PreTrainedModel, name: str, counts, keep_weights: bool, logits_with_loss: bool,
             options: dict, take_over: bool, data=None, fit_seconds: float = 30.0, progress: bool = True) -> Head:
    """:func:`use_head`; ``take_over=False`` (:func:`sohsm.hf.load`, whose state dict follows) keeps nothing of the
    ``lm_head`` a two-level head would otherwise read its vectors and clusters from."""
    output = _output_embedding(model)
    head_options(name)  # an unknown name: the registry's error, with its suggestion
    weight = getattr(output, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"the output embedding of {type(model).__name__} ({type(output).__name__}) has no [N, d] "
                         "weight to read the vocabulary and hidden size from")
    n_classes, in_features = weight.shape
    options = dict(options)
    try:
        json.dumps(options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"head {name!r}: its options must be JSON values (they are saved in the model's config "
                         f"as {SPEC}): {error}") from None
    counts = _checked_counts(counts, n_classes, model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    embedding = _input_embedding(model, name, options, in_features, n_classes) if tied else None
    fit_seconds = check_fit_options(fit_seconds, data)
    if take_over and keep_weights and "cluster_bias" in (head_options(name) or {}):
        # a trained layer's cluster probability is a log-sum-exp of its words' scores, which a vector fits only
        # up to a constant per cluster: a bias holds it (docs/results/pretrained.md); saved with the options
        options.setdefault("cluster_bias", True)
        if "stay_margin" in (head_options(name) or {}) and options.get("q_clusters") is None:
            options.setdefault("stay_margin", TAKEOVER_STAY_MARGIN)
    head = build_head(name, in_features, n_classes, counts=counts, **options)
    head.to(weight.device)
    if weight.is_floating_point():
        head.to(weight.dtype)
    report, kept = None, False
    if take_over and keep_weights and not head.logits_are_linear and (not tied or isinstance(head, TwoLevelSoftmax)):
        check_bias(output, name, head, model)
        report = keep_pretrained(model, output, head, name, counts, data, fit_seconds, progress, tied)
        kept = isinstance(head, TwoLevelSoftmax)
    if tied:
        assert embedding is not None  # (found where tied)
        _tie(model, head, name, embedding, keep_weights, kept)
    elif keep_weights and head.logits_are_linear:  # the model computes what it computed before
        head.set_word_vectors(weight.detach(), getattr(output, "bias", None))  # (weight: output.weight)
    lm_head = LMHead(head, _saved_counts(counts), logits_with_loss, _labels_position(model))
    lm_head.fit_report = report
    model.set_output_embeddings(lm_head)
    _declare_tying(model, lm_head)
    model.register_forward_pre_hook(_before_forward, with_kwargs=True)
    model.register_forward_hook(_after_forward, with_kwargs=True, always_call=True)
    setattr(model.config, SPEC, {"version": SPEC_VERSION, "name": name, "options": options,
                                 "counts": counts is not None, "logits_with_loss": bool(logits_with_loss)})
    return head


def head_of(model: nn.Module) -> Head:
    """The sohsm head :func:`use_head` gave ``model``.

    Raises:
        ValueError: ``model`` has none.
    """
    get_output_embeddings = getattr(model, "get_output_embeddings", None)
    output = get_output_embeddings() if callable(get_output_embeddings) else None
    if not isinstance(output, LMHead):
        raise ValueError(f"{type(model).__name__} has no sohsm head: give it one with "
                         "sohsm.hf.use_head(model, name, counts=..., **options)")
    return output.head


# -- use_head's parts ------------------------------------------------------------------------------
def _output_embedding(model: nn.Module) -> nn.Module:
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"use_head takes a transformers causal language model (a PreTrainedModel such as "
                         f"AutoModelForCausalLM gives), got {type(model).__name__}")
    output = model.get_output_embeddings()
    if output is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) for a head to replace: "
                         "use_head takes a causal language model (AutoModelForCausalLM, *ForCausalLM)")
    if isinstance(output, LMHead):
        raise ValueError(f"{type(model).__name__} has a sohsm head already ({type(output.head).__name__}); "
                         "build the model again to give it another")
    return output


def _checked_counts(counts, n_classes: int, model: nn.Module) -> Tensor | None:
    """``counts`` checked as the heads check them, with the model's sizes named where their number is wrong."""
    if counts is None:
        return None
    try:
        size = torch.as_tensor(counts).numel()
    except (TypeError, ValueError, RuntimeError):
        size = None  # not numbers: check_counts says so
    if size is not None and size != n_classes:
        raise ValueError(f"counts has {size} entries but the model scores {n_classes} tokens (the rows of its output "
                         f"embedding; config.vocab_size {getattr(model.config, 'vocab_size', None)}): give one count "
                         "per row, 0 for the rows no token uses")
    return check_counts(counts, n_classes)


def _saved_counts(counts: Tensor | None) -> Tensor | None:
    """The counts as the model keeps them: integers where they are (``model.half()`` then cannot round them)."""
    if counts is None:
        return None
    return counts.long() if bool((counts == counts.round()).all()) else counts


def _input_embedding(model: PreTrainedModel, name: str, options: Mapping[str, Any], in_features: int,
                     n_classes: int) -> nn.Embedding:
    """The input embedding a tied head shares; refuses a head that cannot be tied, and sizes that differ."""
    reason = tying_refusal(name, in_features, options)
    if reason is not None:
        raise ValueError(f"head {name!r} cannot be tied to the input embedding of {type(model).__name__}, as its "
                         f"config asks (tie_word_embeddings=True): {reason}. Build the model with "
                         "tie_word_embeddings=False for an untied head")
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, nn.Embedding):
        raise ValueError(f"the input embedding of {type(model).__name__} is a {type(embedding).__name__}, not an "
                         "nn.Embedding a head can be tied to; build the model with tie_word_embeddings=False")
    if tuple(embedding.weight.shape) != (n_classes, in_features):
        raise ValueError(f"the input embedding of {type(model).__name__} is {tuple(embedding.weight.shape)} but its "
                         f"output embedding scores {n_classes} tokens from hidden states of {in_features}: "
                         "a tied head needs both the same size")
    return embedding


def _tie(model: PreTrainedModel, head: Head, name: str, embedding: nn.Embedding, keep_weights: bool,
         kept: bool = False) -> None:
    """Tie ``head`` to the model's input ``embedding``, which keeps its weights (``keep_weights``; ``kept``: the head
    holds them already)."""
    if not keep_weights:
        std = float(getattr(model.config, "initializer_range", 0.02))
        lent = tie_embedding(embedding, head, init=lambda vectors: nn.init.normal_(vectors, 0.0, std))
        if isinstance(lent, nn.Embedding):  # keep the model's own module (padding_idx, a scale): share its weight
            _adopt(head, lent.weight, embedding)
            with torch.no_grad():
                embedding.weight.copy_(lent.weight)
        else:
            _replace_embedding(model, embedding, lent)
        return
    lent = head.tied_embedding()
    if isinstance(lent, nn.Embedding):  # the head lends its parameter itself: it takes the embedding's instead
        _adopt(head, lent.weight, embedding)
        return
    try:
        if not kept:
            head.set_word_vectors(embedding.weight.detach())
    except ValueError as error:
        raise ValueError(f"head {name!r} ties through {type(lent).__name__}, whose vectors cannot hold the model's "
                         f"embedding weights ({error}); pass keep_weights=False to tie it with new vectors, or build "
                         "the model with tie_word_embeddings=False") from None
    _replace_embedding(model, embedding, lent)


def _adopt(head: Head, lent: Tensor, embedding: nn.Embedding) -> None:
    """Make the embedding's parameter the head's parameter ``lent`` (the one the head lends), in its place."""
    for path, parameter in head.named_parameters():
        if parameter is lent:
            owner_path, _, attribute = path.rpartition(".")
            setattr(head.get_submodule(owner_path) if owner_path else head, attribute, embedding.weight)
            return
    raise ValueError(f"{type(head).__name__} lends a weight that is none of its parameters")  # pragma: no cover


def _replace_embedding(model: PreTrainedModel, embedding: nn.Embedding, lent: nn.Module) -> None:
    if type(embedding) is not nn.Embedding:
        raise ValueError(f"the input embedding of {type(model).__name__} is a {type(embedding).__name__}, which "
                         "does more than look rows up: it cannot read its vectors through the head; build the "
                         "model with tie_word_embeddings=False")
    model.set_input_embeddings(lent)


def _labels_position(model: nn.Module) -> int | None:
    """Where the model's forward takes ``labels`` as a positional argument, or ``None``."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return None
    for i, parameter in enumerate(parameters):
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            return None
        if parameter.name == "labels":
            return i
    return None


def _declare_tying(model: PreTrainedModel, lm_head: LMHead) -> None:
    """Tell HF which weights are one: the full head's weight is the embedding's when tied, and nothing else.

    ``save_pretrained`` then writes that parameter once (safetensors holds no alias), ``tie_weights`` ties
    nothing else (HF's own rule would make ``lm_head.weight`` the embedding's), and a ``Trainer`` resuming a
    checkpoint ties it again in place of warning that it is missing.
    """
    names = {id(module): name for name, module in model.named_modules()}
    tied = {}
    embedding = model.get_input_embeddings()
    for path, parameter in lm_head.head.named_parameters(remove_duplicate=False):
        if isinstance(embedding, nn.Embedding) and parameter is embedding.weight:
            tied[f"{names[id(lm_head)]}.head.{path}"] = f"{names[id(embedding)]}.weight"
    model._tied_weights_keys = dict(tied)
    if hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = dict(tied)
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    model._keys_to_ignore_on_save = ignored | set(tied)
