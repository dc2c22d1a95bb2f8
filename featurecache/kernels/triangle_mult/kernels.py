"""The triangle multiplicative update's Triton kernels: the projection (LayerNorm(z), four gated
projections, mask), the output (LayerNorm(x), linear_z, the gate), and their gradients.

a, b, x and their gradients are channel-first, [B, H, L, L], for the batched matmul between the
kernels; z and the output are row-major pair rows [B * L * L, C].
"""

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
def _channel_first_base(rows, n_hidden, pair_rows):
    """Offset of channel 0 of each pair row r = (b, i, j) in a [B, H, L, L] tensor."""
    batch = rows // pair_rows
    return batch * n_hidden * pair_rows + (rows - batch * pair_rows)


@triton.jit
def _load_zn(Z, NORM_W, NORM_B, MEAN, RSTD, rows, cols, row_mask, col_mask, n_ch, PRECISION: tl.constexpr):
    """LayerNorm(z) of one row tile from saved statistics, in z's dtype: [BLOCK_M, BLOCK_C]."""
    z = tl.load(Z + rows[:, None] * n_ch + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    return layernorm_prologue_saved(z, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION)


@triton.jit
def _load_xn(
    X, NORM_W, NORM_B, MEAN, RSTD, rows, hids, row_mask, hid_mask, n_hidden, pair_rows, PRECISION: tl.constexpr
):
    """LayerNorm(x) of one row tile, x read channel-first; returns (xn, xhat, rstd)."""
    base = _channel_first_base(rows, n_hidden, pair_rows)
    x = tl.load(
        X + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
        mask=row_mask[:, None] & hid_mask[None, :],
        other=0.0,
    )
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, hids, hid_mask)
    return layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, hid_mask, PRECISION)


@triton.jit
def _load_weight(W, out_idx, in_idx, out_mask, in_mask, n_in, dtype: tl.constexpr, PRECISION: tl.constexpr):
    """Tile W[out_idx, in_idx] of a row-major [n_out, n_in] weight, cast to the compute dtype."""
    return cast(
        tl.load(W + out_idx[:, None] * n_in + in_idx[None, :], mask=out_mask[:, None] & in_mask[None, :], other=0.0),
        dtype,
        PRECISION,
    )


@triton.jit
def _pair_keep(MASK, rows, row_mask, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr):
    """1.0 for pair rows the mask keeps (all of them without a mask), 0.0 for the others: fp32."""
    keep = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
    if HAS_MASK:
        keep = tl.load(MASK + rows, mask=row_mask, other=0).to(tl.float32)
    return keep


@triton.jit
def _output_and_gate(
    zn, xn, WG, WZ, outs, out_mask, cols, col_mask, hids, hid_mask, n_ch, n_hidden, zeros, PRECISION: tl.constexpr
):
    """For the output channels `outs`: y = LayerNorm(x) @ Wz^T and gate = sigmoid(LayerNorm(z) @ Wg^T),
    fp32 like `zeros` [BLOCK_M, len(outs)], with the weight tiles they used (Wg's, Wz's)."""
    wg = _load_weight(WG, outs, cols, out_mask, col_mask, n_ch, zn.dtype, PRECISION)
    wz = _load_weight(WZ, outs, hids, out_mask, hid_mask, n_hidden, zn.dtype, PRECISION)
    y = mma(xn, tl.trans(wz), zeros, PRECISION)
    gate = tl.sigmoid(mma(zn, tl.trans(wg), zeros, PRECISION))
    return y, gate, wg, wz


