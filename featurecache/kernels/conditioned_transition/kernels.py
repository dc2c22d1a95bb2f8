"""The conditioned transition's Triton kernels: the fused AdaLN + SwiGLU + gate forward and its
backward, and the one-pass AdaLN (forward and backward) for rows wider than FUSED_MAX_CHANNELS."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import (
    cast,
    mma,
    row_block,
    store_swiglu_grads,
    swiglu_chunk,
    swiglu_chunk_input_grad,
    swiglu_chunk_weights,
)


@triton.jit
def _s_rows(rows, n_tokens, n_samples, S_SHARED: tl.constexpr):
    """The rows of the s-derived tensors that rows of a [..., S, L, C] read: the same rows, or,
    when they are [..., 1, L, C] (shared by the S samples), the row of the same token."""
    if S_SHARED:
        return (rows // (n_samples * n_tokens)) * n_tokens + rows % n_tokens
    else:
        return rows


@triton.jit
def _normalized(a, col_mask, n_ch, eps):
    """LayerNorm without affine of a row tile (padded columns zero): (xhat fp32, mean, rstd)."""
    a32 = a.to(tl.float32)
    mean = tl.sum(a32, axis=1) / n_ch
    centered = tl.where(col_mask[None, :], a32 - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / n_ch + eps)
    return centered * rstd[:, None], mean, rstd


@triton.jit
def _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps):
    """x = sigmoid(scale) * LayerNorm(a) + shift of a row tile, fp32 (padded columns: 0.5 * 0 + 0),
    with the LayerNorm's (mean, rstd)."""
    xhat, mean, rstd = _normalized(a, col_mask, n_ch, eps)
    scale = tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    return tl.sigmoid(scale) * xhat + shift, mean, rstd


@triton.jit
def _conditioned_transition_fwd_kernel(
    A,
    SCALE,
    SHIFT,
    GATE,
    WA,
    WB,
    WO,
    Y,
    OUT,
    MEAN,
    RSTD,
    n_rows,
    n_ch,
    n_hidden,
    n_tokens,
    n_samples,
    eps,
    S_SHARED: tl.constexpr,
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
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]

    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    x, mean, rstd = _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps)
    x = cast(x, a.dtype, PRECISION)

    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, a.dtype, PRECISION)
        acc = mma(swiglu_chunk(x, wa, wb, zeros_h, PRECISION), wo, acc, PRECISION)
    out = cast(acc, a.dtype, PRECISION)
    gate = tl.sigmoid(tl.load(GATE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    tl.store(OUT + offsets, out, mask=tile_mask)
    tl.store(Y + offsets, cast(gate * out.to(tl.float32), Y.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _conditioned_transition_bwd_kernel(
    A,
    DY,
    SCALE,
    SHIFT,
    GATE,
    WA,
    WB,
    WO,
    OUT,
    MEAN,
    RSTD,
    DA,
    DSCALE,
    DSHIFT,
    DGATE,
    D_AB,
    HIDDEN,
    X,
    D_OUT,
    n_rows,
    n_ch,
    n_hidden,
    n_tokens,
    n_samples,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """da, and per a row (fp32) the gradients of the scale and gate logits and of the shift;
    writes [d_a | d_b], the hidden, x and d_out for the weight gradients."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]

    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    xhat, _ = _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask)
    scale = tl.sigmoid(tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    shift = tl.load(SHIFT + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    x = cast(scale * xhat + shift, a.dtype, PRECISION)
    tl.store(X + offsets, x, mask=tile_mask)

    # the output gate: y = gate * out
    dy = tl.load(DY + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    gate = tl.sigmoid(tl.load(GATE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    out = tl.load(OUT + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    tl.store(DGATE + offsets, cast(dy * out * gate * (1.0 - gate), DGATE.dtype.element_ty, PRECISION), mask=tile_mask)
    d_out = cast(dy * gate, a.dtype, PRECISION)
    tl.store(D_OUT + offsets, d_out, mask=tile_mask)

    d_x = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, a.dtype, PRECISION)
        d_x, hidden, d_a, d_b = swiglu_chunk_input_grad(x, d_out, wa, wb, wo, d_x, zeros_h, PRECISION)
        store_swiglu_grads(D_AB, HIDDEN, d_a, d_b, hidden, rows, row_mask, hids, n_hidden, PRECISION)

    # a and scale reloaded rather than held through the loop (registers)
    _adaln_backward(
        d_x,
        A,
        SCALE,
        MEAN,
        RSTD,
        DA,
        DSCALE,
        DSHIFT,
        rows,
        row_mask,
        col_mask,
        offsets,
        s_offsets,
        tile_mask,
        n_ch,
        PRECISION,
    )


@triton.jit
def _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask):
    """_normalized from the saved statistics: (xhat fp32, rstd), bitwise the same xhat."""
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    return tl.where(col_mask[None, :], a.to(tl.float32) - mean[:, None], 0.0) * rstd[:, None], rstd


@triton.jit
def _adaln_backward(
    d_x,
    A,
    SCALE,
    MEAN,
    RSTD,
    DA,
    DSCALE,
    DSHIFT,
    rows,
    row_mask,
    col_mask,
    offsets,
    s_offsets,
    tile_mask,
    n_ch,
    PRECISION: tl.constexpr,
):
    """Given d_x for x = sigmoid(scale) * xhat + shift, store da and, per a row, the
    gradients of the scale logits and of the shift. Padded columns have d_x = 0 and xhat = 0."""
    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    xhat, rstd = _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask)
    scale = tl.sigmoid(tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    tl.store(DSHIFT + offsets, cast(d_x, DSHIFT.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(
        DSCALE + offsets, cast(d_x * xhat * scale * (1.0 - scale), DSCALE.dtype.element_ty, PRECISION), mask=tile_mask
    )
    d_xhat = d_x * scale
    proj = tl.sum(d_xhat * xhat, axis=1) / n_ch
    mean_d = tl.sum(d_xhat, axis=1) / n_ch
    da = (d_xhat - xhat * proj[:, None] - mean_d[:, None]) * rstd[:, None]
    tl.store(DA + offsets, cast(da, DA.dtype.element_ty, PRECISION), mask=tile_mask)


@triton.jit
def _adaln_fwd_kernel(
    A,
    SCALE,
    SHIFT,
    X,
    MEAN,
    RSTD,
    n_rows,
    n_ch,
    n_tokens,
    n_samples,
    eps,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """AdaLN alone, one pass: x = sigmoid(scale) * LayerNorm(a) + shift (rows too wide for the
    fused transition, and the conditioned attention's input)."""
    rows, row_mask = row_block(tl.program_id(0), BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]
    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    x, mean, rstd = _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps)
    tl.store(X + offsets, cast(x, X.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _adaln_bwd_kernel(
    A,
    DX,
    SCALE,
    MEAN,
    RSTD,
    DA,
    DSCALE,
    DSHIFT,
    n_rows,
    n_ch,
    n_tokens,
    n_samples,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows, row_mask = row_block(tl.program_id(0), BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]
    d_x = tl.load(DX + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    _adaln_backward(
        d_x,
        A,
        SCALE,
        MEAN,
        RSTD,
        DA,
        DSCALE,
        DSHIFT,
        rows,
        row_mask,
        col_mask,
        offsets,
        s_offsets,
        tile_mask,
        n_ch,
        PRECISION,
    )
