"""sohsm: the self-organized hierarchical softmax and its baselines for PyTorch.

The output layers ("heads") share one interface, modelled on
:class:`torch.nn.AdaptiveLogSoftmaxWithLoss`::

    head(hidden, target)  -> HeadOutput(output, loss)
    head.log_prob(hidden) -> [B, N] exact, normalised log-probabilities
    head.topk(hidden, k)  -> (values, indices), exact
    head.predict(hidden)  -> indices

Importing it loads nothing heavy (no torch), so that the ``sohsm`` command starts at once: the names
below come from :mod:`sohsm.heads` on first use (``sohsm.build_head``, ``from sohsm import FullSoftmax``),
``sohsm.TransformerLM`` from :mod:`sohsm.models`. Training, tasks and data are imported where they are used
(:mod:`sohsm.train`, :mod:`sohsm.tasks`, the ``sohsm`` command), and the tasks register themselves the first
time the training loop looks one up (:mod:`sohsm.train.task`).
"""
from sohsm.version import __version__ as __version__  # exported (the alias says so to the linter)

#: the names the package gives from :mod:`sohsm.heads`, imported on first use
HEAD_NAMES = (
    "AdaptiveSoftmax",
    "BinaryTreeSoftmax",
    "ClusterScores",
    "DifferentiatedSoftmax",
    "FullSoftmax",
    "Head",
    "HeadInputError",
    "HeadOutput",
    "HeadSpec",
    "ImportanceSamplingSoftmax",
    "NCESoftmax",
    "PMISoftmax",
    "Reclustering",
    "SelfOrganizedSoftmax",
    "TreeSoftmax",
    "TwoLevelSoftmax",
    "build_head",
    "head_names",
    "head_options",
)

__all__ = sorted([*HEAD_NAMES, "TransformerLM", "__version__"])


def __getattr__(name: str):
    """The heads' names and ``sohsm.TransformerLM`` on first use, so that ``import sohsm`` imports no torch."""
    if name in HEAD_NAMES:
        import sohsm.heads

        value = getattr(sohsm.heads, name)
    elif name == "TransformerLM":
        from sohsm.models.transformer_lm import TransformerLM as value
    else:
        raise AttributeError(f"module 'sohsm' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