@triton.jit
def _triangle_proj_kernel(
    Z,
    MASK,
    NORM_W,
    NORM_B,
    WAP,
    WAG,
    WBP,
    WBG,
    A,
    B,
    MEAN,
    RSTD,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    eps,
    HAS_MASK: tl.constexpr,
    STORE_STATS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """a, b = sigmoid(zn @ W_g^T) * (zn @ W_p^T) * mask, stored [B, H, L, L]."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch

    z = tl.load(Z + rows[:, None] * n_ch + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    zn, _, mean, rstd = layernorm_prologue(z, norm_w, norm_b, col_mask, n_ch, eps, PRECISION)
    if STORE_STATS:
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
    keep = _pair_keep(MASK, rows, row_mask, HAS_MASK, BLOCK_M)

    base = _channel_first_base(rows, n_hidden, pair_rows)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        hid_mask = hids < n_hidden
        w_a_p = _load_weight(WAP, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        a_p = mma(zn, tl.trans(w_a_p), zeros_h, PRECISION)
        w_a_g = _load_weight(WAG, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        a_g = mma(zn, tl.trans(w_a_g), zeros_h, PRECISION)
        w_b_p = _load_weight(WBP, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        b_p = mma(zn, tl.trans(w_b_p), zeros_h, PRECISION)
        w_b_g = _load_weight(WBG, hids, cols, hid_mask, col_mask, n_ch, z.dtype, PRECISION)
        b_g = mma(zn, tl.trans(w_b_g), zeros_h, PRECISION)
        out_offsets = base[:, None] + hids[None, :].to(tl.int64) * pair_rows
        out_mask = row_mask[:, None] & hid_mask[None, :]
        a = tl.sigmoid(a_g) * a_p * keep[:, None]
        b = tl.sigmoid(b_g) * b_p * keep[:, None]
        tl.store(A + out_offsets, cast(a, A.dtype.element_ty, PRECISION), mask=out_mask)
        tl.store(B + out_offsets, cast(b, B.dtype.element_ty, PRECISION), mask=out_mask)


@triton.jit
def _triangle_out_kernel(
    Z,
    X,
    NORM_IN_W,
    NORM_IN_B,
    MEAN_IN,
    RSTD_IN,
    NORM_OUT_W,
    NORM_OUT_B,
    WG,
    WZ,
    OUT,
    MEAN_OUT,
    RSTD_OUT,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    eps,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """out = sigmoid(zn @ Wg^T) * (LayerNorm(x) @ Wz^T); x read channel-first."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    hids = tl.arange(0, BLOCK_HF)
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden

    base = _channel_first_base(rows, n_hidden, pair_rows)
    x = tl.load(
        X + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
        mask=row_mask[:, None] & hid_mask[None, :],
        other=0.0,
    )
    norm_w, norm_b = layernorm_params(NORM_OUT_W, NORM_OUT_B, hids, hid_mask)
    xn, _, mean, rstd = layernorm_prologue(x, norm_w, norm_b, hid_mask, n_hidden, eps, PRECISION)
    tl.store(MEAN_OUT + rows, mean, mask=row_mask)
    tl.store(RSTD_OUT + rows, rstd, mask=row_mask)
    zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask, col_mask, n_ch, PRECISION)

    y, gate, _, _ = _output_and_gate(
        zn,
        xn,
        WG,
        WZ,
        cols,
        col_mask,
        cols,
        col_mask,
        hids,
        hid_mask,
        n_ch,
        n_hidden,
        tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32),
        PRECISION,
    )
    out = cast(gate * y, OUT.dtype.element_ty, PRECISION)
    tl.store(OUT + rows[:, None] * n_ch + cols[None, :], out, mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _triangle_bwd_out_kernel(
    Z,
    X,
    DOUT,
    NORM_IN_W,
    NORM_IN_B,
    MEAN_IN,
    RSTD_IN,
    NORM_OUT_W,
    NORM_OUT_B,
    MEAN_OUT,
    RSTD_OUT,
    WG,
    WZ,
    DX,
    DNORM_W_PART,
    DNORM_B_PART,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """dx (channel-first, for the matmul backward) and partial LayerNorm(x) parameter grads."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    hids = tl.arange(0, BLOCK_HF)
    col_mask = cols < n_ch
    hid_mask = hids < n_hidden

    zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask, col_mask, n_ch, PRECISION)
    xn, xhat, rstd = _load_xn(
        X, NORM_OUT_W, NORM_OUT_B, MEAN_OUT, RSTD_OUT, rows, hids, row_mask, hid_mask, n_hidden, pair_rows, PRECISION
    )
    dout = tl.load(DOUT + rows[:, None] * n_ch + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    _, gate, _, wz = _output_and_gate(
        zn,
        xn,
        WG,
        WZ,
        cols,
        col_mask,
        cols,
        col_mask,
        hids,
        hid_mask,
        n_ch,
        n_hidden,
        tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32),
        PRECISION,
    )
    d_y = cast(dout.to(tl.float32) * gate, zn.dtype, PRECISION)
    d_xn = mma(d_y, wz, tl.zeros((BLOCK_M, BLOCK_HF), dtype=tl.float32), PRECISION)

    norm_w, _ = layernorm_params(NORM_OUT_W, NORM_OUT_B, hids, hid_mask)
    dx = layernorm_backward(d_xn, xhat, rstd, norm_w, hids, hid_mask, n_hidden, DNORM_W_PART, DNORM_B_PART, pid)
    base = _channel_first_base(rows, n_hidden, pair_rows)
    tl.store(
        DX + base[:, None] + hids[None, :].to(tl.int64) * pair_rows,
        cast(dx, DX.dtype.element_ty, PRECISION),
        mask=row_mask[:, None] & hid_mask[None, :],
    )


@triton.jit
def _gated_projection_bwd(
    zn, d_out, keep, WP, WG, hids, cols, hid_mask, col_mask, n_ch, zeros_h, PRECISION: tl.constexpr
):
    """For out = sigmoid(zn Wg^T) * (zn Wp^T) * keep: gradients wrt the two projections (fp32)."""
    w_p = _load_weight(WP, hids, cols, hid_mask, col_mask, n_ch, zn.dtype, PRECISION)
    w_g = _load_weight(WG, hids, cols, hid_mask, col_mask, n_ch, zn.dtype, PRECISION)
    proj = mma(zn, tl.trans(w_p), zeros_h, PRECISION)
    gate = tl.sigmoid(mma(zn, tl.trans(w_g), zeros_h, PRECISION))
    d_masked = d_out * keep[:, None]
    return d_masked * gate, d_masked * proj * gate * (1.0 - gate), w_p, w_g


@triton.jit
def _triangle_bwd_proj_kernel(
    Z,
    MASK,
    X,
    DA,
    DB,
    DOUT,
    NORM_IN_W,
    NORM_IN_B,
    MEAN_IN,
    RSTD_IN,
    NORM_OUT_W,
    NORM_OUT_B,
    MEAN_OUT,
    RSTD_OUT,
    WAP,
    WAG,
    WBP,
    WBG,
    WG,
    WZ,
    DZ,
    DNORM_W_PART,
    DNORM_B_PART,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HF: tl.constexpr,
):
    """dz through the four gated projections and the output gate, and partial LN(z) grads."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch

    zn, zhat, rstd_in = _load_zn(
        Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask, col_mask, n_ch, PRECISION
    )
    keep = _pair_keep(MASK, rows, row_mask, HAS_MASK, BLOCK_M)
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
        d_ap, d_ag, w_ap, w_ag = _gated_projection_bwd(
            zn, d_a, keep, WAP, WAG, hids, cols, hid_mask, col_mask, n_ch, zeros_h, PRECISION
        )
        d_zn = mma(cast(d_ap, zn.dtype, PRECISION), w_ap, d_zn, PRECISION)
        d_zn = mma(cast(d_ag, zn.dtype, PRECISION), w_ag, d_zn, PRECISION)
        d_bp, d_bg, w_bp, w_bg = _gated_projection_bwd(
            zn, d_b, keep, WBP, WBG, hids, cols, hid_mask, col_mask, n_ch, zeros_h, PRECISION
        )
        d_zn = mma(cast(d_bp, zn.dtype, PRECISION), w_bp, d_zn, PRECISION)
        d_zn = mma(cast(d_bg, zn.dtype, PRECISION), w_bg, d_zn, PRECISION)

    # output gate: d(zn @ Wg^T) = dout * y * gate * (1 - gate), y recomputed from x
    hids_full = tl.arange(0, BLOCK_HF)
    hid_full_mask = hids_full < n_hidden
    xn, _, _ = _load_xn(
        X,
        NORM_OUT_W,
        NORM_OUT_B,
        MEAN_OUT,
        RSTD_OUT,
        rows,
        hids_full,
        row_mask,
        hid_full_mask,
        n_hidden,
        pair_rows,
        PRECISION,
    )
    y, gate, wg, _ = _output_and_gate(
        zn,
        xn,
        WG,
        WZ,
        cols,
        col_mask,
        cols,
        col_mask,
        hids_full,
        hid_full_mask,
        n_ch,
        n_hidden,
        tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32),
        PRECISION,
    )
    dout = tl.load(
        DOUT + rows[:, None] * n_ch + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0
    ).to(tl.float32)
    d_gate_logit = dout * y * gate * (1.0 - gate)
    d_zn = mma(cast(d_gate_logit, zn.dtype, PRECISION), wg, d_zn, PRECISION)

    norm_w, _ = layernorm_params(NORM_IN_W, NORM_IN_B, cols, col_mask)
    dz = layernorm_backward(d_zn, zhat, rstd_in, norm_w, cols, col_mask, n_ch, DNORM_W_PART, DNORM_B_PART, pid)
    tl.store(
        DZ + rows[:, None] * n_ch + cols[None, :],
        cast(dz, DZ.dtype.element_ty, PRECISION),
        mask=row_mask[:, None] & col_mask[None, :],
    )


@triton.jit
def _triangle_bwd_dw_proj_kernel(
    Z,
    MASK,
    DA,
    DB,
    NORM_IN_W,
    NORM_IN_B,
    MEAN_IN,
    RSTD_IN,
    WAP,
    WAG,
    WBP,
    WBG,
    DWAP_PART,
    DWAG_PART,
    DWBP_PART,
    DWBG_PART,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    n_splits,
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
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask, col_mask, n_ch, PRECISION)
        keep = _pair_keep(MASK, rows, row_mask, HAS_MASK, BLOCK_M)
        base = _channel_first_base(rows, n_hidden, pair_rows)
        offsets = base[:, None] + hids[None, :].to(tl.int64) * pair_rows
        tile_mask = row_mask[:, None] & hid_mask[None, :]
        # padded rows load d_a = d_b = 0 and add nothing
        d_a = tl.load(DA + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_b = tl.load(DB + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        d_ap, d_ag, _, _ = _gated_projection_bwd(
            zn, d_a, keep, WAP, WAG, hids, cols, hid_mask, col_mask, n_ch, zeros_h, PRECISION
        )
        d_bp, d_bg, _, _ = _gated_projection_bwd(
            zn, d_b, keep, WBP, WBG, hids, cols, hid_mask, col_mask, n_ch, zeros_h, PRECISION
        )
        d_wap = mma(tl.trans(cast(d_ap, zn.dtype, PRECISION)), zn, d_wap, PRECISION)
        d_wag = mma(tl.trans(cast(d_ag, zn.dtype, PRECISION)), zn, d_wag, PRECISION)
        d_wbp = mma(tl.trans(cast(d_bp, zn.dtype, PRECISION)), zn, d_wbp, PRECISION)
        d_wbg = mma(tl.trans(cast(d_bg, zn.dtype, PRECISION)), zn, d_wbg, PRECISION)
    offsets = pid_s * n_hidden * n_ch + hids[:, None] * n_ch + cols[None, :]
    w_mask = hid_mask[:, None] & col_mask[None, :]
    tl.store(DWAP_PART + offsets, d_wap, mask=w_mask)
    tl.store(DWAG_PART + offsets, d_wag, mask=w_mask)
    tl.store(DWBP_PART + offsets, d_wbp, mask=w_mask)
    tl.store(DWBG_PART + offsets, d_wbg, mask=w_mask)


@triton.jit
def _triangle_bwd_dw_out_kernel(
    Z,
    X,
    DOUT,
    NORM_IN_W,
    NORM_IN_B,
    MEAN_IN,
    RSTD_IN,
    NORM_OUT_W,
    NORM_OUT_B,
    MEAN_OUT,
    RSTD_OUT,
    WG,
    WZ,
    DWG_PART,
    DWZ_PART,
    n_rows,
    n_ch,
    n_hidden,
    pair_rows,
    n_splits,
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
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        zn, _, _ = _load_zn(Z, NORM_IN_W, NORM_IN_B, MEAN_IN, RSTD_IN, rows, cols, row_mask, col_mask, n_ch, PRECISION)
        xn, _, _ = _load_xn(
            X,
            NORM_OUT_W,
            NORM_OUT_B,
            MEAN_OUT,
            RSTD_OUT,
            rows,
            hids,
            row_mask,
            hid_mask,
            n_hidden,
            pair_rows,
            PRECISION,
        )
        y, gate, _, _ = _output_and_gate(
            zn, xn, WG, WZ, outs, out_mask, cols, col_mask, hids, hid_mask, n_ch, n_hidden, zeros_n, PRECISION
        )
        # padded rows load dout = 0 and add nothing
        dout = tl.load(
            DOUT + rows[:, None] * n_ch + outs[None, :], mask=row_mask[:, None] & out_mask[None, :], other=0.0
        ).to(tl.float32)
        d_y = cast(dout * gate, zn.dtype, PRECISION)
        d_gate_logit = cast(dout * y * gate * (1.0 - gate), zn.dtype, PRECISION)
        d_wz = mma(tl.trans(d_y), xn, d_wz, PRECISION)
        d_wg = mma(tl.trans(d_gate_logit), zn, d_wg, PRECISION)
    part = pid_s * n_ch
    tl.store(DWG_PART + (part + outs[:, None]) * n_ch + cols[None, :], d_wg, mask=out_mask[:, None] & col_mask[None, :])
    tl.store(
        DWZ_PART + (part + outs[:, None]) * n_hidden + hids[None, :], d_wz, mask=out_mask[:, None] & hid_mask[None, :]
    )
