"""AF3 triangle multiplicative update (Algorithms 12 outgoing, 13 incoming), without the residual.

Three steps, each a single pass over the pair rows:
1. projection kernel: LayerNorm(z), the four gated projections and the mask, writing a and b
   channel-first, [B, H, L, L], the layout a batched matmul over channels wants;
2. the triangular product x = a @ b^T (outgoing) or a^T @ b (incoming) per channel, by cuBLAS
   through torch.matmul, which handles both transposes without copies;
3. output kernel: LayerNorm(x), linear_z, and the gate sigmoid(linear_g(LayerNorm(z))), with
   LayerNorm(z) recomputed from z rather than kept.

Saved for backward: z, the mask, x and four fp32 statistics per row. a and b are recomputed by
the projection kernel (a pass over z) instead of kept: at L=512, H=128 in bf16 that is 128 MiB
less resident between forward and backward. The backward runs an output-gradient kernel (dx),
the two matmuls for da and db, a projection-gradient kernel (dz and the LayerNorm(z) gradients)
and two weight-gradient kernels that accumulate over row splits in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from featurecache.kernels import _common
from featurecache.kernels._common import (
    _cast,
    _layernorm_rows,
    _layernorm_rows_bwd,
    _mma,
    _normalize_saved,
)
from featurecache.kernels.reference import triangle_mult_reference

_OP = "triangle_mult"
DIRECTIONS = ("outgoing", "incoming")


@triton.jit
def _channel_first_base(rows, n_hidden, pair_rows):
    """Offset of channel 0 of each pair row r = (b, i, j) in a [B, H, L, L] tensor."""
    batch = rows // pair_rows
    return batch * n_hidden * pair_rows + (rows - batch * pair_rows)


@triton.jit
def _load_zn(Z, NORM_W, NORM_B, MEAN, RSTD, rows, cols, row_mask, col_mask, n_ch,
             PRECISION: tl.constexpr):
    """LayerNorm(z) of one row tile from saved statistics, in z's dtype: [BLOCK_M, BLOCK_C]."""
    z = tl.load(Z + rows[:, None] * n_ch + cols[None, :],
                mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    zhat = _normalize_saved(z.to(tl.float32), mean, rstd, col_mask)
    norm_w = tl.load(NORM_W + cols, mask=col_mask, other=0.0).to(tl.float32)
    norm_b = tl.load(NORM_B + cols, mask=col_mask, other=0.0).to(tl.float32)
    return _cast(zhat * norm_w[None, :] + norm_b[None, :], z.dtype, PRECISION), zhat, rstd


@triton.jit
def _load_xn(X, NORM_W, NORM_B, MEAN, RSTD, rows, hids, row_mask, hid_mask, n_hidden, pair_rows,
             PRECISION: tl.constexpr):
    """LayerNorm(x) of one row tile, x read channel-first; returns (xn, xhat, rstd)."""
    base = _channel_first_base(rows, n_hidden, pair_rows)
    x = tl.load(X + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
                mask=row_mask[:, None] & hid_mask[None, :], other=0.0)
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    xhat = _normalize_saved(x.to(tl.float32), mean, rstd, hid_mask)
    norm_w = tl.load(NORM_W + hids, mask=hid_mask, other=0.0).to(tl.float32)
    norm_b = tl.load(NORM_B + hids, mask=hid_mask, other=0.0).to(tl.float32)
    return _cast(xhat * norm_w[None, :] + norm_b[None, :], x.dtype, PRECISION), xhat, rstd


@triton.jit
def _load_weight(W, out_idx, in_idx, out_mask, in_mask, n_in, dtype: tl.constexpr,
                 PRECISION: tl.constexpr):
    """Tile W[out_idx, in_idx] of a row-major [n_out, n_in] weight, cast to the compute dtype."""
    return _cast(tl.load(W + out_idx[:, None] * n_in + in_idx[None, :],
                   mask=out_mask[:, None] & in_mask[None, :], other=0.0), dtype, PRECISION)


@triton.jit
def _triangle_proj_kernel(
    Z, MASK, NORM_W, NORM_B, WAP, WAG, WBP, WBG, A, B, MEAN, RSTD,
    n_rows, n_ch, n_hidden, pair_rows, eps,
    HAS_MASK: tl.constexpr,
    STORE_STATS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """a, b = sigmoid(zn @ W_g^T) * (zn @ W_p^T) * mask, stored [B, H, L, L]."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    row_mask = rows < n_rows
    col_mask = cols < n_ch

    z = tl.load(Z + rows[:, None] * n_ch + cols[None, :],
                mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    zhat, mean, rstd = _layernorm_rows(z.to(tl.float32), col_mask, n_ch, eps)
    norm_w = tl.load(NORM_W + cols, mask=col_mask, other=0.0).to(tl.float32)
    norm_b = tl.load(NORM_B + cols, mask=col_mask, other=0.0).to(tl.float32)
    zn = _cast(zhat * norm_w[None, :] + norm_b[None, :], z.dtype, PRECISION)
    if STORE_STATS:
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
    keep = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
    if HAS_MASK:
        keep = tl.load(MASK + rows, mask=row_mask, other=0).to(tl.float32)

    base = _channel_first_base(rows, n_hidden, pair_rows)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        hid_mask = hids < n_hidden
        w_a_p = _load_weight(WAP, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        a_p = _mma(zn, tl.trans(w_a_p), zeros_h, PRECISION)
        w_a_g = _load_weight(WAG, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        a_g = _mma(zn, tl.trans(w_a_g), zeros_h, PRECISION)
        w_b_p = _load_weight(WBP, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        b_p = _mma(zn, tl.trans(w_b_p), zeros_h, PRECISION)
        w_b_g = _load_weight(WBG, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        b_g = _mma(zn, tl.trans(w_b_g), zeros_h, PRECISION)
        out_offsets = base[:, None] + hids[None, :].to(tl.int64) * pair_rows
        out_mask = row_mask[:, None] & hid_mask[None, :]
        a = tl.sigmoid(a_g) * a_p * keep[:, None]
        b = tl.sigmoid(b_g) * b_p * keep[:, None]
        tl.store(A + out_offsets, _cast(a, A.dtype.element_ty, PRECISION), mask=out_mask)
        tl.store(B + out_offsets, _cast(b, B.dtype.element_ty, PRECISION), mask=out_mask)


@triton.jit
def _triangle_out_kernel(
    Z, X, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, NORM_OUT_W, NORM_OUT_B, WG, WZ,
    OUT, MEAN_OUT, RSTD_OUT,
    n_rows, n_ch, n_hidden, pair_rows, eps,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """out = sigmoid(zn @ Wg^T) * (LayerNorm(x) @ Wz^T); x read channel-first."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    hids = tl.arange(0, BLOCK_HF)
    row_mask = rows < n_rows
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden

    base = _channel_first_base(rows, n_hidden, pair_rows)
    x = tl.load(X + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
                mask=row_mask[:, None] & hid_mask[None, :], other=0.0)
    xhat, mean, rstd = _layernorm_rows(x.to(tl.float32), hid_mask, n_hidden, eps)
    tl.store(MEAN_OUT + rows, mean, mask=row_mask)
    tl.store(RSTD_OUT + rows, rstd, mask=row_mask)
    norm_w = tl.load(NORM_OUT_W + hids, mask=hid_mask, other=0.0).to(tl.float32)
    norm_b = tl.load(NORM_OUT_B + hids, mask=hid_mask, other=0.0).to(tl.float32)
    xn = _cast(xhat * norm_w[None, :] + norm_b[None, :], x.dtype, PRECISION)
    zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask,
                        col_mask, n_ch, PRECISION)

    zeros_c = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    wz = _load_weight(WZ, cols, hids, col_mask, hid_mask, n_hidden, x.dtype, PRECISION)
    wg = _load_weight(WG, cols, cols, col_mask, col_mask, n_ch, x.dtype, PRECISION)
    y = _mma(xn, tl.trans(wz), zeros_c, PRECISION)
    gate = tl.sigmoid(_mma(zn, tl.trans(wg), zeros_c, PRECISION))
    out = _cast(gate * y, OUT.dtype.element_ty, PRECISION)
    tl.store(OUT + rows[:, None] * n_ch + cols[None, :], out,
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _triangle_bwd_out_kernel(
    Z, X, DOUT, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, NORM_OUT_W, NORM_OUT_B,
    MEAN_OUT, RSTD_OUT, WG, WZ, DX, DNORM_W_PART, DNORM_B_PART,
    n_rows, n_ch, n_hidden, pair_rows,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """dx (channel-first, for the matmul backward) and partial LayerNorm(x) parameter grads."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    hids = tl.arange(0, BLOCK_HF)
    row_mask = rows < n_rows
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden

    zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask,
                        col_mask, n_ch, PRECISION)
    _, xhat, rstd = _load_xn(X, NORM_OUT_W, NORM_OUT_B, MEAN_OUT, RSTD_OUT, rows, hids, row_mask,
                             hid_mask, n_hidden, pair_rows, PRECISION)
    dout = tl.load(DOUT + rows[:, None] * n_ch + cols[None, :],
                   mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    wg = _load_weight(WG, cols, cols, col_mask, col_mask, n_ch, zn.dtype, PRECISION)
    wz = _load_weight(WZ, cols, hids, col_mask, hid_mask, n_hidden, zn.dtype, PRECISION)
    gate = tl.sigmoid(_mma(zn, tl.trans(wg), tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32),
                           PRECISION))
    d_y = _cast(dout.to(tl.float32) * gate, zn.dtype, PRECISION)
    d_xn = _mma(d_y, wz, tl.zeros((BLOCK_M, BLOCK_HF), dtype=tl.float32), PRECISION)

    norm_w = tl.load(NORM_OUT_W + hids, mask=hid_mask, other=0.0).to(tl.float32)
    dx = _layernorm_rows_bwd(d_xn, xhat, norm_w, rstd, n_hidden)
    base = _channel_first_base(rows, n_hidden, pair_rows)
    tl.store(DX + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
             _cast(dx, DX.dtype.element_ty, PRECISION), mask=row_mask[:, None] & hid_mask[None, :])
    tl.store(DNORM_W_PART + pid * n_hidden + hids, tl.sum(d_xn * xhat, axis=0), mask=hid_mask)
    tl.store(DNORM_B_PART + pid * n_hidden + hids, tl.sum(d_xn, axis=0), mask=hid_mask)


@triton.jit
def _gated_projection_bwd(zn, d_out, keep, WP, WG, hids, cols, hid_mask, col_mask, n_ch,
                          zeros_h, PRECISION: tl.constexpr):
    """For out = sigmoid(zn Wg^T) * (zn Wp^T) * keep: gradients wrt the two projections (fp32)."""
    w_p = _load_weight(WP, hids, cols, hid_mask, col_mask, n_ch, zn.dtype, PRECISION)
    w_g = _load_weight(WG, hids, cols, hid_mask, col_mask, n_ch, zn.dtype, PRECISION)
    proj = _mma(zn, tl.trans(w_p), zeros_h, PRECISION)
    gate = tl.sigmoid(_mma(zn, tl.trans(w_g), zeros_h, PRECISION))
    d_masked = d_out * keep[:, None]
    return d_masked * gate, d_masked * proj * gate * (1.0 - gate), w_p, w_g


@triton.jit
def _triangle_bwd_proj_kernel(
    Z, MASK, X, DA, DB, DOUT, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN,
    NORM_OUT_W, NORM_OUT_B, MEAN_OUT, RSTD_OUT, WAP, WAG, WBP, WBG, WG, WZ,
    DZ, DNORM_W_PART, DNORM_B_PART,
    n_rows, n_ch, n_hidden, pair_rows,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """dz through the four gated projections and the output gate, and partial LN(z) grads."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    row_mask = rows < n_rows
    col_mask = cols < n_ch

    zn, zhat, rstd_in = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask,
                                 col_mask, n_ch, PRECISION)
    keep = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
    if HAS_MASK:
        keep = tl.load(MASK + rows, mask=row_mask, other=0).to(tl.float32)
    base = _channel_first_base(rows, n_hidden, pair_rows)

    d_zn = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        hid_mask = hids < n_hidden
        offsets = base[:, None] + hids[None, :].to(tl.int64) * pair_rows
        tile_mask = row_mask[:, None] & hid_mask[None, :]
        d_a = tl.load(DA + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_b = tl.load(DB + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_ap, d_ag, w_ap, w_ag = _gated_projection_bwd(zn, d_a, keep, WAP, WAG, hids, cols,
                                                       hid_mask, col_mask, n_ch, zeros_h,
                                                       PRECISION)
        d_zn = _mma(_cast(d_ap, zn.dtype, PRECISION), w_ap, d_zn, PRECISION)
        d_zn = _mma(_cast(d_ag, zn.dtype, PRECISION), w_ag, d_zn, PRECISION)
        d_bp, d_bg, w_bp, w_bg = _gated_projection_bwd(zn, d_b, keep, WBP, WBG, hids, cols,
                                                       hid_mask, col_mask, n_ch, zeros_h,
                                                       PRECISION)
        d_zn = _mma(_cast(d_bp, zn.dtype, PRECISION), w_bp, d_zn, PRECISION)
        d_zn = _mma(_cast(d_bg, zn.dtype, PRECISION), w_bg, d_zn, PRECISION)

    # output gate: d(zn @ Wg^T) = dout * y * gate * (1 - gate), y recomputed from x
    hids_full = tl.arange(0, BLOCK_HF)
    hid_full_mask = hids_full < n_hidden
    xn, _, _ = _load_xn(X, NORM_OUT_W, NORM_OUT_B, MEAN_OUT, RSTD_OUT, rows, hids_full, row_mask,
                        hid_full_mask, n_hidden, pair_rows, PRECISION)
    zeros_c = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    wz = _load_weight(WZ, cols, hids_full, col_mask, hid_full_mask, n_hidden, zn.dtype, PRECISION)
    wg = _load_weight(WG, cols, cols, col_mask, col_mask, n_ch, zn.dtype, PRECISION)
    y = _mma(xn, tl.trans(wz), zeros_c, PRECISION)
    gate = tl.sigmoid(_mma(zn, tl.trans(wg), zeros_c, PRECISION))
    dout = tl.load(DOUT + rows[:, None] * n_ch + cols[None, :],
                   mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
    d_gate_logit = dout * y * gate * (1.0 - gate)
    d_zn = _mma(_cast(d_gate_logit, zn.dtype, PRECISION), wg, d_zn, PRECISION)

    norm_w = tl.load(NORM_IN_W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dz = _layernorm_rows_bwd(d_zn, zhat, norm_w, rstd_in, n_ch)
    tl.store(DZ + rows[:, None] * n_ch + cols[None, :], _cast(dz, DZ.dtype.element_ty, PRECISION),
             mask=row_mask[:, None] & col_mask[None, :])
    tl.store(DNORM_W_PART + pid * n_ch + cols, tl.sum(d_zn * zhat, axis=0), mask=col_mask)
    tl.store(DNORM_B_PART + pid * n_ch + cols, tl.sum(d_zn, axis=0), mask=col_mask)


@triton.jit
def _triangle_bwd_dw_proj_kernel(
    Z, MASK, DA, DB, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, WAP, WAG, WBP, WBG,
    DWAP_PART, DWAG_PART, DWBP_PART, DWBG_PART,
    n_rows, n_ch, n_hidden, pair_rows, n_splits,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Partial gradients of the four projection weights for one hidden chunk and row split."""
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    hids = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden

    d_wap = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wag = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wbp = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wbg = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < n_rows
        zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask,
                            col_mask, n_ch, PRECISION)
        keep = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
        if HAS_MASK:
            keep = tl.load(MASK + rows, mask=row_mask, other=0).to(tl.float32)
        base = _channel_first_base(rows, n_hidden, pair_rows)
        offsets = base[:, None] + hids[None, :].to(tl.int64) * pair_rows
        tile_mask = row_mask[:, None] & hid_mask[None, :]
        # padded rows load d_a = d_b = 0 and add nothing
        d_a = tl.load(DA + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_b = tl.load(DB + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_ap, d_ag, _, _ = _gated_projection_bwd(zn, d_a, keep, WAP, WAG, hids, cols, hid_mask,
                                                 col_mask, n_ch, zeros_h, PRECISION)
        d_bp, d_bg, _, _ = _gated_projection_bwd(zn, d_b, keep, WBP, WBG, hids, cols, hid_mask,
                                                 col_mask, n_ch, zeros_h, PRECISION)
        d_wap = _mma(tl.trans(_cast(d_ap, zn.dtype, PRECISION)), zn, d_wap, PRECISION)
        d_wag = _mma(tl.trans(_cast(d_ag, zn.dtype, PRECISION)), zn, d_wag, PRECISION)
        d_wbp = _mma(tl.trans(_cast(d_bp, zn.dtype, PRECISION)), zn, d_wbp, PRECISION)
        d_wbg = _mma(tl.trans(_cast(d_bg, zn.dtype, PRECISION)), zn, d_wbg, PRECISION)
    offsets = pid_s * n_hidden * n_ch + hids[:, None] * n_ch + cols[None, :]
    w_mask = hid_mask[:, None] & col_mask[None, :]
    tl.store(DWAP_PART + offsets, d_wap, mask=w_mask)
    tl.store(DWAG_PART + offsets, d_wag, mask=w_mask)
    tl.store(DWBP_PART + offsets, d_wbp, mask=w_mask)
    tl.store(DWBG_PART + offsets, d_wbg, mask=w_mask)


@triton.jit
def _triangle_bwd_dw_out_kernel(
    Z, X, DOUT, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, NORM_OUT_W, NORM_OUT_B,
    MEAN_OUT, RSTD_OUT, WG, WZ, DWG_PART, DWZ_PART,
    n_rows, n_ch, n_hidden, pair_rows, n_splits,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """Partial gradients of linear_g and linear_z for one output-channel chunk and row split."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    hids = tl.arange(0, BLOCK_HF)
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden
    out_mask = outs < n_ch

    d_wg = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
    d_wz = tl.zeros((BLOCK_N, BLOCK_HF), dtype=tl.float32)
    zeros_n = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < n_rows
        zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask,
                            col_mask, n_ch, PRECISION)
        xn, _, _ = _load_xn(X, NORM_OUT_W, NORM_OUT_B, MEAN_OUT, RSTD_OUT, rows, hids, row_mask,
                            hid_mask, n_hidden, pair_rows, PRECISION)
        wg = _load_weight(WG, outs, cols, out_mask, col_mask, n_ch, zn.dtype, PRECISION)
        wz = _load_weight(WZ, outs, hids, out_mask, hid_mask, n_hidden, zn.dtype, PRECISION)
        gate = tl.sigmoid(_mma(zn, tl.trans(wg), zeros_n, PRECISION))
        y = _mma(xn, tl.trans(wz), zeros_n, PRECISION)
        # padded rows load dout = 0 and add nothing
        dout = tl.load(DOUT + rows[:, None] * n_ch + outs[None, :],
                       mask=row_mask[:, None] & out_mask[None, :], other=0.0).to(tl.float32)
        d_y = _cast(dout * gate, zn.dtype, PRECISION)
        d_gate_logit = _cast(dout * y * gate * (1.0 - gate), zn.dtype, PRECISION)
        d_wz = _mma(tl.trans(d_y), xn, d_wz, PRECISION)
        d_wg = _mma(tl.trans(d_gate_logit), zn, d_wg, PRECISION)
    part = pid_s * n_ch
    tl.store(DWG_PART + (part + outs[:, None]) * n_ch + cols[None, :], d_wg,
             mask=out_mask[:, None] & col_mask[None, :])
    tl.store(DWZ_PART + (part + outs[:, None]) * n_hidden + hids[None, :], d_wz,
             mask=out_mask[:, None] & hid_mask[None, :])


def _launch_opts(config: dict[str, int]) -> dict[str, int]:
    return {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}


def _block_m(kernel: str, *widths: int) -> tuple[dict[str, int], int]:
    config = _common.kernel_config(_OP, kernel)
    return config, _common.fit_block_m(config["BLOCK_M"], max(widths))


def _project(z2d, mask_rows, norm_in_weight, norm_in_bias, w_ap, w_ag, w_bp, w_bg, eps,
             batch, length, mean_in=None, rstd_in=None):
    """a, b as [B, H, L, L]; fills mean_in / rstd_in when given."""
    n_rows, n_ch = z2d.shape
    n_hidden = w_ap.shape[0]
    a = torch.empty((batch, n_hidden, length, length), device=z2d.device, dtype=z2d.dtype)
    b = torch.empty_like(a)
    block_c = _common.block_for(n_ch)
    config, block_m = _block_m("proj", block_c)
    store_stats = mean_in is not None
    _triangle_proj_kernel[(triton.cdiv(n_rows, block_m),)](
        z2d, mask_rows if mask_rows is not None else z2d,
        norm_in_weight, norm_in_bias, w_ap, w_ag, w_bp, w_bg, a, b,
        mean_in if store_stats else z2d, rstd_in if store_stats else z2d,
        n_rows, n_ch, n_hidden, length * length, eps,
        HAS_MASK=mask_rows is not None,
        STORE_STATS=store_stats,
        PRECISION=_common.dot_precision(z2d.dtype),
        BLOCK_M=block_m, BLOCK_H=min(config["BLOCK_H"], _common.block_for(n_hidden)),
        BLOCK_C=block_c,
        **_launch_opts(config),
    )
    return a, b


def _triangular_product(a, b, direction):
    # [B, H, L, L] per channel: outgoing x_ij = sum_k a_ik b_jk, incoming x_ij = sum_k a_ki b_kj
    if direction == "outgoing":
        return torch.matmul(a, b.transpose(-1, -2))
    return torch.matmul(a.transpose(-1, -2), b)


def triangle_mult_fwd(z, mask, params, direction, eps):
    """z [B, L, L, C] -> (out, saved tensors for triangle_mult_bwd)."""
    (norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z) = params
    batch, length, _, n_ch = z.shape
    n_hidden = w_ap.shape[0]
    z2d = z.reshape(-1, n_ch)
    n_rows = z2d.shape[0]
    mask_rows = None if mask is None else mask.reshape(-1).view(torch.uint8)
    stats = torch.empty((4, n_rows), device=z.device, dtype=torch.float32)
    mean_in, rstd_in, mean_out, rstd_out = stats

    a, b = _project(z2d, mask_rows, norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, eps,
                    batch, length, mean_in, rstd_in)
    x = _triangular_product(a, b, direction)
    del a, b

    out = torch.empty_like(z2d)
    block_c, block_hf = _common.block_for(n_ch), _common.block_for(n_hidden)
    config, block_m = _block_m("out", block_c, block_hf)
    _triangle_out_kernel[(triton.cdiv(n_rows, block_m),)](
        z2d, x, norm_in_w, norm_in_b, mean_in, rstd_in, norm_out_w, norm_out_b, w_g, w_z,
        out, mean_out, rstd_out,
        n_rows, n_ch, n_hidden, length * length, eps,
        PRECISION=_common.dot_precision(z.dtype),
        BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_HF=block_hf,
        **_launch_opts(config),
    )
    return out.view(z.shape), (z2d, mask_rows, x, stats)


def triangle_mult_bwd(dout, z2d, mask_rows, x, stats, params, direction, eps):
    """Gradients (dz [M, C], d_params in the order of params)."""
    (norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, w_g, norm_out_w, norm_out_b, w_z) = params
    batch, n_hidden, length, _ = x.shape
    n_rows, n_ch = z2d.shape
    pair_rows = length * length
    mean_in, rstd_in, mean_out, rstd_out = stats
    device = z2d.device
    precision = _common.dot_precision(z2d.dtype)
    block_c, block_hf = _common.block_for(n_ch), _common.block_for(n_hidden)
    has_mask = mask_rows is not None
    mask_arg = mask_rows if has_mask else z2d

    # 1. dx through gate * linear_z(LayerNorm(x))
    config, block_m = _block_m("bwd_out", block_c, block_hf)
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x)
    dnorm_out_part = torch.empty((2, n_tiles, n_hidden), device=device, dtype=torch.float32)
    _triangle_bwd_out_kernel[(n_tiles,)](
        z2d, x, dout, norm_in_w, norm_in_b, mean_in, rstd_in, norm_out_w, norm_out_b,
        mean_out, rstd_out, w_g, w_z, dx, dnorm_out_part[0], dnorm_out_part[1],
        n_rows, n_ch, n_hidden, pair_rows,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_HF=block_hf,
        **_launch_opts(config),
    )

    # 2. weight gradients of linear_g and linear_z
    config, block_m = _block_m("bwd_dw_out", block_c, block_hf)
    block_n = min(config["BLOCK_N"], block_c)
    n_out_tiles = triton.cdiv(n_ch, block_n)
    n_splits = _common.row_splits(triton.cdiv(n_rows, block_m), n_out_tiles, device)
    dwg_part = torch.empty((n_splits, n_ch, n_ch), device=device, dtype=torch.float32)
    dwz_part = torch.empty((n_splits, n_ch, n_hidden), device=device, dtype=torch.float32)
    _triangle_bwd_dw_out_kernel[(n_out_tiles, n_splits)](
        z2d, x, dout, norm_in_w, norm_in_b, mean_in, rstd_in, norm_out_w, norm_out_b,
        mean_out, rstd_out, w_g, w_z, dwg_part, dwz_part,
        n_rows, n_ch, n_hidden, pair_rows, n_splits,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_HF=block_hf,
        **_launch_opts(config),
    )

    # 3. da, db through the triangular product; a and b recomputed from z
    a, b = _project(z2d, mask_rows, norm_in_w, norm_in_b, w_ap, w_ag, w_bp, w_bg, eps,
                    batch, length)
    if direction == "outgoing":  # x = a b^T
        da = torch.matmul(dx, b)
        db = torch.matmul(dx.transpose(-1, -2), a)
    else:  # x = a^T b
        da = torch.matmul(b, dx.transpose(-1, -2))
        db = torch.matmul(a, dx)
    del a, b, dx

    # 4. dz and LayerNorm(z) gradients
    config, block_m = _block_m("bwd_proj", block_c, block_hf)
    n_tiles = triton.cdiv(n_rows, block_m)
    dz = torch.empty_like(z2d)
    dnorm_in_part = torch.empty((2, n_tiles, n_ch), device=device, dtype=torch.float32)
    _triangle_bwd_proj_kernel[(n_tiles,)](
        z2d, mask_arg, x, da, db, dout, norm_in_w, norm_in_b, mean_in, rstd_in,
        norm_out_w, norm_out_b, mean_out, rstd_out, w_ap, w_ag, w_bp, w_bg, w_g, w_z,
        dz, dnorm_in_part[0], dnorm_in_part[1],
        n_rows, n_ch, n_hidden, pair_rows,
        HAS_MASK=has_mask,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_H=min(config["BLOCK_H"], block_hf), BLOCK_C=block_c,
        BLOCK_HF=block_hf,
        **_launch_opts(config),
    )

    # 5. weight gradients of the four projections
    config, block_m = _block_m("bwd_dw_proj", block_c)
    block_h = min(config["BLOCK_H"], block_hf)
    n_hidden_tiles = triton.cdiv(n_hidden, block_h)
    n_splits = _common.row_splits(triton.cdiv(n_rows, block_m), n_hidden_tiles, device)
    dwproj_part = torch.empty((4, n_splits, n_hidden, n_ch), device=device, dtype=torch.float32)
    _triangle_bwd_dw_proj_kernel[(n_hidden_tiles, n_splits)](
        z2d, mask_arg, da, db, norm_in_w, norm_in_b, mean_in, rstd_in, w_ap, w_ag, w_bp, w_bg,
        dwproj_part[0], dwproj_part[1], dwproj_part[2], dwproj_part[3],
        n_rows, n_ch, n_hidden, pair_rows, n_splits,
        HAS_MASK=has_mask,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_C=block_c,
        **_launch_opts(config),
    )
    dwproj = dwproj_part.sum(1)
    grads = (
        dnorm_in_part[0].sum(0), dnorm_in_part[1].sum(0),
        dwproj[0], dwproj[1], dwproj[2], dwproj[3],
        dwg_part.sum(0),
        dnorm_out_part[0].sum(0), dnorm_out_part[1].sum(0),
        dwz_part.sum(0),
    )
    return dz, tuple(g.to(p.dtype) for g, p in zip(grads, params))


class _TriangleMultFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, mask, direction, eps, *params):
        out, (z2d, mask_rows, x, stats) = triangle_mult_fwd(z.contiguous(), mask, params,
                                                            direction, eps)
        saved_mask = () if mask_rows is None else (mask_rows,)
        ctx.save_for_backward(z2d, x, stats, *params, *saved_mask)
        ctx.has_mask = mask_rows is not None
        ctx.direction = direction
        ctx.eps = eps
        ctx.z_shape = z.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        z2d, x, stats, *rest = ctx.saved_tensors
        params = tuple(rest[:10])
        mask_rows = rest[10] if ctx.has_mask else None
        dz, dparams = triangle_mult_bwd(dout.reshape(z2d.shape).contiguous(), z2d, mask_rows, x,
                                        stats, params, ctx.direction, ctx.eps)
        return (dz.view(ctx.z_shape), None, None, None, *dparams)


def triangle_mult(z, mask, norm_in_weight, norm_in_bias, weight_a_p, weight_a_g, weight_b_p,
                  weight_b_g, weight_g, norm_out_weight, norm_out_bias, weight_z,
                  direction="outgoing", eps=1e-5):
    """Triton triangle multiplicative update; same signature and numerics as
    triangle_mult_reference."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    _common.check_triton_inputs(_OP, z)
    z = _common.autocast_input(z)
    if z.dim() != 4 or z.shape[1] != z.shape[2]:
        raise ValueError(f"{_OP}: z must be [B, L, L, C], got {tuple(z.shape)}")
    if mask is not None and (mask.shape != z.shape[:3] or mask.dtype != torch.bool):
        raise ValueError(
            f"{_OP}: mask must be bool {tuple(z.shape[:3])}, got {mask.dtype} {tuple(mask.shape)}"
        )
    _common.max_channels_check(_OP, "dim", z.shape[-1], limit=256)
    _common.max_channels_check(_OP, "hidden_dim", weight_a_p.shape[0], limit=256)
    if z.numel() > 0:
        weight_a_p, weight_a_g, weight_b_p, weight_b_g, weight_g, weight_z = _common.weights_like(
            z, weight_a_p, weight_a_g, weight_b_p, weight_b_g, weight_g, weight_z)
    params = (norm_in_weight, norm_in_bias, weight_a_p, weight_a_g, weight_b_p, weight_b_g,
              weight_g, norm_out_weight, norm_out_bias, weight_z)
    if z.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return triangle_mult_reference(z, mask, *params, direction=direction, eps=eps)
    if mask is not None:
        mask = mask.contiguous()
    return _TriangleMultFunction.apply(z, mask, direction, eps, *params)


class TriangleMultiplication(nn.Module):
    """AF3 triangle multiplicative update; forward(z, mask) returns the update (no residual).

    impl="triton" runs the fused kernels; impl="torch" runs the PyTorch reference. Both hold
    identical parameters, so a state_dict moves between them.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int | None = None,
        direction: str = "outgoing",
        eps: float = 1e-5,
        impl: str = "triton",
    ) -> None:
        super().__init__()
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        self.impl = _common.check_impl(impl)
        self.direction = direction
        hidden_dim = dim if hidden_dim is None else hidden_dim
        self.norm_in = nn.LayerNorm(dim, eps=eps)
        self.linear_a_p = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_a_g = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_b_p = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_b_g = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_g = nn.Linear(dim, dim, bias=False)
        self.norm_out = nn.LayerNorm(hidden_dim, eps=eps)
        self.linear_z = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        fn = triangle_mult if self.impl == "triton" else triangle_mult_reference
        return fn(z, mask, self.norm_in.weight, self.norm_in.bias, self.linear_a_p.weight,
                  self.linear_a_g.weight, self.linear_b_p.weight, self.linear_b_g.weight,
                  self.linear_g.weight, self.norm_out.weight, self.norm_out.bias,
                  self.linear_z.weight, direction=self.direction, eps=self.norm_in.eps)
