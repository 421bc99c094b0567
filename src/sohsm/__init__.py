"""sohsm: the self-organized hierarchical softmax and its baselines for PyTorch.

The output layers ("heads") share one interface, modelled on
:class:`torch.nn.AdaptiveLogSoftmaxWithLoss`::

    head(hidden, target)  -> HeadOutput(output, loss)
    head.log_prob(hidden) -> [B, N] exact, normalised log-probabilities
    head.topk(hidden, k)  -> (values, indices), exact
    head.predict(hidden)  -> indices

Importing it loads the heads alone: training, tasks and data are imported where they are used
(:mod:`sohsm.train`, :mod:`sohsm.tasks`, the ``sohsm`` command), and the tasks register themselves
the first time the training loop looks one up (:mod:`sohsm.train.task`); ``sohsm.TransformerLM``
is imported from :mod:`sohsm.models` on first use.
"""
from sohsm.version import __version__

from sohsm.heads import (  # noqa: E402
    AdaptiveSoftmax,
    BinaryTreeSoftmax,
    ClusterScores,
    DifferentiatedSoftmax,
    FullSoftmax,
    Head,
    HeadOutput,
    ImportanceSamplingSoftmax,
    NCESoftmax,
    PMISoftmax,
    SelfOrganizedSoftmax,
    TreeSoftmax,
    TwoLevelSoftmax,
    build_head,
    head_names,
    head_options,
)

__all__ = [
    "AdaptiveSoftmax",
    "BinaryTreeSoftmax",
    "ClusterScores",
    "DifferentiatedSoftmax",
    "FullSoftmax",
    "Head",
    "HeadOutput",
    "ImportanceSamplingSoftmax",
    "NCESoftmax",
    "PMISoftmax",
    "SelfOrganizedSoftmax",
    "TransformerLM",
    "TreeSoftmax",
    "TwoLevelSoftmax",
    "build_head",
    "head_names",
    "head_options",
    "__version__",
]


def __getattr__(name: str):
    """``sohsm.TransformerLM`` on first use, so that ``import sohsm`` loads the heads alone."""
    if name == "TransformerLM":
        from sohsm.models.transformer_lm import TransformerLM

        return TransformerLM
    raise AttributeError(f"module 'sohsm' has no attribute {name!r}")
