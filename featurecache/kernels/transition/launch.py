"""The Transition's launchers: each allocates the outputs, picks the tiles (config.py) and
launches; the backward forms the weight gradients by the strategy WEIGHT_GRADS names."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.transition.config import OP, tiles
from featurecache.kernels.transition.kernels import (
    _transition_bwd_dw_kernel,
    _transition_bwd_dx_kernel,
    _transition_fwd_kernel,
)


def transition_fwd(x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
    """x2d [M, C] contiguous -> (y [M, C], mean [M], rstd [M])."""
    n_rows, n_ch = x2d.shape
    n_hidden = weight_a.shape[0]
    y = torch.empty_like(x2d)
    mean = torch.empty(n_rows, device=x2d.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_h, block_c = tiles("fwd", n_ch, n_hidden, x2d.element_size())
    runtime.launch_fitting(
        _transition_fwd_kernel,
        (triton.cdiv(n_rows, block_m),),
        (x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, y, mean, rstd, n_rows, n_ch, n_hidden, eps),
        dict(
            PRECISION=runtime.dot_precision(x2d.dtype),
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            BLOCK_C=block_c,
            **runtime.launch_options(config),
        ),
        shrinkable=("BLOCK_H",),
    )
    return y, mean, rstd


def transition_bwd(dy, x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd):
    """Gradients (dx, d_norm_weight, d_norm_bias, d_weight_a, d_weight_b, d_weight_out)."""
    n_rows, n_ch = x2d.shape
    n_hidden = weight_a.shape[0]
    precision = runtime.dot_precision(x2d.dtype)
    device = x2d.device

    # "matmul": the dx kernel also writes [d_a | d_b], the hidden and LN(x) (at 147,456 rows,
    # C=128, n=4 in bf16: 468 MiB) and cuBLAS forms the weight gradients; "recompute": a second
    # Triton kernel recomputes them and nothing [rows, n*C] is written.
    matmul_weights = runtime.weight_grads_by_matmul(OP)
    if matmul_weights:
        d_ab = torch.empty((n_rows, 2 * n_hidden), device=device, dtype=x2d.dtype)
        hidden = torch.empty((n_rows, n_hidden), device=device, dtype=x2d.dtype)
        xn = torch.empty_like(x2d)
    else:
        d_ab = hidden = xn = x2d  # unused by the kernel

    config, block_m, block_h, block_c = tiles("bwd_dx", n_ch, n_hidden, x2d.element_size())
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x2d)
    # the LayerNorm's weight and bias partial sums, halves of one buffer: one reduction for both
    dnorm_parts = torch.empty((2, n_tiles, n_ch), device=device, dtype=torch.float32)
    dnorm_w_part, dnorm_b_part = dnorm_parts
    runtime.launch_fitting(
        _transition_bwd_dx_kernel,
        (n_tiles,),
        (
            x2d,
            dy,
            norm_weight,
            norm_bias,
            weight_a,
            weight_b,
            weight_out,
            mean,
            rstd,
            dx,
            dnorm_w_part,
            dnorm_b_part,
            d_ab,
            hidden,
            xn,
            n_rows,
            n_ch,
            n_hidden,
        ),
        dict(
            STORE_FOR_WEIGHTS=matmul_weights,
            PRECISION=precision,
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            BLOCK_C=block_c,
            **runtime.launch_options(config),
        ),
        shrinkable=("BLOCK_H",),
    )

    d_norm_w, d_norm_b = dnorm_parts.sum(1)
    d_norm_w, d_norm_b = d_norm_w.to(norm_weight.dtype), d_norm_b.to(norm_bias.dtype)
    if matmul_weights:
        d_wab = d_ab.t() @ xn  # [2 * n_hidden, C]
        d_wo = dy.t() @ hidden  # [C, n_hidden]
        return (
            dx,
            d_norm_w,
            d_norm_b,
            d_wab[:n_hidden].to(weight_a.dtype),
            d_wab[n_hidden:].to(weight_b.dtype),
            d_wo.to(weight_out.dtype),
        )

    config, block_m, block_h, block_c = tiles("bwd_dw", n_ch, n_hidden, x2d.element_size())
    n_hidden_tiles = triton.cdiv(n_hidden, block_h)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_hidden_tiles, device)
    dwa_part = torch.empty((n_splits, n_hidden, n_ch), device=device, dtype=torch.float32)
    dwb_part = torch.empty_like(dwa_part)
    dwo_part = torch.empty((n_splits, n_ch, n_hidden), device=device, dtype=torch.float32)
    runtime.launch_fitting(  # BLOCK_H sets the grid and the partial sums here: not shrinkable
        _transition_bwd_dw_kernel,
        (n_hidden_tiles, n_splits),
        (
            x2d,
            dy,
            norm_weight,
            norm_bias,
            weight_a,
            weight_b,
            weight_out,
            mean,
            rstd,
            dwa_part,
            dwb_part,
            dwo_part,
            n_rows,
            n_ch,
            n_hidden,
            n_splits,
        ),
        dict(PRECISION=precision, BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_C=block_c, **runtime.launch_options(config)),
    )
    return (
        dx,
        d_norm_w,
        d_norm_b,
        dwa_part.sum(0).to(weight_a.dtype),
        dwb_part.sum(0).to(weight_b.dtype),
        dwo_part.sum(0).to(weight_out.dtype),
    )
