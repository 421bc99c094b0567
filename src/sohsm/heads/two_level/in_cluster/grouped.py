"""The in-cluster softmax of the two-level heads without host synchronisation (the sync-free path).

The default kernel (:mod:`sohsm.heads.two_level.in_cluster.per_cluster`) groups a batch's rows by cluster
on the host: it reads the cluster counts back (``.tolist()``) and runs one matrix
product per present cluster. On a GPU that is a synchronisation and hundreds of
small launches a step. This path keeps every shape static, so a step runs without
reading anything back and traces whole under ``torch.compile(fullgraph=True)``:

* the rows are sorted by target cluster on the device, and each cluster's run of
  sorted rows is padded to a multiple of ``block_m``, so that every *tile* of
  ``block_m`` rows belongs to one cluster. Tile ``t``'s cluster and rows are
  computed on the device; the number of tiles has the static upper bound
  ``ceil(B / block_m) + min(C, B)`` (one partial tile per present cluster);
* every tile scores its rows against the words of its cluster, at most
  ``width`` of them (the largest cluster the head can hold), so the in-cluster
  logits of the whole batch are one ``[B, width]`` buffer, masked past each
  row's cluster size, and one masked log-softmax normalises them.

Two implementations compute the same thing:

* ``"torch"``: batched matrix products over the tiles (each tile's cluster's
  word vectors gathered into a ``[T, width, d]`` tensor), differentiated by
  autograd. It runs anywhere and is the reference the kernels are tested against;
  it materialises the gathered weights, so it is meant for small sizes and the CPU.
* ``"triton"``: the kernels of :mod:`sohsm.heads.two_level.in_cluster.triton_kernels` (one launch
  forward, two backward, whatever the number of clusters), registered as torch
  custom operators so that they trace. The default on CUDA when Triton is installed
  (a head's ``backend="auto"``, see :func:`choose_backend`).

Under ``torch.autocast`` the products run in the autocast dtype (bf16, fp16) with
float32 accumulation, and the log-softmax is normalised in float32.
"""
from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.in_cluster.tiles import TileMap, max_tiles, tile_map  # noqa: F401  (the tiles are laid out there)

#: implementations of the sync-free in-cluster softmax
BACKENDS = ("torch", "triton")


