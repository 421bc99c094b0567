"""Triton kernels of the sync-free in-cluster softmax, registered as torch custom operators.

The rows of a batch are laid out in tiles of one cluster each (:func:`sohsm.heads.two_level.ops.tiles.tile_map`);
each kernel is one launch over all tiles or all clusters, whatever their number:

* ``sohsm::grouped_forward`` (grid: tiles): a tile's rows against its cluster's
  word vectors, ``block_n`` words at a time, with an online log-sum-exp and the
  target's logit picked on the way. Writes the row's log-probability, its
  log-sum-exp and its logits (``[B, width]`` float32, kept for the backward).
* ``sohsm::grouped_grad_hidden`` (grid: tiles x column blocks of ``d``):
  ``grad_h = grad_logits @ W_c``.
* ``sohsm::grouped_grad_weight`` (grid: clusters x word blocks x column blocks of
  ``d``): ``grad_W_c = sum over the cluster's tiles of grad_logits^T @ h``. Every
  row of the ``[N, d]`` gradient is written once (zeros for a cluster without
  rows), so no buffer is cleared first and no atomics are needed.

Products take their operands in the compute dtype (bf16 / fp16 under autocast,
else the inputs' dtype) and accumulate in float32; the log-softmax runs in float32.
The operators have fake implementations, so ``torch.compile`` traces through them.
On the CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``), which
the tests use.
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from sohsm.heads.two_level.ops.tiles import tile_map

#: compute dtypes of the kernels (their accumulators are float32, so float64 inputs are refused)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _tl_dtype(name: str):
    return {"float32": tl.float32, "float16": tl.float16, "bfloat16": tl.bfloat16}[name]


@triton.jit
def _operand(x, COMPUTE: tl.constexpr, EMULATE: tl.constexpr):
    """``x`` rounded to the compute dtype, as ``tl.dot`` takes it.

    Under Triton's interpreter (``EMULATE``) the result stays float32 holding the rounded
    values: the interpreter (Triton 3.9) multiplies bf16 operands wrongly and converts to
    bf16 by truncation, so bf16 is rounded here to nearest-even on the bits, as the GPU
    converts. The products are the same (a product of two bf16 or fp16 numbers is exact in
    float32), accumulated in float32 as on the GPU.
    """
    if EMULATE:
        if COMPUTE == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(COMPUTE).to(tl.float32)
    else:
        return x.to(COMPUTE)


@triton.jit
def _tile_rows(tile_rows_ptr, t, BLOCK_M: tl.constexpr):
    """Tile ``t``'s rows in the batch and which of them are real: ``(rows, row_ok)``; padding reads row 0."""
    rows = tl.load(tile_rows_ptr + t * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = rows >= 0
    return tl.where(row_ok, rows, 0), row_ok


@triton.jit
def _tile_block(tile_cluster_ptr, offsets_ptr, sizes_ptr, t, N_CLUSTERS):
    """Tile ``t``'s cluster's block of word rows: ``(start, n)``; an unused tile has ``n = 0``."""
    c = tl.load(tile_cluster_ptr + t)
    c_ok = c < N_CLUSTERS
    c = tl.where(c_ok, c, 0)
    return tl.load(offsets_ptr + c), tl.where(c_ok, tl.load(sizes_ptr + c), 0)


@triton.jit
def _forward_kernel(
    h_ptr, w_ptr, tile_rows_ptr, tile_cluster_ptr, offsets_ptr, sizes_ptr, target_ptr,
    out_ptr, lse_ptr, logits_ptr,
    D, WIDTH, N_CLUSTERS, stride_h, stride_w, stride_l,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPUTE: tl.constexpr, EMULATE: tl.constexpr, PRECISION: tl.constexpr,
):
    t = tl.program_id(0)
    rows, row_ok = _tile_rows(tile_rows_ptr, t, BLOCK_M)
    start, n = _tile_block(tile_cluster_ptr, offsets_ptr, sizes_ptr, t, N_CLUSTERS)
    target = tl.load(target_ptr + rows, mask=row_ok, other=-1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    t_i = tl.zeros([BLOCK_M], tl.float32)
    for j0 in range(0, n, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < D
            h = tl.load(h_ptr + rows[:, None] * stride_h + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + (start + cols)[None, :] * stride_w + ks[:, None],
                        mask=col_ok[None, :] & k_ok[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
            h, w = _operand(h, COMPUTE, EMULATE), _operand(w, COMPUTE, EMULATE)
            acc = tl.dot(h, w, acc, input_precision=PRECISION)
        acc = tl.where(col_ok[None, :], acc, float("-inf"))
        tl.store(logits_ptr + rows[:, None] * stride_l + cols[None, :], acc,
                 mask=row_ok[:, None] & (cols < WIDTH)[None, :])
        m_new = tl.maximum(m_i, tl.max(acc, 1))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(acc - m_new[:, None]), 1)
        m_i = m_new
        t_i += tl.sum(tl.where(cols[None, :] == target[:, None], acc, 0.0), 1)
    lse = m_i + tl.log(tl.where(row_ok, l_i, 1.0))  # padding rows of an unused tile have no words
    tl.store(out_ptr + rows, t_i - lse, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _grad_hidden_kernel(
    g_ptr, w_ptr, tile_rows_ptr, tile_cluster_ptr, offsets_ptr, sizes_ptr, out_ptr,
    D, N_CLUSTERS, stride_g, stride_w, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr, EMULATE: tl.constexpr, PRECISION: tl.constexpr,
):
    t = tl.program_id(0)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = ds < D
    rows, row_ok = _tile_rows(tile_rows_ptr, t, BLOCK_M)
    start, n = _tile_block(tile_cluster_ptr, offsets_ptr, sizes_ptr, t, N_CLUSTERS)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for j0 in range(0, n, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        g = tl.load(g_ptr + rows[:, None] * stride_g + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0)
        w = tl.load(w_ptr + (start + cols)[:, None] * stride_w + ds[None, :], mask=col_ok[:, None] & d_ok[None, :],
                    other=0.0)
        g, w = _operand(g, COMPUTE, EMULATE), _operand(w, COMPUTE, EMULATE)
        acc = tl.dot(g, w, acc, input_precision=PRECISION)
    tl.store(out_ptr + rows[:, None] * stride_o + ds[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _grad_weight_kernel(
    g_ptr, h_ptr, tile_rows_ptr, tile_start_ptr, tiles_ptr, offsets_ptr, sizes_ptr, out_ptr,
    D, stride_g, stride_h, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr, EMULATE: tl.constexpr, PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ds = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = ds < D
    start = tl.load(offsets_ptr + c)
    n = tl.load(sizes_ptr + c)
    col_ok = cols < n
    first = tl.load(tile_start_ptr + c)
    n_tiles = tl.where(tl.program_id(1) * BLOCK_N < n, tl.load(tiles_ptr + c), 0)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for i in range(0, n_tiles):
        rows, row_ok = _tile_rows(tile_rows_ptr, first + i, BLOCK_M)
        g = tl.load(g_ptr + rows[None, :] * stride_g + cols[:, None], mask=row_ok[None, :] & col_ok[:, None],
                    other=0.0)  # [BLOCK_N, BLOCK_M]: grad_logits transposed
        h = tl.load(h_ptr + rows[:, None] * stride_h + ds[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
        g, h = _operand(g, COMPUTE, EMULATE), _operand(h, COMPUTE, EMULATE)
        acc = tl.dot(g, h, acc, input_precision=PRECISION)
    tl.store(out_ptr + (start + cols)[:, None] * stride_o + ds[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=col_ok[:, None] & d_ok[None, :])


def launch_device(device: torch.device):
    """A context in which the kernels launch on ``device``: Triton launches on the *current* CUDA device, not on
    the tensors', so a head on ``cuda:1`` (with ``cuda:0`` current) would run on the wrong GPU without it."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _precision(compute: str) -> str:
    # fp32 products as torch computes them by default (no TF32), unless torch is told otherwise
    if compute == "float32" and torch.backends.cuda.matmul.allow_tf32 and not _interpreted():
        return "tf32"
    return "ieee"


def _blocks(compute: str) -> tuple[int, int]:
    """``(block_n, block_k)``: tensor-core tiles in half precision, smaller ones in float32."""
    return (64, 64) if compute in ("bfloat16", "float16") else (32, 32)


@torch.library.custom_op("sohsm::grouped_forward", mutates_args=())
def grouped_forward(
    hidden: Tensor, weight: Tensor, tile_rows: Tensor, tile_cluster: Tensor, offsets: Tensor, sizes: Tensor,
    row_target: Tensor, width: int, block_m: int, compute: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(log-prob [B], log-sum-exp [B], logits [B, width])`` of every row in its cluster (float32; ``-inf`` past the
    cluster's words)."""
    batch, d = hidden.shape
    hidden, weight = hidden.contiguous(), weight.contiguous()
    out = hidden.new_empty(batch, dtype=torch.float32)
    lse = hidden.new_empty(batch, dtype=torch.float32)
    logits = hidden.new_full((batch, width), float("-inf"), dtype=torch.float32)  # past a cluster's words: p = 0
    n_tiles = tile_cluster.numel()
    if n_tiles:
        block_n, block_k = _blocks(compute)
        with launch_device(hidden.device):
            _forward_kernel[(n_tiles,)](
                hidden, weight, tile_rows, tile_cluster, offsets, sizes, row_target, out, lse, logits,
                d, width, sizes.numel(), hidden.stride(0), weight.stride(0), logits.stride(0),
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, COMPUTE=_tl_dtype(compute),
                EMULATE=_interpreted(), PRECISION=_precision(compute),
            )
    return out, lse, logits


@grouped_forward.register_fake
def _(hidden, weight, tile_rows, tile_cluster, offsets, sizes, row_target, width, block_m, compute):
    batch = hidden.size(0)
    return (hidden.new_empty(batch, dtype=torch.float32), hidden.new_empty(batch, dtype=torch.float32),
            hidden.new_empty(batch, width, dtype=torch.float32))


@torch.library.custom_op("sohsm::grouped_grad_hidden", mutates_args=())
def grouped_grad_hidden(
    grad_logits: Tensor, weight: Tensor, tile_rows: Tensor, tile_cluster: Tensor, offsets: Tensor, sizes: Tensor,
    block_m: int, compute: str, out_dtype: torch.dtype,
) -> Tensor:
    """``[B, d]`` gradient of the hidden states: each row's ``grad_logits`` times its cluster's word vectors."""
    weight = weight.contiguous()
    batch, d = grad_logits.size(0), weight.size(1)
    out = grad_logits.new_empty(batch, d, dtype=out_dtype)
    n_tiles = tile_cluster.numel()
    if n_tiles:
        block_n, block_d = _blocks(compute)
        grid = (n_tiles, triton.cdiv(d, block_d))
        with launch_device(grad_logits.device):
            _grad_hidden_kernel[grid](
                grad_logits, weight, tile_rows, tile_cluster, offsets, sizes, out,
                d, sizes.numel(), grad_logits.stride(0), weight.stride(0), out.stride(0),
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, COMPUTE=_tl_dtype(compute),
                EMULATE=_interpreted(), PRECISION=_precision(compute),
            )
    return out


@grouped_grad_hidden.register_fake
def _(grad_logits, weight, tile_rows, tile_cluster, offsets, sizes, block_m, compute, out_dtype):
    return grad_logits.new_empty(grad_logits.size(0), weight.size(1), dtype=out_dtype)


@torch.library.custom_op("sohsm::grouped_grad_weight", mutates_args=())
def grouped_grad_weight(
    grad_logits: Tensor, hidden: Tensor, tile_rows: Tensor, cluster_tile_start: Tensor, cluster_tiles: Tensor,
    offsets: Tensor, sizes: Tensor, n_words: int, block_m: int, compute: str, out_dtype: torch.dtype,
) -> Tensor:
    """``[N, d]`` gradient of the word vectors; every row written (zeros for clusters without rows)."""
    hidden = hidden.contiguous()
    d, width = hidden.size(1), grad_logits.size(1)
    out = hidden.new_empty(n_words, d, dtype=out_dtype)
    n_clusters = sizes.numel()
    block_n, block_d = _blocks(compute)
    grid = (n_clusters, triton.cdiv(width, block_n), triton.cdiv(d, block_d))
    with launch_device(hidden.device):
        _grad_weight_kernel[grid](
            grad_logits, hidden, tile_rows, cluster_tile_start, cluster_tiles, offsets, sizes, out,
            d, grad_logits.stride(0), hidden.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, COMPUTE=_tl_dtype(compute),
            EMULATE=_interpreted(), PRECISION=_precision(compute),
        )
    return out


@grouped_grad_weight.register_fake
def _(grad_logits, hidden, tile_rows, cluster_tile_start, cluster_tiles, offsets, sizes, n_words, block_m, compute,
      out_dtype):
    return hidden.new_empty(n_words, hidden.size(1), dtype=out_dtype)


class _GroupedInCluster(torch.autograd.Function):
    """Autograd of the kernels: the softmax gradient is formed once for the batch, in float32."""

    @staticmethod
    def forward(ctx, hidden, weight, row_cluster, row_target, offsets, sizes, width, block_m, compute):
        tiles = tile_map(row_cluster, sizes.numel(), block_m, positions=False)
        out, lse, logits = grouped_forward(hidden, weight, tiles.tile_rows, tiles.tile_cluster, offsets, sizes,
                                           row_target, width, block_m, compute)
        ctx.save_for_backward(hidden, weight, row_cluster, row_target, offsets, sizes, lse, logits, *tiles)
        ctx.block_m, ctx.compute = block_m, compute
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, row_cluster, row_target, offsets, sizes, lse, logits, *tiles = ctx.saved_tensors
        tile_rows, tile_cluster, _, cluster_tile_start, cluster_tiles = tiles
        # g (onehot - p): the logits past a row's cluster are -inf (grouped_forward), so their p is 0
        g = grad_out.float()[:, None]
        grad_logits = (logits - lse[:, None]).exp().mul_(-g).scatter_add_(1, row_target[:, None], g)  # [B, width]
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = grouped_grad_hidden(grad_logits, weight, tile_rows, tile_cluster, offsets, sizes,
                                              ctx.block_m, ctx.compute, hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = grouped_grad_weight(grad_logits, hidden, tile_rows, cluster_tile_start, cluster_tiles,
                                              offsets, sizes, weight.size(0), ctx.block_m, ctx.compute, weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def in_cluster_log_prob_triton(
    hidden: Tensor, weight: Tensor, row_cluster: Tensor, row_target: Tensor, offsets: Tensor, sizes: Tensor,
    width: int, block_m: int, compute: torch.dtype,
) -> Tensor:
    """``[B]`` in-cluster log-probabilities by the Triton kernels.

    See :func:`sohsm.heads.two_level.ops.grouped.in_cluster_log_prob`; ``compute``: the dtype of the products' operands.
    """
    names = {v: k for k, v in _DTYPES.items()}
    if compute not in names:
        raise ValueError(f"the Triton kernels compute in one of {sorted(names.values())} (float32 accumulators), "
                         f"got {compute}; use the 'torch' backend for float64")
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16 (tl.dot's smallest tile), got {block_m}")
    return _GroupedInCluster.apply(hidden, weight, row_cluster, row_target, offsets, sizes, width, block_m,
                                   names[compute])
