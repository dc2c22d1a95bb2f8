"""The Transition's Triton kernels: the fused forward (LayerNorm, SwiGLU over hidden chunks, the
output projection), the dx kernel (with the LayerNorm parameter gradients) and the weight
gradients' recompute kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import (
    cast,
    layernorm_backward,
    layernorm_params,
    layernorm_prologue,
    layernorm_prologue_saved,
    mma,
    row_block,
    store_swiglu_grads,
    swiglu_chunk,
    swiglu_chunk_bwd,
    swiglu_chunk_input_grad,
    swiglu_chunk_weights,
)


@triton.jit
def _transition_fwd_kernel(
    X,
    NORM_W,
    NORM_B,
    WA,
    WB,
    WO,
    Y,
    MEAN,
    RSTD,
    n_rows,
    n_ch,
    n_hidden,
    eps,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]

    x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    xn, _, mean, rstd = layernorm_prologue(x, norm_w, norm_b, col_mask, n_ch, eps, PRECISION)

    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, x.dtype, PRECISION)
        acc = mma(swiglu_chunk(xn, wa, wb, zeros_h, PRECISION), wo, acc, PRECISION)
    tl.store(Y + rows[:, None] * n_ch + cols[None, :], cast(acc, Y.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _transition_bwd_dx_kernel(
    X,
    DY,
    NORM_W,
    NORM_B,
    WA,
    WB,
    WO,
    MEAN,
    RSTD,
    DX,
    DNORM_W_PART,
    DNORM_B_PART,
    D_AB,
    HIDDEN,
    XN,
    n_rows,
    n_ch,
    n_hidden,
    STORE_FOR_WEIGHTS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]

    x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    xn, xhat, rstd = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION)
    dy = tl.load(DY + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    if STORE_FOR_WEIGHTS:
        tl.store(XN + rows[:, None] * n_ch + cols[None, :], xn, mask=tile_mask)

    d_xn = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, x.dtype, PRECISION)
        d_xn, hidden, d_a, d_b = swiglu_chunk_input_grad(xn, dy, wa, wb, wo, d_xn, zeros_h, PRECISION)
        if STORE_FOR_WEIGHTS:
            store_swiglu_grads(D_AB, HIDDEN, d_a, d_b, hidden, rows, row_mask, hids, n_hidden, PRECISION)

    dx = layernorm_backward(d_xn, xhat, rstd, norm_w, cols, col_mask, n_ch, DNORM_W_PART, DNORM_B_PART, pid)
    tl.store(DX + rows[:, None] * n_ch + cols[None, :], cast(dx, DX.dtype.element_ty, PRECISION), mask=tile_mask)


@triton.jit
def _transition_bwd_dw_kernel(
    X,
    DY,
    NORM_W,
    NORM_B,
    WA,
    WB,
    WO,
    MEAN,
    RSTD,
    DWA_PART,
    DWB_PART,
    DWO_PART,
    n_rows,
    n_ch,
    n_hidden,
    n_splits,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Partial weight gradients of one hidden chunk over row tiles pid_s, pid_s + n_splits, ..."""
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    hids = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    col_mask = cols < n_ch
    w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, X.dtype.element_ty, PRECISION)

    # accumulated as [BLOCK_H, BLOCK_C]; d_wo is stored transposed into WO's [C, n_hidden]
    d_wa = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wb = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wo = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        tile_mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
        xn, _, _ = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION)
        # padded rows have dy = 0, hence zero d_a, d_b and no contribution to d_wo
        dy = tl.load(DY + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
        hidden, d_a, d_b = swiglu_chunk_bwd(xn, dy, wa, wb, wo, zeros_h, PRECISION)
        d_wa = mma(tl.trans(cast(d_a, x.dtype, PRECISION)), xn, d_wa, PRECISION)
        d_wb = mma(tl.trans(cast(d_b, x.dtype, PRECISION)), xn, d_wb, PRECISION)
        d_wo = mma(tl.trans(cast(hidden, x.dtype, PRECISION)), dy, d_wo, PRECISION)
    part = pid_s * n_hidden * n_ch
    tl.store(DWA_PART + part + hids[:, None] * n_ch + cols[None, :], d_wa, mask=w_mask)
    tl.store(DWB_PART + part + hids[:, None] * n_ch + cols[None, :], d_wb, mask=w_mask)
    tl.store(DWO_PART + part + cols[None, :] * n_hidden + hids[:, None], d_wo, mask=w_mask)
