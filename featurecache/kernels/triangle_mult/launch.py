"""The triangle multiplicative update's launchers: the forward (projection kernel, cuBLAS
triangular product, output kernel) and the backward (five steps, numbered below)."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.triangle_mult.kernels import (
    _triangle_bwd_dw_out_kernel,
    _triangle_bwd_dw_proj_kernel,
    _triangle_bwd_out_kernel,
    _triangle_bwd_proj_kernel,
    _triangle_out_kernel,
    _triangle_proj_kernel,
)

OP = "triangle_mult"
DIRECTIONS = ("outgoing", "incoming")


def _project(
    z2d, mask_rows, norm_in_weight, norm_in_bias, w_ap, w_ag, w_bp, w_bg, eps, batch, length, mean_in=None, rstd_in=None
):
    """a, b as [B, H, L, L]; fills mean_in / rstd_in when given."""
    n_rows, n_ch = z2d.shape
    n_hidden = w_ap.shape[0]
    a = torch.empty((batch, n_hidden, length, length), device=z2d.device, dtype=z2d.dtype)
    b = torch.empty_like(a)
    block_c = runtime.block_for(n_ch)
    config, block_m = runtime.tile_config(OP, "proj", block_c)
    store_stats = mean_in is not None
    _triangle_proj_kernel[(triton.cdiv(n_rows, block_m),)](
        z2d,
        mask_rows if mask_rows is not None else z2d,
        norm_in_weight,
        norm_in_bias,
        w_ap,
        w_ag,
        w_bp,
        w_bg,
        a,
        b,
        mean_in if store_stats else z2d,
        rstd_in if store_stats else z2d,
        n_rows,
        n_ch,
        n_hidden,
        length * length,
        eps,
        HAS_MASK=mask_rows is not None,
        STORE_STATS=store_stats,
        PRECISION=runtime.dot_precision(z2d.dtype),
        BLOCK_M=block_m,
        BLOCK_H=min(config["BLOCK_H"], runtime.block_for(n_hidden)),
        BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    return a, b


def _triangular_product(a, b, direction):
    # [B, H, L, L] per channel: outgoing x_ij = sum_k a_ik b_jk, incoming x_ij = sum_k a_ki b_kj
    if direction == "outgoing":
        return torch.matmul(a, b.transpose(-1, -2))
    return torch.matmul(a.transpose(-1, -2), b)


def _in_compute_dtype(z, params):
    """params with the six matrix weights in z's dtype (cast_weight: once a training step or a
    sampler where a weight_casts scope is open), the LayerNorms' as given. The op takes the
    weights as the model holds them (fp32 under autocast) and returns their gradients so: the
    fp32 sums of the weight gradients are not rounded to bf16 and cast back (two copies of each
    of six weights a call, and a bf16 rounding of the gradient)."""
    norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z = params
    w_ap, w_ag, w_bp, w_bg, w_g, w_z = runtime.weights_like(z, w_ap, w_ag, w_bp, w_bg, w_g, w_z)
    return (norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z)


def triangle_mult_fwd(z, mask, params, direction, eps):
    """z [B, L, L, C] -> (out, saved tensors for triangle_mult_bwd); the matrix weights in any
    float dtype (cast to z's here)."""
    (norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z) = _in_compute_dtype(z, params)
    batch, length, _, n_ch = z.shape
    n_hidden = w_ap.shape[0]
    z2d = z.reshape(-1, n_ch)
    n_rows = z2d.shape[0]
    mask_rows = None if mask is None else mask.reshape(-1).view(torch.uint8)
    stats = torch.empty((4, n_rows), device=z.device, dtype=torch.float32)
    mean_in, rstd_in, mean_out, rstd_out = stats

    a, b = _project(z2d, mask_rows, norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, eps, batch, length, mean_in, rstd_in)
    x = _triangular_product(a, b, direction)
    del a, b

    out = torch.empty_like(z2d)
    block_c, block_hf = runtime.block_for(n_ch), runtime.block_for(n_hidden)
    config, block_m = runtime.tile_config(OP, "out", max(block_c, block_hf))
    _triangle_out_kernel[(triton.cdiv(n_rows, block_m),)](
        z2d,
        x,
        norm_in_w,
        norm_in_b,
        mean_in,
        rstd_in,
        norm_out_w,
        norm_out_b,
        w_g,
        w_z,
        out,
        mean_out,
        rstd_out,
        n_rows,
        n_ch,
        n_hidden,
        length * length,
        eps,
        PRECISION=runtime.dot_precision(z.dtype),
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        BLOCK_HF=block_hf,
        **runtime.launch_options(config),
    )
    return out.view(z.shape), (z2d, mask_rows, x, stats)


def triangle_mult_bwd(dout, z2d, mask_rows, x, stats, params, direction, eps):
    """Gradients (dz [M, C], d_params in the order and dtypes of params)."""
    (norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z) = _in_compute_dtype(z2d, params)
    batch, n_hidden, length, _ = x.shape
    n_rows, n_ch = z2d.shape
    pair_rows = length * length
    mean_in, rstd_in, mean_out, rstd_out = stats
    device = z2d.device
    precision = runtime.dot_precision(z2d.dtype)
    block_c, block_hf = runtime.block_for(n_ch), runtime.block_for(n_hidden)
    has_mask = mask_rows is not None
    mask_arg = mask_rows if has_mask else z2d

    # 1. dx through gate * linear_z(LayerNorm(x))
    config, block_m = runtime.tile_config(OP, "bwd_out", max(block_c, block_hf))
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x)
    dnorm_out_part = torch.empty((2, n_tiles, n_hidden), device=device, dtype=torch.float32)
    _triangle_bwd_out_kernel[(n_tiles,)](
        z2d,
        x,
        dout,
        norm_in_w,
        norm_in_b,
        mean_in,
        rstd_in,
        norm_out_w,
        norm_out_b,
        mean_out,
        rstd_out,
        w_g,
        w_z,
        dx,
        dnorm_out_part[0],
        dnorm_out_part[1],
        n_rows,
        n_ch,
        n_hidden,
        pair_rows,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        BLOCK_HF=block_hf,
        **runtime.launch_options(config),
    )

    # 2. weight gradients of linear_g and linear_z
    config, block_m = runtime.tile_config(OP, "bwd_dw_out", max(block_c, block_hf))
    block_n = min(config["BLOCK_N"], block_c)
    n_out_tiles = triton.cdiv(n_ch, block_n)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_out_tiles, device)
    dwg_part = torch.empty((n_splits, n_ch, n_ch), device=device, dtype=torch.float32)
    dwz_part = torch.empty((n_splits, n_ch, n_hidden), device=device, dtype=torch.float32)
    _triangle_bwd_dw_out_kernel[(n_out_tiles, n_splits)](
        z2d,
        x,
        dout,
        norm_in_w,
        norm_in_b,
        mean_in,
        rstd_in,
        norm_out_w,
        norm_out_b,
        mean_out,
        rstd_out,
        w_g,
        w_z,
        dwg_part,
        dwz_part,
        n_rows,
        n_ch,
        n_hidden,
        pair_rows,
        n_splits,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        BLOCK_HF=block_hf,
        **runtime.launch_options(config),
    )

    # 3. da, db through the triangular product; a and b recomputed from z
    a, b = _project(z2d, mask_rows, norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, eps, batch, length)
    if direction == "outgoing":  # x = a b^T
        da = torch.matmul(dx, b)
        db = torch.matmul(dx.transpose(-1, -2), a)
    else:  # x = a^T b
        da = torch.matmul(b, dx.transpose(-1, -2))
        db = torch.matmul(a, dx)
    del a, b, dx

    # 4. dz and LayerNorm(z) gradients
    config, block_m = runtime.tile_config(OP, "bwd_proj", max(block_c, block_hf))
    n_tiles = triton.cdiv(n_rows, block_m)
    dz = torch.empty_like(z2d)
    dnorm_in_part = torch.empty((2, n_tiles, n_ch), device=device, dtype=torch.float32)
    _triangle_bwd_proj_kernel[(n_tiles,)](
        z2d,
        mask_arg,
        x,
        da,
        db,
        dout,
        norm_in_w,
        norm_in_b,
        mean_in,
        rstd_in,
        norm_out_w,
        norm_out_b,
        mean_out,
        rstd_out,
        w_ap,
        w_ag,
        w_bp,
        w_bg,
        w_g,
        w_z,
        dz,
        dnorm_in_part[0],
        dnorm_in_part[1],
        n_rows,
        n_ch,
        n_hidden,
        pair_rows,
        HAS_MASK=has_mask,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_H=min(config["BLOCK_H"], block_hf),
        BLOCK_C=block_c,
        BLOCK_HF=block_hf,
        **runtime.launch_options(config),
    )

    # 5. weight gradients of the four projections
    config, block_m = runtime.tile_config(OP, "bwd_dw_proj", block_c)
    block_h = min(config["BLOCK_H"], block_hf)
    n_hidden_tiles = triton.cdiv(n_hidden, block_h)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_hidden_tiles, device)
    dwproj_part = torch.empty((4, n_splits, n_hidden, n_ch), device=device, dtype=torch.float32)
    _triangle_bwd_dw_proj_kernel[(n_hidden_tiles, n_splits)](
        z2d,
        mask_arg,
        da,
        db,
        norm_in_w,
        norm_in_b,
        mean_in,
        rstd_in,
        w_ap,
        w_ag,
        w_bp,
        w_bg,
        dwproj_part[0],
        dwproj_part[1],
        dwproj_part[2],
        dwproj_part[3],
        n_rows,
        n_ch,
        n_hidden,
        pair_rows,
        n_splits,
        HAS_MASK=has_mask,
        PRECISION=precision,
        BLOCK_M=block_m,
        BLOCK_H=block_h,
        BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    dwproj = dwproj_part.sum(1)
    dnorm_in, dnorm_out = dnorm_in_part.sum(1), dnorm_out_part.sum(1)  # weight and bias: one reduction each
    grads = (
        dnorm_in[0],
        dnorm_in[1],
        dwproj[0],
        dwproj[1],
        dwproj[2],
        dwproj[3],
        dwg_part.sum(0),
        dnorm_out[0],
        dnorm_out[1],
        dwz_part.sum(0),
    )
    return dz, tuple(g.to(p.dtype) for g, p in zip(grads, params))
