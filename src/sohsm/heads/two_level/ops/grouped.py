"""The in-cluster softmax of the two-level heads without host synchronisation (the sync-free path).

The per-cluster op (:mod:`sohsm.heads.two_level.ops.per_cluster`) groups a batch's rows by cluster
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
* ``"triton"``: the kernels of :mod:`sohsm.heads.two_level.ops.triton_kernels` (one launch
  forward, two backward, whatever the number of clusters), registered as torch
  custom operators so that they trace. The default on CUDA where its kernels run
  (:mod:`sohsm.heads.two_level.ops.backends`).

Under ``torch.autocast`` the products run in the autocast dtype (bf16, fp16) with
float32 accumulation, and the log-softmax is normalised in float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads.two_level.ops.layout import ClusterLayout
from sohsm.heads.two_level.ops.tiles import TileMap, max_tiles, tile_map  # noqa: F401  (the tiles are laid out there)

#: the two implementations of the tiles (the registry's ``"grouped_torch"`` and ``"triton"`` backends)
IMPLEMENTATIONS = ("torch", "triton")


def tiled_logits(hidden: Tensor, weight: Tensor, row_cluster: Tensor, offsets: Tensor, width: int,
                 block_m: int, max_gathered_rows: int | None = None) -> Tensor:
    """``[B, width]`` scores of each row against the first ``width`` word vectors of its cluster's block.

    The rows are laid out in tiles of one cluster each (:func:`~sohsm.heads.two_level.ops.tiles.tile_map`),
    each tile's word vectors gathered once into a ``[T, width, d]`` tensor, and one batched product scores all
    tiles; columns past a cluster's size hold the next blocks' words (the caller masks them). The ``"torch"``
    backend's forward and the device top-k (:mod:`sohsm.heads.two_level.ops.topk`) share it.
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
        from sohsm.heads.two_level.ops import triton_kernels  # imports Triton: only when asked for

        return triton_kernels.in_cluster_log_prob_triton(
            hidden, weight, row_cluster, row_target, offsets, sizes, width, block_m or 64,
            compute_dtype(hidden, weight))
    raise ValueError(f"backend must be one of {IMPLEMENTATIONS}, got {backend!r}")


def grouped_torch_log_prob(hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                           layout: ClusterLayout, width: int, sink=None) -> Tensor:
    """The ``"grouped_torch"`` backend: :func:`in_cluster_log_prob` by batched torch products (autograd backward)."""
    return in_cluster_log_prob(hidden, weight, row_cluster, row_position, layout.offsets_t, layout.sizes_t, width,
                               "torch")


def triton_log_prob(hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_position: Tensor,
                    layout: ClusterLayout, width: int, sink=None) -> Tensor:
    """The ``"triton"`` backend: :func:`in_cluster_log_prob` by the Triton kernels (autograd backward)."""
    return in_cluster_log_prob(hidden, weight, row_cluster, row_position, layout.offsets_t, layout.sizes_t, width,
                               "triton")
