"""The interface every output layer implements, and the input checks they share.

The values a head is given are checked in :mod:`sohsm.heads.checks`, and what it returns is declared in
:mod:`sohsm.heads.outputs`; both are re-exported here, where every head has always imported them.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from sohsm.clustering.hierarchy import assignment_to_hierarchy
from sohsm.heads.checks import HeadInputError, autocast_on, check_counts, check_size, upcast
from sohsm.heads.factory import factory_init
from sohsm.heads.outputs import ClusterScores, HeadMemory, HeadOutput
from sohsm.heads.unbatched import UNBATCHED_METHODS, unbatched

__all__ = ["ClusterScores", "ClusteredHead", "Head", "HeadInputError", "HeadMemory", "HeadOutput", "HierarchicalHead",
           "SelfOrganizingHead", "check_counts", "check_size", "init_word_vectors", "upcast", "word_vector_bound"]


def word_vector_bound(dim: int) -> float:
    """The half-width of :func:`init_word_vectors`' uniform rows of ``dim`` entries: ``dim^-1/2``.

    The one place the scale of an untied head's word vectors is set. Tied, they start as the model's
    embedding does instead (:meth:`Head.tied_vectors`, :func:`sohsm.models.tying.tie_embedding`).
    """
    return dim ** -0.5


def init_word_vectors(weight: Tensor, bias: Tensor | None = None) -> None:
    """``U(-d^-1/2, d^-1/2)`` rows (``nn.Linear``'s scale for ``d`` inputs; :func:`word_vector_bound`) and a zero
    bias: the start of every untied head's word vectors."""
    bound = word_vector_bound(weight.shape[-1])
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.zeros_(bias)


class Head(nn.Module):
    """Base class of all output layers: hidden states in, log-probabilities out.

    A head owns its output weights and computes its own loss; models produce
    hidden states, never logits. Subclasses implement :meth:`forward` and
    :meth:`log_prob`; :meth:`topk` and :meth:`predict` default to the top-k of
    :meth:`log_prob` and are overridden where a head can do better.

    Args:
        in_features: size ``d`` of a hidden state.
        n_classes: vocabulary size ``N``.

    Shape:
        - hidden: ``[B, d]``, or ``[*, d]`` which is flattened to ``[B, d]``; or ``[d]``, unbatched
        - target: ``[B]`` (or ``[*]``) of word ids in ``[0, N)``; ``[]`` with an unbatched ``hidden``
        - unbatched, as torch's ``AdaptiveLogSoftmaxWithLoss``: ``forward``'s output is 0-dim; ``predict`` too, and
          ``log_prob`` is ``[N]``, ``topk`` ``[k]`` (torch's answer for a batch of one, without its row dimension:
          torch 2.13's own take batches only); every subclass's methods, by :meth:`__init_subclass__`
    """

    def __init_subclass__(cls, **kwargs) -> None:
        """Give the subclass's ``UNBATCHED_METHODS`` the unbatched contract (:func:`~sohsm.heads.unbatched.unbatched`):
        its own, and a mixin's that comes before :class:`Head` in its bases (the two-level heads' scoring)."""
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:  # device= and dtype= as torch's modules take them; options by keyword
            cls.__init__ = factory_init(cls, cls.__dict__["__init__"])  # type: ignore[method-assign]  # on purpose
        for name in UNBATCHED_METHODS:
            method = getattr(cls, name, None)
            if inspect.isfunction(method) and not getattr(method, "unbatched", False):
                setattr(cls, name, unbatched(method))

    #: What ``forward``'s ``loss`` is in training mode: ``"nll"`` (the exact mean
    #: negative log-likelihood) or the name of a sampled objective
    #: (``"importance_sampling"``, ``"nce"``, ``"negative_sampling"``).
    objective: str = "nll"

    #: Check that every target is in ``[0, N)``. On the CPU, eagerly, a bad target raises a
    # : :class:`HeadInputError` (a ``ValueError`` and a ``RuntimeError``) naming the bad values. On a GPU, and inside
    # ``torch.compile``, the check runs on
    #: the device without reading anything back (``torch._assert_async``, as torch's own losses
    #: check their targets): a step neither waits for the device nor breaks the graph, and a bad
    #: target raises a ``RuntimeError`` (on CUDA a device-side assert, reported at the next
    #: synchronisation). ``False`` drops the check; an out-of-range target then fails inside an
    #: indexing kernel, or on a GPU may be read out of bounds.
    check_targets: bool = True

    #: The head hands its weight a row-sparse gradient (the ``sparse=True`` option of the tree and
    #: sampled heads): it needs an optimizer that takes one (``SGD``, ``Adagrad``, ``SparseAdam``),
    #: and no fused optimizer step.
    sparse: bool = False

    @property
    def binary_pairs(self) -> str | None:
        """How the training loss splits into independent logistic decisions, one per (row, vector) pair, which
        word2vec's hand-written loop trains without autograd: ``"paths"`` (a binary tree: the nodes on the
        target's path), ``"noise"`` (negative sampling: the target and ``k`` noise words of its own row, no
        bias), or ``None`` (it does not split so)."""
        return None

    def __init__(self, in_features: int, n_classes: int) -> None:
        super().__init__()
        self.in_features = check_size("in_features", in_features, 1)
        self.n_classes = check_size("n_classes", n_classes, 2)

    @property
    def loss_is_nll(self) -> bool:
        """True when ``forward``'s ``loss`` is the exact mean NLL in the current mode.

        Always true for exact heads; for sampled heads only in eval mode (in
        training mode their loss is :attr:`objective`, which has no perplexity).
        """
        return self.objective == "nll" or not self.training

    # -- the interface -----------------------------------------------------------
    def forward(self, hidden: Tensor, target: Tensor) -> HeadOutput:  # pragma: no cover
        raise NotImplementedError

    def log_prob(self, hidden: Tensor) -> Tensor:  # pragma: no cover
        """Exact log-probabilities over the whole vocabulary, ``[B, N]``."""
        raise NotImplementedError

    @unbatched
    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The ``k`` most probable words per row: ``(log-probs, word ids)``, each ``[B, k]``.

        Same as ``log_prob(hidden).topk(k)``.
        """
        k = self._check_k(k)
        return self.log_prob(hidden).topk(k, dim=1)

    @unbatched
    def predict(self, hidden: Tensor) -> Tensor:
        """The most probable word per row, ``[B]``; same as ``log_prob(hidden).argmax(1)``."""
        return self.topk(hidden, 1)[1][:, 0]

    @unbatched
    def sample(self, hidden: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """One word per row, ``[B]``, drawn from ``softmax(log_prob(hidden) / temperature)`` (what ``generate``
        draws; a head with a hierarchy may draw from the same distribution without scoring every word)."""
        probs = (self.log_prob(hidden) / temperature).softmax(dim=1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    # -- what a run needs ------------------------------------------------------------
    @classmethod
    def memory_estimate(cls, in_features: int, n_classes: int, options: dict, rows: int) -> HeadMemory:
        """A lower bound on what a head of this class holds in a training step over ``rows`` hidden states.

        Asked of the class, so a run that cannot fit is refused before anything is allocated. By default
        its ``[N, d]`` word vectors; heads with more (clusters, statistics, full logits) add theirs.
        """
        return HeadMemory(parameters=n_classes * in_features, word_vectors=n_classes * in_features)

    # -- weight tying ---------------------------------------------------------------
    @classmethod
    def tying_refusal(cls, in_features: int, options: dict) -> str | None:
        """Why a head of this class built with ``options`` cannot lend its word vectors to a model as
        its input embedding (:meth:`tied_embedding`), or ``None`` where it can.

        Asked of the class, so a run's config is refused before anything is built. By default a head
        has no word vectors to lend; heads that have them override this and :meth:`tied_embedding`.
        """
        return "it has no word vectors an input embedding can share"

    def embed(self, ids: Tensor) -> Tensor:
        """Words ``ids`` (``[*]``) as input vectors (``[*, d]``), read from this head's word vectors in its own layout:
        what a :class:`~sohsm.heads.tying.HeadEmbedding` lends a tied model. A head without such vectors refuses.

        Raises:
            ValueError: the head has no word vectors to read (:meth:`tying_refusal` says why).
        """
        raise ValueError(f"{type(self).__name__} cannot embed words: {self.tying_refusal(self.in_features, {})}")

    def tied_embedding(self) -> nn.Module:
        """The input embedding (ids ``[*]`` -> ``[*, d]``) that reads this head's word vectors (weight tying).

        Raises:
            ValueError: the head cannot be tied (:meth:`tying_refusal` says why).
        """
        raise ValueError(f"{type(self).__name__} cannot be tied: {self.tying_refusal(self.in_features, {})}")

    #: whether a training step may leave some of its parameters without a gradient (adaptive softmax: the tail
    #: clusters no target falls in), so that data-parallel training must look for unused parameters every step
    skips_parameters: bool = False
    #: whether its log-probabilities are ``log_softmax(h W^T + b)``: a linear layer's weights, given to
    #: :meth:`set_word_vectors`, make it compute exactly what that layer and a softmax computed
    logits_are_linear: bool = False

    def set_word_vectors(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """Make ``weight`` (``[N, d]``, row ``w`` word ``w``'s) this head's output word vectors, and ``bias`` (``[N]``)
        its word biases where it has them: how a model's own output layer is taken over without changing its outputs
        (a full softmax) or its words' vectors (a two-level head's in-cluster vectors).

        Raises:
            ValueError: the head keeps no ``[N, d]`` word vectors (its reason), or the shapes differ.
        """
        raise ValueError(f"{type(self).__name__} keeps no [N, d] word vectors a model's weights could be copied into")

    def _check_word_vectors(self, weight: Tensor) -> None:
        expected = (self.n_classes, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"word vectors of shape {tuple(weight.shape)} for a head of {expected[0]} words x "
                             f"{expected[1]} inputs")

    def tied_vectors(self) -> list[Tensor]:
        """The tensors (or views) whose rows the :meth:`tied_embedding` reads as words' input vectors.

        Tying re-draws them with the model's embedding initialisation (:func:`sohsm.models.tying.tie_embedding`):
        as an input, a word vector's scale sets the first steps' pace (the LSTM embedding's ``U(+-0.1)`` did
        better than this head's ``U(+-d^-1/2)``: docs/results/first-steps.md).
        """
        return []

    def draw_tied_vectors(self, init: Callable[[Tensor], object]) -> None:
        """Re-draw :meth:`tied_vectors` with the model's embedding initialisation ``init`` (in place, no gradient);
        a head whose vectors have structure (zeros outside a band's block) restores it after the draw."""
        for vectors in self.tied_vectors():
            init(vectors)

    def score_parts(self, hidden: Tensor, target: Tensor) -> ClusterScores | None:
        """Cluster and in-cluster log-probabilities of the targets; ``None`` for heads without clusters."""
        return None

    def check_device(self, device: torch.device) -> None:
        """Refuse, before a run writes anything, a device this head's settings cannot compute on (any, by default).

        Raises:
            ValueError: naming the setting and the device.
        """

    # -- a training step replayed from a captured CUDA graph (sohsm.train.step_graph) ----------------
    def set_static(self, static: bool) -> None:
        """Keep what a training step writes outside its own temporaries in the same storage from step to step (a
        captured CUDA graph replays the step on it). A head with state of its own between steps (the self-organized
        head's waiting statistics) keeps it in fixed buffers while ``static``; nothing to do by default."""

    def graph_refusal(self, device: torch.device, compute: torch.dtype | None = None) -> str | None:
        """Why a training step of this head on ``device``, computing in ``compute`` (``None``: its weights' dtype;
        bf16 under bf16 autocast), cannot be captured as a CUDA graph (``None``: it can). A captured step reads
        nothing back to the host and keeps every shape from step to step; a head says so by overriding this (the
        full, adaptive and two-level heads with a sync-free backend do)."""
        return f"the {type(self).__name__} head reads values back to the host in a training step"

    def static_decline(self, rows: int | None = None) -> str | None:
        """Why ``step_graph="auto"`` leaves this head's step over ``rows`` rows eager although it could be captured
        (its static form costs more than a graph saves), or ``None``. ``"on"`` captures it anyway. ``None`` here."""
        return None

    def static_fingerprint(self) -> tuple:
        """What changes when the tensors a training step reads are replaced (a layout made anew by a load): a captured
        step is captured again when it changes; serials, never ``id()``, which a new object may reuse. Parameters,
        gradients and buffers are checked by the caller."""
        return ()

    def step_tensors(self) -> list[Tensor]:
        """Tensors a training step writes besides the parameters, their gradients and the registered buffers (a
        static step's ring of waiting statistics): what a check of a captured step saves and puts back. None here."""
        return []

    def static_rewrites(self) -> int:
        """How many times the tensors a static step reads were rewritten in place (a re-clustering's new layout): a
        replay after one is checked against an eager step. ``0`` here."""
        return 0

    def host_state(self) -> Any:
        """The host-side bookkeeping a training forward changes (what :meth:`replayed` redoes), to be put back by
        :meth:`restore_host_state` after a capture that failed half-way. ``None`` by default."""
        return None

    def restore_host_state(self, state: Any) -> None:
        """Put back what :meth:`host_state` gave."""

    def replayed(self, rows: int) -> None:
        """A training forward of ``rows`` rows ran as part of a replayed graph: redo its host-side bookkeeping (the
        device side was replayed). Nothing to do by default."""

    def attach(self, optimizer: torch.optim.Optimizer):
        """Let the head act after every ``optimizer.step()`` (re-clustering, for instance).

        Heads that need nothing return ``None``; others return the hook handle.
        Call it once after building the optimizer; harmless for every head.

        Raises:
            ValueError: ``optimizer`` is not a ``torch.optim.Optimizer``.
        """
        self._check_optimizer(optimizer, needs_parameters=False)
        return None

    def _check_optimizer(self, optimizer: torch.optim.Optimizer, needs_parameters: bool = True) -> None:
        """Refuse what is not an optimizer, and (``needs_parameters``) one that does not train this head.

        A head that moves optimizer state with its words must see its trainable parameters in
        ``optimizer``: attached to another one (the model's alone, say), it would re-cluster on
        steps that never train it.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"attach needs the torch.optim.Optimizer that trains the head, got "
                             f"{type(optimizer).__name__}")
        if not needs_parameters:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [name for name, p in self.named_parameters() if p.requires_grad and id(p) not in held]
        if missing:
            raise ValueError(f"the optimizer given to attach does not hold the head's parameters "
                             f"{', '.join(missing)}: build it with the head's parameters too, e.g. "
                             "Adagrad([*model.parameters(), *head.parameters()])")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, n_classes={self.n_classes}"

    # -- shared input checks -----------------------------------------------------
    def _flatten_hidden(self, hidden: Tensor) -> Tensor:
        if not isinstance(hidden, Tensor):
            raise HeadInputError(f"hidden must be a tensor, got {type(hidden).__name__}")
        if hidden.dim() < 1 or hidden.size(-1) != self.in_features:
            raise HeadInputError(
                f"hidden must have shape [*, {self.in_features}] (last dimension = "
                f"in_features), got {tuple(hidden.shape)}"
            )
        if not hidden.is_floating_point():
            raise HeadInputError(f"hidden must be a floating-point tensor, got {hidden.dtype}")
        self._check_hidden_dtype(hidden)
        return hidden.reshape(-1, self.in_features)

    def _check_hidden_dtype(self, hidden: Tensor) -> None:
        """Outside autocast, ``hidden`` must have the dtype of the head's weights (``head.double()`` for float64)."""
        if hidden.dtype in (torch.float16, torch.bfloat16) or autocast_on(hidden.device.type):
            return  # low precision: the heads score in their weights' dtype (see precision.py)
        weights = next((p.dtype for p in self.parameters() if p.is_floating_point()), hidden.dtype)
        if hidden.dtype != weights:
            raise HeadInputError(f"hidden must have the dtype of the head's weights, {weights}, got {hidden.dtype}: "
                             f"convert the hidden states (hidden.to({weights})) or the head "
                             f"(head.to({hidden.dtype}))")

    def _check_inputs(self, hidden: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Flatten ``hidden`` to ``[B, d]`` and ``target`` to ``[B]`` and validate both."""
        hidden = self._flatten_hidden(hidden)
        if not isinstance(target, Tensor):
            raise HeadInputError(f"target must be a tensor, got {type(target).__name__}")
        if target.dtype != torch.long:
            raise HeadInputError(f"target must be a long tensor, got {target.dtype}")
        target = target.reshape(-1)
        if target.size(0) != hidden.size(0):
            raise HeadInputError(
                f"hidden and target must have the same number of rows, got "
                f"{hidden.size(0)} hidden rows and {target.size(0)} targets"
            )
        if self.check_targets:
            self._check_target_range(target)
        return hidden, target

    def _check_target_range(self, target: Tensor) -> None:
        """Every target in ``[0, N)``: on the host for eager CPU tensors (a :class:`HeadInputError`, both a
        ``ValueError`` and torch's ``RuntimeError``, with the values seen), else on the device with no read-back (a
        ``RuntimeError``; see :attr:`check_targets`)."""
        outside = (target < 0) | (target >= self.n_classes)
        if target.device.type != "cpu" or torch.compiler.is_compiling():
            torch._assert_async(~outside.any(), f"target values must be in [0, {self.n_classes})")
        elif target.numel() and bool(outside.any()):
            raise HeadInputError(
                f"target values must be in [0, {self.n_classes}), got min "
                f"{int(target.min())} and max {int(target.max())}"
            )

    def _check_k(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.n_classes:
            raise ValueError(f"k must be an integer in [1, {self.n_classes}], got {k!r}")
        return k


# -- what some heads can do besides: declared, so callers ask with isinstance ----------------------------
class HierarchicalHead(Head):
    """A head whose words sit in a hierarchy (clusters, or a tree) that can be exported."""

    def hierarchy(self) -> list:  # pragma: no cover - every subclass has its own
        """The head's structure as nested lists of word ids (a two-level head: one list per cluster)."""
        raise NotImplementedError


class ClusteredHead(HierarchicalHead):
    """A two-level head: every word in one of :attr:`n_clusters` clusters.

    Attributes:
        n_clusters: the number of clusters (some may be empty).
        assignment: ``[N]`` cluster id of every word (a buffer).
    """

    n_clusters: int
    assignment: Tensor

    def clusters(self) -> list[Tensor]:  # pragma: no cover - every subclass has its own
        """Word ids of each cluster (ascending), one tensor per cluster; empty clusters give empty tensors."""
        raise NotImplementedError

    def set_assignment(self, assignment: Tensor, optimizer: torch.optim.Optimizer | None = None) -> Tensor:
        """Move words to the clusters ``assignment``; returns ``[N]`` bool, which words moved."""
        raise NotImplementedError  # pragma: no cover

    def hierarchy(self) -> list:
        return assignment_to_hierarchy(self.assignment)


class SelfOrganizingHead(ClusteredHead):
    """A two-level head that re-learns its clusters while it trains (after optimizer steps, see :meth:`attach`).

    Attributes:
        update_every: K, optimizer steps between re-clusterings (0: never; ``None`` until the first
            step when it follows from the epoch length).
        history: one record per re-clustering (the training loop writes them to ``metrics.jsonl``).
        frozen: the clusters no longer change.
    """

    update_every: int | None
    history: list[dict]

    if TYPE_CHECKING:  # read, never set, through this class (the self-organized head's is a property)
        @property
        def frozen(self) -> bool: ...

    def freeze(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Keep the clusters as they are from now on: no statistics, no re-clustering."""
        raise NotImplementedError  # pragma: no cover

    def reassign(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Re-cluster now from the statistics gathered; returns the history record."""
        raise NotImplementedError  # pragma: no cover

    def describe_schedule(self, tokens_per_step: int | None = None) -> str:
        """How often the head re-clusters, for a run's start-up lines (``"K 43"``); ``tokens_per_step``
        lets a head that chooses K from the epoch length say which K it will choose."""
        return f"K {self.update_every}"
