"""The conditioned transition's launchers: each allocates the outputs, picks the tiles
(config.py) and launches one kernel; the weight gradients are cuBLAS products of what the
backward kernel writes."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.conditioned_transition.config import adaln_tiles, tiles
from featurecache.kernels.conditioned_transition.kernels import (
    _adaln_bwd_kernel,
    _adaln_fwd_kernel,
    _conditioned_transition_bwd_kernel,
    _conditioned_transition_fwd_kernel,
)


def _sharing(a: torch.Tensor, conditioning: torch.Tensor) -> tuple[bool, int, int]:
    """(whether the s-derived rows are shared by a's samples, samples S, tokens L) for a
    [..., S, L, C] and the s-derived [..., S or 1, L, C] (same shape: not shared)."""
    if conditioning.shape == a.shape:
        return False, 1, 1
    return True, a.shape[-3], a.shape[-2]


def conditioned_transition_fwd(a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
    """a [..., C] contiguous; scale, shift, gate contiguous, a's shape or shared over its dim -3
    -> (y, out (ungated), mean [rows], rstd [rows])."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    n_hidden = weight_a.shape[0]
    shared, n_samples, n_tokens = _sharing(a, scale)
    y = torch.empty_like(a)
    out = torch.empty_like(a)
    mean = torch.empty(n_rows, device=a.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_h, block_c = tiles("fwd", n_ch, n_hidden, a.element_size())
    runtime.launch_fitting(
        _conditioned_transition_fwd_kernel,
        (triton.cdiv(n_rows, block_m),),
        (
            a,
            scale,
            shift,
            gate,
            weight_a,
            weight_b,
            weight_out,
            y,
            out,
            mean,
            rstd,
            n_rows,
            n_ch,
            n_hidden,
            n_tokens,
            n_samples,
            eps,
        ),
        dict(
            S_SHARED=shared,
            PRECISION=runtime.dot_precision(a.dtype),
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            BLOCK_C=block_c,
            **runtime.launch_options(config),
        ),
        shrinkable=("BLOCK_H",),
    )
    return y, out, mean, rstd


def conditioned_transition_bwd(dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd):
    """Gradients (da, d_scale, d_shift, d_gate (each in its tensor's shape and dtype), d_weight_a,
    d_weight_b, d_weight_out)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    n_hidden = weight_a.shape[0]
    shared, n_samples, n_tokens = _sharing(a, scale)
    device = a.device
    da = torch.empty_like(a)
    d_cond = torch.empty((3, *a.shape), device=device, dtype=a.dtype)  # scale, shift, gate per a row
    d_ab = torch.empty((n_rows, 2 * n_hidden), device=device, dtype=a.dtype)
    hidden = torch.empty((n_rows, n_hidden), device=device, dtype=a.dtype)
    x = torch.empty((n_rows, n_ch), device=device, dtype=a.dtype)
    d_out = torch.empty_like(x)
    config, block_m, block_h, block_c = tiles("bwd", n_ch, n_hidden, a.element_size())
    runtime.launch_fitting(
        _conditioned_transition_bwd_kernel,
        (triton.cdiv(n_rows, block_m),),
        (
            a,
            dy,
            scale,
            shift,
            gate,
            weight_a,
            weight_b,
            weight_out,
            out,
            mean,
            rstd,
            da,
            d_cond[0],
            d_cond[1],
            d_cond[2],
            d_ab,
            hidden,
            x,
            d_out,
            n_rows,
            n_ch,
            n_hidden,
            n_tokens,
            n_samples,
        ),
        dict(
            S_SHARED=shared,
            PRECISION=runtime.dot_precision(a.dtype),
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            BLOCK_C=block_c,
            **runtime.launch_options(config),
        ),
        shrinkable=("BLOCK_H",),
    )
    d_scale, d_shift, d_gate = _conditioning_grads(d_cond, shared, (scale, shift, gate))
    d_wab = d_ab.t() @ x  # [2 * n_hidden, C]
    return (
        da,
        d_scale,
        d_shift,
        d_gate,
        d_wab[:n_hidden].to(weight_a.dtype),
        d_wab[n_hidden:].to(weight_b.dtype),
        (d_out.t() @ hidden).to(weight_out.dtype),
    )


def _conditioning_grads(d_cond, shared, tensors):
    """The per-a-row gradients [k, *a.shape] (a's dtype: half the bytes of fp32) summed in fp32
    over the samples where the s-derived tensors are shared, each in its tensor's dtype."""
    if shared:
        d_cond = d_cond.sum(-3, keepdim=True, dtype=torch.float32)
    return tuple(d.to(t.dtype) for d, t in zip(d_cond, tensors))


def adaln_fwd(a, scale, shift, eps):
    """a [..., C] contiguous; scale, shift as conditioned_transition_fwd's -> (x, mean, rstd)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    shared, n_samples, n_tokens = _sharing(a, scale)
    x = torch.empty_like(a)
    mean = torch.empty(n_rows, device=a.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_c = adaln_tiles(n_ch)
    _adaln_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        a,
        scale,
        shift,
        x,
        mean,
        rstd,
        n_rows,
        n_ch,
        n_tokens,
        n_samples,
        eps,
        S_SHARED=shared,
        PRECISION=runtime.dot_precision(a.dtype),
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    return x, mean, rstd


def adaln_bwd(dx, a, scale, shift, mean, rstd):
    """Gradients (da, d_scale, d_shift)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    shared, n_samples, n_tokens = _sharing(a, scale)
    da = torch.empty_like(a)
    d_cond = torch.empty((2, *a.shape), device=a.device, dtype=a.dtype)
    config, block_m, block_c = adaln_tiles(n_ch)
    _adaln_bwd_kernel[(triton.cdiv(n_rows, block_m),)](
        a,
        dx,
        scale,
        mean,
        rstd,
        da,
        d_cond[0],
        d_cond[1],
        n_rows,
        n_ch,
        n_tokens,
        n_samples,
        S_SHARED=shared,
        PRECISION=runtime.dot_precision(a.dtype),
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    return (da, *_conditioning_grads(d_cond, shared, (scale, shift)))
