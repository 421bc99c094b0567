"""Rows of a batch laid out in tiles of one cluster each, with static shapes (the sync-free path's layout).

Both implementations of :mod:`sohsm.heads.two_level.ops.grouped` (the torch one and the kernels of
:mod:`sohsm.heads.two_level.ops.triton_kernels`) read the same layout, so it lives here, below both.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class TileMap(NamedTuple):
    """Rows of a batch laid out in tiles of one cluster each, all shapes static.

    Attributes:
        tile_rows: ``[T * block_m]`` row (in the batch's order) at each padded position, ``-1`` for padding.
        tile_cluster: ``[T]`` cluster of each tile; ``n_clusters`` for an unused tile.
        row_position: ``[B]`` padded position of each row (``tile_rows[row_position[i]] == i``); ``None`` where not
            asked for (the Triton kernels store each row's scores by its row index).
        cluster_tile_start: ``[C]`` first tile of each cluster.
        cluster_tiles: ``[C]`` number of tiles of each cluster (0 for a cluster without rows).
    """

    tile_rows: Tensor
    tile_cluster: Tensor
    row_position: Tensor | None
    cluster_tile_start: Tensor
    cluster_tiles: Tensor


def max_tiles(batch: int, n_clusters: int, block_m: int) -> int:
    """Static upper bound on the tiles of a batch: ``ceil(B / block_m) + min(C, B)``."""
    return math.ceil(batch / block_m) + min(n_clusters, batch)


def tile_map(row_cluster: Tensor, n_clusters: int, block_m: int, positions: bool = True) -> TileMap:
    """Sort ``[B]`` rows by cluster on the device and cut each cluster's run into tiles of ``block_m`` rows.

    Some sixteen small ops (a GPU's step is bound by the ops it issues: each is counted by
    ``benchmarks/step_ops.py``); the ranges it reads are made once per size and kept (:func:`_arange`).
    """
    batch, device = row_cluster.numel(), row_cluster.device
    n_tiles = max_tiles(batch, n_clusters, block_m)
    sorted_cluster, order = torch.sort(row_cluster, stable=True)
    counts = torch.zeros(n_clusters, dtype=torch.long, device=device).scatter_add_(0, row_cluster, _ones(batch, device))
    tiles = (counts + (block_m - 1)) // block_m  # [C]
    tile_end = tiles.cumsum(0)
    tile_start = tile_end - tiles
    # a row's padded position: its rank in its cluster (position in the sorted order minus the cluster's first)
    # plus its cluster's first tile times block_m
    shift = torch.add(counts - counts.cumsum(0), tile_start, alpha=block_m)  # [C]
    padded = _arange(batch, device) + shift[sorted_cluster]  # [B], distinct, < n_tiles * block_m
    tile_rows = torch.full((n_tiles * block_m,), -1, dtype=torch.long, device=device).scatter_(0, padded, order)
    row_position = torch.empty_like(padded).scatter_(0, order, padded) if positions else None
    # tile t belongs to the cluster c with tile_end[c - 1] <= t < tile_end[c] (n_clusters past the last)
    tile_cluster = torch.searchsorted(tile_end, _arange(n_tiles, device), right=True)
    return TileMap(tile_rows, tile_cluster, row_position, tile_start, tiles)


_CONSTANTS: dict = {}


def _arange(n: int, device: torch.device) -> Tensor:
    """``torch.arange(n)`` on ``device``, made once (a launch saved a step); traced afresh under ``torch.compile``."""
    return _constant("arange", n, device, lambda: torch.arange(n, device=device))


def _ones(n: int, device: torch.device) -> Tensor:
    return _constant("ones", n, device, lambda: torch.ones(n, dtype=torch.long, device=device))


def _constant(kind: str, n: int, device: torch.device, make) -> Tensor:
    """A tensor kept for the life of the process (a captured CUDA graph may read it: it is never freed), made
    outside inference mode; past :data:`_KEPT` of them (a run has a few sizes) a fresh one each call."""
    if torch.compiler.is_compiling():
        return make()
    key = (kind, n, str(device))
    value = _CONSTANTS.get(key)
    if value is None:
        with torch.inference_mode(False):
            value = make()
        if len(_CONSTANTS) < _KEPT:
            _CONSTANTS[key] = value
    return value


_KEPT = 256
