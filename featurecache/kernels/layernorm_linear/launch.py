"""LayerNormLinear's launchers: each allocates the outputs, takes its tiles from the tuned
configurations (runtime.tile_config) and launches; the weight gradient follows WEIGHT_GRADS."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.layernorm_linear.kernels import (
    _layernorm_linear_bwd_dw_kernel,
    _layernorm_linear_bwd_dx_kernel,
    _layernorm_linear_fwd_kernel,
)

OP = "layernorm_linear"


def layernorm_linear_fwd(x2d, norm_weight, norm_bias, weight, bias, eps, aligned_rows=False):
    """x2d [M, K] contiguous -> (y [M, N], mean [M], rstd [M]).

    With aligned_rows, y's rows start every multiple of 16 elements (a view of a wider buffer):
    kernels that read column slices of y as strided q/k/v (EvoAttention) then get 16-divisible
    strides, which Triton needs to vectorize their loads.
    """
    n_rows, n_in = x2d.shape
    n_out = weight.shape[0]
    stride_y = -(-n_out // 16) * 16 if aligned_rows else n_out
    y = torch.empty((n_rows, stride_y), device=x2d.device, dtype=x2d.dtype)[:, :n_out]
    mean = torch.empty(n_rows, device=x2d.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    block_k = runtime.block_for(n_in)
    config, block_m = runtime.tile_config(OP, "fwd", block_k)
    block_n = min(config["BLOCK_N"], runtime.block_for(n_out))
    n_tiles = min(config.get("N_TILES", 1), triton.cdiv(n_out, block_n))
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(triton.cdiv(n_out, block_n), n_tiles))
    _layernorm_linear_fwd_kernel[grid](
        x2d,
        norm_weight,
        norm_bias,
        weight,
        bias if bias is not None else weight,
        y,
        mean,
        rstd,
        n_rows,
        n_in,
        n_out,
        stride_y,
        eps,
        HAS_BIAS=bias is not None,
        PRECISION=runtime.dot_precision(x2d.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        N_TILES=n_tiles,
        **runtime.launch_options(config),
    )
    return y, mean, rstd


def layernorm_linear_bwd(dy, x2d, norm_weight, norm_bias, weight, mean, rstd, has_bias):
    """Gradients (dx, d_norm_weight, d_norm_bias, d_weight, d_bias or None).

    dy [M, N] may have any row stride (a view of a wider, aligned gradient buffer) if its
    columns are contiguous."""
    n_rows, n_in = x2d.shape
    n_out = weight.shape[0]
    precision = runtime.dot_precision(x2d.dtype)
    block_k = runtime.block_for(n_in)
    dy_columns = runtime.readable_row_width(dy)

    matmul_weights = runtime.weight_grads_by_matmul(OP)
    xn = torch.empty_like(x2d) if matmul_weights else x2d  # x2d: a placeholder the kernel never writes

    config, block_m = runtime.tile_config(OP, "bwd_dx", block_k)
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x2d)
    # the LayerNorm's weight and bias partial sums, halves of one buffer: one reduction for both
    dnorm_parts = torch.empty((2, n_tiles, n_in), device=x2d.device, dtype=torch.float32)
    dnorm_w_part, dnorm_b_part = dnorm_parts
    _layernorm_linear_bwd_dx_kernel[(n_tiles,)](
        x2d,
        dy,
        norm_weight,
        norm_bias,
        weight,
        mean,
        rstd,
        dx,
        dnorm_w_part,
        dnorm_b_part,
        xn,
        n_rows,
        n_in,
        n_out,
        dy.stride(0),
        dy_columns,
        STORE_XN=matmul_weights,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_N=min(config["BLOCK_N"], runtime.block_for(n_out)),
        BLOCK_K=block_k,
        **runtime.launch_options(config),
    )
    d_norm_w, d_norm_b = dnorm_parts.sum(1)
    d_norm_w, d_norm_b = d_norm_w.to(norm_weight.dtype), d_norm_b.to(norm_bias.dtype)
    if matmul_weights:
        # bf16 operands, fp32 accumulation inside cuBLAS: nn.Linear's weight gradient under autocast
        d_weight = (dy.t() @ xn).to(weight.dtype)
        return dx, d_norm_w, d_norm_b, d_weight, dy.sum(0, dtype=torch.float32) if has_bias else None

    config, block_m = runtime.tile_config(OP, "bwd_dw", block_k)
    block_n = min(config["BLOCK_N"], runtime.block_for(n_out))
    n_col_tiles = triton.cdiv(n_out, block_n)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_col_tiles, x2d.device)
    dw_part = torch.empty((n_splits, n_out, n_in), device=x2d.device, dtype=torch.float32)
    dbias_part = torch.empty((n_splits, n_out), device=x2d.device, dtype=torch.float32)
    _layernorm_linear_bwd_dw_kernel[(n_col_tiles, n_splits)](
        x2d,
        dy,
        norm_weight,
        norm_bias,
        mean,
        rstd,
        dw_part,
        dbias_part,
        n_rows,
        n_in,
        n_out,
        dy.stride(0),
        dy_columns,
        n_splits,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **runtime.launch_options(config),
    )
    return dx, d_norm_w, d_norm_b, dw_part.sum(0).to(weight.dtype), dbias_part.sum(0) if has_bias else None
