"""What :func:`sohsm.hf.use_head` keeps of a pretrained model's ``lm_head`` when another head takes its place.

A two-level head keeps the trained layer's rows as its word vectors, starts from clusters of the words the layer
scores alike, and, given ``data``, fits its cluster vectors (and, where its words have fewer dimensions, all it
scores with) to the frozen trained layer (:mod:`sohsm.heads.two_level.takeover`, :mod:`sohsm.hf.fitting`). The
``full`` head takes the layer itself (:func:`sohsm.hf.use_head`). Any other head scores words in a way the layer
cannot be read into: it starts afresh, and a warning says so.
"""
from __future__ import annotations

import logging
import time
import warnings

from torch import Tensor, nn
from transformers import PreTrainedModel

from sohsm.heads import Head, TwoLevelSoftmax
from sohsm.heads.two_level.takeover import keep_output_layer
from sohsm.hf.fitting import FitReport, collect_hidden, fit_to_layer

logger = logging.getLogger("sohsm.hf")

#: the most positions of ``data`` the fit reads (the first ones)
MAX_TOKENS = 16384
#: a self-organized head that takes over a trained layer moves a word at a re-clustering only where another cluster
#: is better for it by this margin: its clusters start fitted, and free moves undo the fit in fine-tuning
#: (docs/results/pretrained.md: fine-tuned with and without re-clustering; chosen on seed 1, seeds 2 and 3 check it)
TAKEOVER_STAY_MARGIN = 3.0


def check_bias(output: nn.Module, name: str, head: Head, model: PreTrainedModel) -> None:
    """Refuse to replace an ``lm_head`` with a bias by a head that has none to keep it in."""
    bias = getattr(output, "bias", None)
    if isinstance(bias, Tensor) and not head.logits_are_linear:
        raise ValueError(f"the lm_head of {type(model).__name__} has a bias, which head {name!r} has no word bias to "
                         "keep: use the 'full' head, or pass keep_weights=False to start the head afresh")


def take_over(model: PreTrainedModel, output: nn.Module, head: Head, name: str, counts: Tensor | None, data,
              fit_seconds: float, progress: bool, tied: bool) -> FitReport | None:
    """Give ``head`` what ``output`` (the model's trained ``lm_head``, still in place) learned; the fit's report
    where ``data`` was given. Warns where the head cannot keep it, and what it loses."""
    started = time.perf_counter()
    assert isinstance(output.weight, Tensor)  # (use_head checked it)
    weight = output.weight.detach()
    n_classes, in_features = weight.shape
    if not isinstance(head, TwoLevelSoftmax):
        warnings.warn(f"head {name!r} cannot keep what the model's lm_head learned: it scores words its own way and "
                      f"starts from its own initialisation, the trained {n_classes} x {in_features} layer is dropped "
                      "(right after the swap the model predicts as an untrained head does); 'full' and the two-level "
                      "heads keep it. Pass keep_weights=False where the model is not pretrained", stacklevel=4)
        return None
    hidden = targets = None
    if data is not None:
        hidden, targets = collect_hidden(model, output, data, n_classes, in_features, MAX_TOKENS)
        hidden = hidden.to(weight.device)
    moment = None if hidden is None else (hidden.T.double() @ hidden.double()) / hidden.size(0)
    lost = keep_output_layer(head, weight, counts, moment)
    if tied and head.band_projections is not None:
        lost.append("tied: the rarer words' input vectors are read through the same fit")
    for line in lost:
        warnings.warn(f"head {name!r} keeps the trained lm_head only in part: {line}", stacklevel=4)
    if head.projection is not None:
        return None
    if hidden is None:
        return None
    joint = not tied and (head.band_projections is not None or head.word_projection is not None)
    report = fit_to_layer(head, weight, hidden, targets, seconds=fit_seconds, joint=joint, progress=progress,
                          started=started)
    logger.info("%s", report)
    return report


def check_fit_options(fit_seconds, data) -> float:
    """``fit_seconds`` checked: a positive number; ``data`` not a string."""
    if isinstance(fit_seconds, bool) or not isinstance(fit_seconds, (int, float)) or not fit_seconds > 0:
        raise ValueError(f"fit_seconds must be a positive number of seconds, got {fit_seconds!r}")
    if isinstance(data, (str, bytes)):
        raise ValueError("data must be batches of input ids or hidden states, not text: tokenize it first")
    return float(fit_seconds)