def tiled_logits(hidden: Tensor, weight: Tensor, row_cluster: Tensor, offsets: Tensor, width: int,
                 block_m: int, max_gathered_rows: int | None = None) -> Tensor:
    """``[B, width]`` scores of each row against the first ``width`` word vectors of its cluster's block.

    The rows are laid out in tiles of one cluster each (:func:`~sohsm.heads.two_level.in_cluster.tiles.tile_map`),
    each tile's word vectors gathered once into a ``[T, width, d]`` tensor, and one batched product scores all
    tiles; columns past a cluster's size hold the next blocks' words (the caller masks them). The ``"torch"``
    backend's forward and the device top-k (:mod:`sohsm.heads.two_level.device_topk`) share it.
    ``max_gathered_rows``: gather at most that many word vectors at a time (tiles in chunks, each
    ``[T', width, d]``), so the gathered copy stays bounded at large vocabularies (``None``: all at once).
    """
    batch, d = hidden.shape
    n_clusters = offsets.numel() - 1
    tiles = tile_map(row_cluster, n_clusters, block_m)
    n_tiles = tiles.tile_cluster.numel()
    padded_hidden = torch.cat([hidden, hidden.new_zeros(1, d)])  # row B: zeros for padding
    rows = torch.where(tiles.tile_rows < 0, batch, tiles.tile_rows)
    hidden_tiles = padded_hidden[rows].view(n_tiles, block_m, d)
    cluster = tiles.tile_cluster.clamp(max=n_clusters - 1)  # an unused tile scores zeros against any cluster
    columns = torch.arange(width, device=weight.device)
    chunk = n_tiles if max_gathered_rows is None else max(1, max_gathered_rows // max(width, 1))
    parts = []
    for first in range(0, n_tiles, chunk):  # a static number of chunks: shapes still follow from B, C, width
        slots = (offsets[cluster[first : first + chunk]][:, None] + columns).clamp(max=weight.size(0) - 1)
        parts.append(torch.bmm(hidden_tiles[first : first + chunk], weight[slots].transpose(1, 2)))  # [T', m, width]
    logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # [T, block_m, width]
    return logits.reshape(n_tiles * block_m, width)[tiles.row_position]  # the batch's order


def in_cluster_log_prob_torch(
    hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_target: Tensor,
    offsets: Tensor, sizes: Tensor, width: int, block_m: int = 16,
) -> Tensor:
    """``log P(w_i | h_i, C(w_i))`` per row by batched products over tiles (the ``"torch"`` backend).

    Args:
        hidden: ``[B, d]`` hidden states of the word softmax.
        weight: ``[N, d]`` word vectors, rows grouped by cluster.
        row_cluster: ``[B]`` cluster of each row's target word.
        row_target: ``[B]`` position of each target word inside its cluster's block.
        offsets: ``[C + 1]`` first row of each cluster's block in ``weight``.
        sizes: ``[C]`` words in each cluster; every size is at most ``width``.
        width: static number of columns of the logits (the largest cluster size the head allows).
        block_m: rows per tile.

    Returns:
        ``[B]`` log-probabilities, float32 or wider; differentiable in ``hidden`` and ``weight``.
    """
    logits = tiled_logits(hidden, weight, row_cluster, offsets, width, block_m)  # [B, width]
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    outside = torch.arange(width, device=logits.device) >= sizes[row_cluster][:, None]
    log_probs = F.log_softmax(logits.masked_fill(outside, float("-inf")), dim=1)
    return log_probs.gather(1, row_target[:, None]).squeeze(1)


def compute_dtype(tensor: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the products run in: the autocast dtype under ``torch.autocast``, else the widest input's."""
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(tensor.dtype, weight.dtype)


def in_cluster_log_prob(
    hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_target: Tensor,
    offsets: Tensor, sizes: Tensor, width: int, backend: str = "torch", block_m: int | None = None,
) -> Tensor:
    """``log P(w_i | h_i, C(w_i))`` per row, sync-free, by ``backend`` (``"torch"`` or ``"triton"``).

    See :func:`in_cluster_log_prob_torch` for the arguments. ``block_m``: rows per tile
    (default 16 for ``"torch"``, 64 for ``"triton"``).
    """
    if backend == "torch":
        return in_cluster_log_prob_torch(hidden, weight, row_cluster, row_target, offsets, sizes, width,
                                         block_m or 16)
    if backend == "triton":
        from sohsm.heads.two_level.in_cluster import triton_kernels

        return triton_kernels.in_cluster_log_prob_triton(
            hidden, weight, row_cluster, row_target, offsets, sizes, width, block_m or 64,
            compute_dtype(hidden, weight))
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


@functools.cache
def triton_available() -> bool:
    """Whether Triton can be imported (it is needed by the ``"triton"`` backend)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


#: the values of a two-level head's ``backend`` option
HEAD_BACKENDS = ("auto", "per_cluster", "grouped_torch", "triton")


def check_backend(value: str) -> str:
    """``value`` if it names a backend of :data:`HEAD_BACKENDS`, else a ``ValueError`` that lists them."""
    if value not in HEAD_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(HEAD_BACKENDS)}, got {value!r}")
    return value


#: why the Triton kernels cannot run, per (device, compute dtype) an eager ``"auto"`` call has tried; ``None``: they run
_triton_problems: dict[tuple[str, torch.dtype], str | None] = {}


def triton_problem(device: torch.device, compute: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run on ``device`` with products in ``compute`` (``None`` when they can).

    Asked once per device and dtype: Triton missing, a dtype its float32 accumulators cannot hold
    (float64), or a tiny forward and backward that fails to compile or launch (no C compiler for
    Triton's launcher; bf16 ``tl.dot`` on a GPU before sm_80).
    """
    key = (str(device), compute)
    if key not in _triton_problems:
        _triton_problems[key] = _find_triton_problem(device, compute)
    return _triton_problems[key]


def _find_triton_problem(device: torch.device, compute: torch.dtype) -> str | None:
    if not triton_available():
        return "Triton is not installed (pip install triton)"
    if compute not in (torch.float32, torch.float16, torch.bfloat16):
        return f"the Triton kernels accumulate in float32 and do not compute in {compute}"
    try:
        run_triton_once(device, compute)
    except Exception as error:  # noqa: BLE001 - whatever stops the kernels is the reason to fall back
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        return f"the Triton kernels failed to run ({type(error).__name__}: {first_line})"
    return None


def run_triton_once(device: torch.device, compute: torch.dtype) -> None:
    """Every Triton kernel once, as a step launches them, on the smallest problem (two rows, one cluster of two
    words): raises what a step would (a kernel that does not compile, a launcher without a C compiler)."""
    from sohsm.heads.two_level.in_cluster import triton_kernels

    with torch.inference_mode(False), torch.enable_grad():
        hidden = torch.ones(2, 16, device=device, requires_grad=True)
        weight = torch.ones(2, 16, device=device, requires_grad=True)
        zeros = torch.zeros(2, dtype=torch.long, device=device)
        offsets, sizes = torch.tensor([0, 2], device=device), torch.tensor([2], device=device)
        out = triton_kernels.in_cluster_log_prob_triton(hidden, weight, zeros, zeros, offsets, sizes, 2, 64, compute)
        out.sum().backward()


def _fall_back(device: torch.device, reason: str, fallback: str | None) -> str | None:
    """``fallback`` (``None``: the per-cluster kernel), after one warning per device and reason saying why."""
    key = (device.type, reason)
    if key not in _warned:
        _warned.add(key)
        instead = "the per-cluster kernel (one host read a step)" if fallback is None else f"the {fallback!r} backend"
        warnings.warn(f"backend='auto' on {device.type}: {reason}; {instead} runs instead", RuntimeWarning,
                      stacklevel=4)
    return fallback


_warned: set[tuple[str, str]] = set()


def choose_backend(head, device: torch.device, compute: torch.dtype | None = None) -> str | None:
    """The sync-free implementation ``head`` uses on ``device`` (``"torch"`` or ``"triton"``), or ``None`` for the
    per-cluster kernel, by ``head.backend``.

    ``"auto"`` takes Triton on CUDA where its kernels run with products in ``compute`` (default: the head's
    weight dtype), else the per-cluster kernel (the faster on the CPU), saying once why Triton did not run.

    Raises:
        ValueError: ``backend="triton"`` without Triton, or on a device its compiled kernels do not run on.
    """
    device = torch.device(device)
    option = head.backend
    if option == "auto":
        return _auto_backend(head, device, head.weight.dtype if compute is None else compute)
    if option == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs Triton (pip install triton); backend='auto' runs without it")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend='triton' runs on CUDA devices, not on {device.type} (TRITON_INTERPRET=1 runs the kernels on the CPU, slowly, for "
                             "tests); backend='auto' picks the per-cluster kernel there")
    return {"per_cluster": None, "grouped_torch": "torch", "triton": "triton"}[option]


def _auto_backend(head, device: torch.device, compute: torch.dtype) -> str | None:
    if getattr(head, "q_clusters", None) is not None:  # compact statistics are folded in by the per-cluster path only
        return None
    if device.type != "cuda":
        return None
    if torch.compiler.is_compiling():  # no probe while tracing: what an eager call found out, else the kernels
        return "triton" if _triton_problems.get((str(device), compute)) is None else None
    problem = triton_problem(device, compute)
    return "triton" if problem is None else _fall_back(device, problem, None)


def score(head, cluster_logits: Tensor, hidden_w: Tensor, target: Tensor, backend: str):
    """The sync-free counterpart of ``TwoLevelSoftmax._score``: ``(cluster log-probs, cluster part, word part)``.

    Reads no value back to the host. Under ``torch.compile`` the head's layout is
    taken as it was last derived (a direct write into ``head.assignment`` is noticed
    by the next eager call, not inside a compiled step).
    """
    layout = head._layout_cache if torch.compiler.is_compiling() else head._layout
    if head._grad.dirty is not None:  # autograd, not the head, writes weight.grad here: forget what it wrote
        head._grad.invalidate()
    logits = cluster_logits.float() if cluster_logits.dtype in (torch.float16, torch.bfloat16) else cluster_logits
    if layout.empty_clusters is not None:
        logits = logits.masked_fill(layout.empty_clusters, float("-inf"))
    cluster_log_probs = F.log_softmax(logits, dim=1)  # [B, C]
    target_cluster = head.assignment[target]
    cluster_part = cluster_log_probs.gather(1, target_cluster[:, None]).squeeze(1)
    word_part = in_cluster_log_prob(
        hidden_w, head._word_weight(), target_cluster, layout.position_of_word[target], layout.offsets_t,
        layout.sizes_t, head._sync_free_width(), backend,
    )
    if head.training:
        head._observe_sync_free(target, cluster_log_probs.detach())
    return cluster_log_probs, cluster_part, word_part
