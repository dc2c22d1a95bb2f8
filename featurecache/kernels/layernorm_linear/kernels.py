"""LayerNormLinear's Triton kernels: the forward (each row tile normalized in registers and fed
to tl.dot), the dx kernel (with the LayerNorm parameter gradients) and the weight gradient's
recompute kernel."""

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
)


@triton.jit
def _layernorm_linear_fwd_kernel(
    X,
    NORM_W,
    NORM_B,
    W,
    BIAS,
    Y,
    MEAN,
    RSTD,
    n_rows,
    n_in,
    n_out,
    stride_y,
    eps,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    N_TILES: tl.constexpr,
):
    """Programs own a row tile and N_TILES output tiles: x is loaded and normalized once per
    program, so with few programs per row tile x is read from memory about once, not once per
    BLOCK_N outputs."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, row_mask = row_block(pid_m, BLOCK_M, n_rows)
    cols_k = tl.arange(0, BLOCK_K)
    k_mask = cols_k < n_in

    # x [BLOCK_M, BLOCK_K]
    x = tl.load(X + rows[:, None] * n_in + cols_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)
    xn, _, mean, rstd = layernorm_prologue(x, norm_w, norm_b, k_mask, n_in, eps, PRECISION)

    first_tile = pid_n * N_TILES
    last_tile = tl.minimum(first_tile + N_TILES, tl.cdiv(n_out, BLOCK_N))
    for tile in range(first_tile, last_tile):
        cols_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = cols_n < n_out
        # W [BLOCK_N, BLOCK_K]
        w = cast(
            tl.load(W + cols_n[:, None] * n_in + cols_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0),
            x.dtype,
            PRECISION,
        )
        acc = mma(xn, tl.trans(w), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), PRECISION)
        if HAS_BIAS:
            acc += tl.load(BIAS + cols_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        _store_output_tile(Y, acc, rows, row_mask, cols_n, stride_y, PRECISION)
    if pid_n == 0:
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _store_output_tile(Y, acc, rows, row_mask, cols_n, stride_y, PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] into y's rows; columns up to the row stride, not n_out: an aligned
    y's padding columns (n_out <= col < stride_y) get acc's zeros (W's padded rows load as 0), so
    the mask is constant over runs of 16 columns (stride_y is a multiple of 16) and the stores
    stay 16-byte vectors; a mask by n_out = 516 (not a multiple of 16) split every store into
    2-byte ones (tests/kernels/test_gpu_compile.py holds this)."""
    tl.store(
        Y + rows[:, None] * stride_y + cols_n[None, :],
        cast(acc, Y.dtype.element_ty, PRECISION),
        mask=row_mask[:, None] & (cols_n < stride_y)[None, :],
    )


@triton.jit
def _load_output_gradient_tile(DY, rows, row_mask, cols_n, n_out, stride_dy, dy_columns):
    """dy [BLOCK_M, BLOCK_N] at columns cols_n, zero from n_out on. Loaded up to dy_columns (the
    row stride when the launcher found dy's row padding inside its storage, else n_out), then
    the padding zeroed: a mask by a multiple of 16 keeps the loads 16-byte vectors, where a mask
    by n_out = 516 splits every one into 2-byte loads."""
    dy = tl.load(
        DY + rows[:, None] * stride_dy + cols_n[None, :],
        mask=row_mask[:, None] & (cols_n < dy_columns)[None, :],
        other=0.0,
    )
    return tl.where((cols_n < n_out)[None, :], dy, 0.0)


@triton.jit
def _layernorm_linear_bwd_dx_kernel(
    X,
    DY,
    NORM_W,
    NORM_B,
    W,
    MEAN,
    RSTD,
    DX,
    DNORM_W_PART,
    DNORM_B_PART,
    XN,
    n_rows,
    n_in,
    n_out,
    stride_dy,
    dy_columns,
    STORE_XN: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """dx and per-program partial LayerNorm weight/bias gradients; one program per row tile.
    With STORE_XN, also LN(x) (affine, in dy's dtype) for a cuBLAS weight gradient."""
    pid_m = tl.program_id(0)
    rows, row_mask = row_block(pid_m, BLOCK_M, n_rows)
    cols_k = tl.arange(0, BLOCK_K)
    k_mask = cols_k < n_in

    x = tl.load(X + rows[:, None] * n_in + cols_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)
    xn, xhat, rstd = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, k_mask, PRECISION)

    # d(normalized input) = dy @ W, accumulated over output-feature tiles
    d_xn = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n_start in range(0, n_out, BLOCK_N):
        cols_n = n_start + tl.arange(0, BLOCK_N)
        n_mask = cols_n < n_out
        dy = _load_output_gradient_tile(DY, rows, row_mask, cols_n, n_out, stride_dy, dy_columns)
        w = cast(
            tl.load(W + cols_n[:, None] * n_in + cols_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0),
            dy.dtype,
            PRECISION,
        )
        d_xn = mma(dy, w, d_xn, PRECISION)

    if STORE_XN:
        tl.store(XN + rows[:, None] * n_in + cols_k[None, :], xn, mask=row_mask[:, None] & k_mask[None, :])
    dx = layernorm_backward(d_xn, xhat, rstd, norm_w, cols_k, k_mask, n_in, DNORM_W_PART, DNORM_B_PART, pid_m)
    tl.store(
        DX + rows[:, None] * n_in + cols_k[None, :],
        cast(dx, DX.dtype.element_ty, PRECISION),
        mask=row_mask[:, None] & k_mask[None, :],
    )


@triton.jit
def _layernorm_linear_bwd_dw_kernel(
    X,
    DY,
    NORM_W,
    NORM_B,
    MEAN,
    RSTD,
    DW_PART,
    DBIAS_PART,
    n_rows,
    n_in,
    n_out,
    stride_dy,
    dy_columns,
    n_splits,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Partial dW = dy^T @ xn over the row tiles pid_s, pid_s + n_splits, ...; xn recomputed."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols_k = tl.arange(0, BLOCK_K)
    cols_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_mask = cols_k < n_in
    n_mask = cols_n < n_out
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)

    dw = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        x = tl.load(X + rows[:, None] * n_in + cols_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        xn, _, _ = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, k_mask, PRECISION)
        # padded rows give xn = norm_b but dy = 0 there, so they add nothing
        dy = _load_output_gradient_tile(DY, rows, row_mask, cols_n, n_out, stride_dy, dy_columns)
        dw = mma(tl.trans(dy), xn, dw, PRECISION)
        dbias += tl.sum(dy.to(tl.float32), axis=0)
    part = pid_s * n_out * n_in
    tl.store(DW_PART + part + cols_n[:, None] * n_in + cols_k[None, :], dw, mask=n_mask[:, None] & k_mask[None, :])
    tl.store(DBIAS_PART + pid_s * n_out + cols_n, dbias, mask=n_mask)
