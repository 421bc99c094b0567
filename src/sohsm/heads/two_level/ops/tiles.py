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
        row_position: ``[B]`` padded position of each row (``tile_rows[row_position[i]] == i``).
        cluster_tile_start: ``[C]`` first tile of each cluster.
        cluster_tiles: ``[C]`` number of tiles of each cluster (0 for a cluster without rows).
    """

    tile_rows: Tensor
    tile_cluster: Tensor
    row_position: Tensor
    cluster_tile_start: Tensor
    cluster_tiles: Tensor


def max_tiles(batch: int, n_clusters: int, block_m: int) -> int:
    """Static upper bound on the tiles of a batch: ``ceil(B / block_m) + min(C, B)``."""
    return math.ceil(batch / block_m) + min(n_clusters, batch)


def tile_map(row_cluster: Tensor, n_clusters: int, block_m: int) -> TileMap:
    """Sort ``[B]`` rows by cluster on the device and cut each cluster's run into tiles of ``block_m`` rows."""
    batch, device = row_cluster.numel(), row_cluster.device
    n_tiles = max_tiles(batch, n_clusters, block_m)
    counts = torch.zeros(n_clusters, dtype=torch.long, device=device)
    counts.scatter_add_(0, row_cluster, torch.ones_like(row_cluster))
    tiles = (counts + (block_m - 1)) // block_m  # [C]
    tile_end = tiles.cumsum(0)
    tile_start = tile_end - tiles
    row_start = counts.cumsum(0) - counts  # first sorted row of each cluster
    sorted_cluster, order = torch.sort(row_cluster, stable=True)
    rank = torch.arange(batch, device=device) - row_start[sorted_cluster]  # rank of a row in its cluster
    padded = tile_start[sorted_cluster] * block_m + rank  # [B], distinct, < n_tiles * block_m
    tile_rows = torch.full((n_tiles * block_m,), -1, dtype=torch.long, device=device)
    tile_rows.scatter_(0, padded, order)
    row_position = torch.empty_like(padded).scatter_(0, order, padded)
    # tile t belongs to the cluster c with tile_end[c - 1] <= t < tile_end[c] (n_clusters past the last)
    tile_cluster = torch.searchsorted(tile_end, torch.arange(n_tiles, device=device), right=True)
    return TileMap(tile_rows, tile_cluster, row_position, tile_start, tiles)
