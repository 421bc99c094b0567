"""A run's head, built from its config: one builder for every task.

Every run config has a ``head`` section (:class:`~sohsm.train.config.HeadConfig`),
a ``model.hidden_size`` (the head's ``in_features``), a ``seed`` and a
``data.clusters_from``. :func:`build_run_head` turns them and the run's
vocabulary into the head; a hierarchy (``--clusters-from``) gives the ``tree``
head its whole tree and a two-level head its clusters, fixed.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from sohsm.clustering.hierarchy import hierarchy_to_assignment
from sohsm.data.vocab import Vocabulary
from sohsm.heads import ClusteredHead, Head, SelfOrganizingHead, takes_tree
from sohsm.train.config import HeadConfig

__all__ = ["build_run_head", "hierarchy_parts", "saved_clusters", "set_clusters", "takes_tree"]


# What this module reads of a run config (the module docstring), as every task's config declares it.
class _ModelSection(Protocol):
    @property
    def hidden_size(self) -> int: ...


class _DataSection(Protocol):
    @property
    def clusters_from(self) -> str | None: ...


class _HeadOfRun(Protocol):
    @property
    def head(self) -> HeadConfig: ...
    @property
    def seed(self) -> int: ...
    @property
    def model(self) -> _ModelSection: ...


class _ClustersOfRun(Protocol):
    @property
    def head(self) -> HeadConfig: ...
    @property
    def data(self) -> _DataSection: ...


def hierarchy_parts(head_name: str, tree: list, n_words: int) -> tuple[Tensor | None, list | None]:
    """``(clusters, tree)``: what head ``head_name`` takes of a hierarchy over ``n_words`` words.

    The ``tree`` head takes the whole tree; a two-level head the clusters of a two-level hierarchy.
    """
    if takes_tree(head_name):
        return None, tree
    return hierarchy_to_assignment(tree, n_words), None


def saved_clusters(config: _ClustersOfRun, saved_head: Mapping[str, Any]) -> Tensor | None:
    """The fixed clusters a checkpoint's head state holds (a run with ``data.clusters_from``), else ``None``.

    The head is built with that many clusters before its state is loaded. ``config.data`` is a data
    section with ``clusters_from`` (the language model's, the headline task's).
    """
    if not config.data.clusters_from or takes_tree(config.head.name):
        return None
    assignment = saved_head.get("assignment")
    return None if assignment is None else assignment.cpu()


def build_run_head(config: _HeadOfRun, vocab: Vocabulary, *, clusters: Tensor | None = None,
                   tree: list | None = None) -> Head:
    """The head named by ``config.head`` over ``vocab``, with the vocabulary's counts and the run's seed.

    The run's seed goes to heads that take one (the random clusters of the two-level heads) unless
    ``config.head.options`` sets one; a hierarchy's parts become the options the head says
    (:func:`~sohsm.heads.hierarchy_options`).

    Args:
        config: a run config of any task.
        vocab: the words the head scores.
        clusters: ``[N]`` cluster ids the head takes and keeps (a self-organized head is frozen).
        tree: nested lists of word ids, for the ``tree`` head.

    Raises:
        ValueError: the head does not take one of the options (naming it and the
            head's options), or refuses a value, or takes no hierarchy.
    """
    spec = config.head.spec(check=False).for_run(config.seed, tree=tree,
                                                 n_clusters=None if clusters is None else int(clusters.max()) + 1)
    head = spec.build(config.model.hidden_size, len(vocab), counts=torch.from_numpy(vocab.counts.copy()))
    if clusters is not None:
        set_clusters(head, clusters)
    return head


def set_clusters(head: Head, clusters: Tensor) -> None:
    """Give a two-level head the clusters ``clusters``, fixed (a self-organized head stops re-clustering)."""
    if not isinstance(head, ClusteredHead):
        raise ValueError(f"the {type(head).__name__} head has no word clusters to set")
    head.set_assignment(clusters.to(head.assignment.device))
    if isinstance(head, SelfOrganizingHead):
        head.freeze()
