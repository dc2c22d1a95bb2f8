"""Windowed attention's Triton kernels: one program owns one window of one (batch, head) and
walks the diffusion samples of its group: the window's key mask is loaded once, its bias tile is
read from memory once and from L1/L2 for the other samples (held in registers it made the
compiler spill; see _logits).

A window is small (AF3: 32 queries x 128 keys), so a program holds all of its logits at once:
a plain softmax, no online rescaling. Two backwards: in one pass (_window_bwd_kernel: dQ, dK, dV
and dS of a window from the same tile; it spills registers at 32 x 128 x 32), or in two passes
over key blocks (_window_bwd_split_kernel, the default: dQ, then dK, dV and dBias). A window's
keys are its own copy, so nothing is shared between programs and nothing needs atomics. dBias,
the sum of dS over the samples, is accumulated in registers in sample order: reproducible.

Logits are in log2 units (exp2 is the GPU's native exponential), as in evo_attention: the bias is
multiplied by LOG2E where it is loaded, the saved logsumexp is in log2 units.
"""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import cast, mma

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _window_and_keys(
    Mask, num_heads, keys, stride_mb, stride_mw, stride_mk, HAS_MASK: tl.constexpr, BLOCK_K: tl.constexpr
):
    """This program's (window, batch, head) and which keys it attends to ([BLOCK_K])."""
    window = tl.program_id(0).to(tl.int64)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    attend = offs_k < keys
    if HAS_MASK:
        attend = attend & (
            tl.load(Mask + batch * stride_mb + window * stride_mw + offs_k * stride_mk, mask=attend, other=0) != 0
        )
    return window, batch, head, attend


@triton.jit
def _logits(q, k, bias_ptrs, bias_tile, attend, scale_log2, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """The window's logits in log2 units, -inf at keys not attended. The bias tile is loaded for
    every sample (from L1/L2 after the first) rather than held in registers across the loop: the
    backward already keeps dBias's [queries, keys] accumulator there."""
    s = mma(q, tl.trans(k), None, PRECISION) * scale_log2
    if HAS_BIAS:
        s += tl.load(bias_ptrs, mask=bias_tile, other=0.0).to(tl.float32) * LOG2E
    return tl.where(attend[None, :], s, float("-inf"))


@triton.jit
def _window_fwd_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    Out,
    Lse,
    stride_qb,
    stride_qs,
    stride_qw,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kw,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vw,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bw,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mw,
    stride_mk,
    stride_ob,
    stride_os,
    stride_ow,
    stride_ol,
    stride_oh,
    stride_od,
    num_heads,
    num_windows,
    num_samples,
    queries,
    keys,
    head_dim,
    scale_log2,
    SAMPLES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    window, batch, head, attend = _window_and_keys(
        Mask, num_heads, keys, stride_mb, stride_mw, stride_mk, HAS_MASK, BLOCK_K
    )
    offs_q = tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    valid_q = offs_q < queries
    valid_k = offs_k < keys
    valid_d = offs_d < head_dim
    q_tile = valid_q[:, None] & valid_d[None, :]
    kv_tile = valid_k[:, None] & valid_d[None, :]
    bias_tile = valid_q[:, None] & valid_k[None, :]
    bias_ptrs = (
        Bias
        + batch * stride_bb
        + window * stride_bw
        + head * stride_bh
        + offs_q[:, None] * stride_bq
        + offs_k[None, :] * stride_bk
    )

    # This program's samples: a group of SAMPLES (the last group may be shorter).
    count = tl.minimum(num_samples - tl.program_id(2) * SAMPLES, SAMPLES)
    first = tl.program_id(2).to(tl.int64) * SAMPLES
    for index in range(0, count):
        sample = first + index
        q = tl.load(
            Q
            + batch * stride_qb
            + sample * stride_qs
            + window * stride_qw
            + head * stride_qh
            + offs_q[:, None] * stride_ql
            + offs_d[None, :] * stride_qd,
            mask=q_tile,
            other=0.0,
        )
        k_base = K + batch * stride_kb + sample * stride_ks + window * stride_kw + head * stride_kh
        k = tl.load(k_base + offs_k[:, None] * stride_kl + offs_d[None, :] * stride_kd, mask=kv_tile, other=0.0)
        v = tl.load(
            V
            + batch * stride_vb
            + sample * stride_vs
            + window * stride_vw
            + head * stride_vh
            + offs_k[:, None] * stride_vl
            + offs_d[None, :] * stride_vd,
            mask=kv_tile,
            other=0.0,
        )
        s = _logits(q, k, bias_ptrs, bias_tile, attend, scale_log2, HAS_BIAS, PRECISION)
        row_max = tl.max(s, 1)
        # A query with every key masked keeps -inf: shift by 0 there so exp2 gives 0, not NaN.
        shift = tl.where(row_max == float("-inf"), 0.0, row_max)
        p = tl.math.exp2(s - shift[:, None])
        total = tl.sum(p, 1)
        empty = total == 0.0
        out = mma(cast(p, v.dtype, PRECISION), v, None, PRECISION) / tl.where(empty, 1.0, total)[:, None]
        tl.store(
            Out
            + batch * stride_ob
            + sample * stride_os
            + window * stride_ow
            + head * stride_oh
            + offs_q[:, None] * stride_ol
            + offs_d[None, :] * stride_od,
            cast(out, Out.dtype.element_ty, PRECISION),
            mask=q_tile,
        )
        # +inf for an empty query makes every recomputed probability exactly 0 in the backward.
        lse = tl.where(empty, float("inf"), shift + tl.math.log2(tl.where(empty, 1.0, total)))
        # Lse is contiguous [B, S, W, H, Q].
        lse_base = (((batch * num_samples + sample) * num_windows + window) * num_heads + head) * queries
        tl.store(Lse + lse_base + offs_q, lse, mask=valid_q)


@triton.jit
def _window_bwd_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    Out,
    DOut,
    Lse,
    DQ,
    DK,
    DV,
    DBias,
    stride_qb,
    stride_qs,
    stride_qw,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kw,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vw,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bw,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mw,
    stride_mk,
    stride_ob,
    stride_os,
    stride_ow,
    stride_ol,
    stride_oh,
    stride_od,
    stride_gb,
    stride_gs,
    stride_gw,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_dbg,
    stride_dbb,
    stride_dbw,
    stride_dbh,
    stride_dbq,
    stride_dbk,
    num_heads,
    num_windows,
    num_samples,
    queries,
    keys,
    head_dim,
    scale,
    scale_log2,
    SAMPLES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    STORE_DBIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # dq, dk, dv are fresh tensors laid out like q, k, v would be if contiguous:
    # [B, S, W, Q or K, H, D]; the strides below are derived from the sizes.
    window, batch, head, attend = _window_and_keys(
        Mask, num_heads, keys, stride_mb, stride_mw, stride_mk, HAS_MASK, BLOCK_K
    )
    offs_q = tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    valid_q = offs_q < queries
    valid_k = offs_k < keys
    valid_d = offs_d < head_dim
    q_tile = valid_q[:, None] & valid_d[None, :]
    kv_tile = valid_k[:, None] & valid_d[None, :]
    bias_tile = valid_q[:, None] & valid_k[None, :]
    bias_ptrs = (
        Bias
        + batch * stride_bb
        + window * stride_bw
        + head * stride_bh
        + offs_q[:, None] * stride_bq
        + offs_k[None, :] * stride_bk
    )
    row = num_heads * head_dim  # the contiguous gradients' stride between positions

    dbias = tl.zeros([BLOCK_Q, BLOCK_K], tl.float32)
    count = tl.minimum(num_samples - tl.program_id(2) * SAMPLES, SAMPLES)
    group = tl.program_id(2).to(tl.int64)
    first = group * SAMPLES
    for index in range(0, count):
        sample = first + index
        q = tl.load(
            Q
            + batch * stride_qb
            + sample * stride_qs
            + window * stride_qw
            + head * stride_qh
            + offs_q[:, None] * stride_ql
            + offs_d[None, :] * stride_qd,
            mask=q_tile,
            other=0.0,
        )
        k = tl.load(
            K
            + batch * stride_kb
            + sample * stride_ks
            + window * stride_kw
            + head * stride_kh
            + offs_k[:, None] * stride_kl
            + offs_d[None, :] * stride_kd,
            mask=kv_tile,
            other=0.0,
        )
        v = tl.load(
            V
            + batch * stride_vb
            + sample * stride_vs
            + window * stride_vw
            + head * stride_vh
            + offs_k[:, None] * stride_vl
            + offs_d[None, :] * stride_vd,
            mask=kv_tile,
            other=0.0,
        )
        o = tl.load(
            Out
            + batch * stride_ob
            + sample * stride_os
            + window * stride_ow
            + head * stride_oh
            + offs_q[:, None] * stride_ol
            + offs_d[None, :] * stride_od,
            mask=q_tile,
            other=0.0,
        )
        do = tl.load(
            DOut
            + batch * stride_gb
            + sample * stride_gs
            + window * stride_gw
            + head * stride_gh
            + offs_q[:, None] * stride_gl
            + offs_d[None, :] * stride_gd,
            mask=q_tile,
            other=0.0,
        )
        lse_base = (((batch * num_samples + sample) * num_windows + window) * num_heads + head) * queries
        lse = tl.load(Lse + lse_base + offs_q, mask=valid_q, other=float("inf"))
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)

        s = _logits(q, k, bias_ptrs, bias_tile, attend, scale_log2, HAS_BIAS, PRECISION)
        p = tl.math.exp2(s - lse[:, None])
        # Each gradient is stored as soon as it is formed, so that fewer tiles are live at once.
        window_index = (batch * num_samples + sample) * num_windows + window
        q_base = window_index * queries * row + head * head_dim
        k_base = window_index * keys * row + head * head_dim
        dv = mma(tl.trans(cast(p, do.dtype, PRECISION)), do, None, PRECISION)
        tl.store(
            DV + k_base + offs_k[:, None] * row + offs_d[None, :],
            cast(dv, DV.dtype.element_ty, PRECISION),
            mask=kv_tile,
        )
        ds = p * (mma(do, tl.trans(v), None, PRECISION) - delta[:, None])
        dbias += ds
        ds = cast(ds, q.dtype, PRECISION)
        dk = mma(tl.trans(ds), q, None, PRECISION) * scale
        tl.store(
            DK + k_base + offs_k[:, None] * row + offs_d[None, :],
            cast(dk, DK.dtype.element_ty, PRECISION),
            mask=kv_tile,
        )
        dq = mma(ds, k, None, PRECISION) * scale
        tl.store(
            DQ + q_base + offs_q[:, None] * row + offs_d[None, :], cast(dq, DQ.dtype.element_ty, PRECISION), mask=q_tile
        )

    if STORE_DBIAS:
        # One slice per sample group (summed by the launcher when there are several).
        tl.store(
            DBias
            + group * stride_dbg
            + batch * stride_dbb
            + window * stride_dbw
            + head * stride_dbh
            + offs_q[:, None] * stride_dbq
            + offs_k[None, :] * stride_dbk,
            cast(dbias, DBias.dtype.element_ty, PRECISION),
            mask=bias_tile,
        )


@triton.jit
def _window_bwd_split_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    Out,
    DOut,
    Lse,
    Delta,
    DQ,
    DK,
    DV,
    DBias,
    stride_qb,
    stride_qs,
    stride_qw,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kw,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vw,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bw,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mw,
    stride_mk,
    stride_ob,
    stride_os,
    stride_ow,
    stride_ol,
    stride_oh,
    stride_od,
    stride_gb,
    stride_gs,
    stride_gw,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_dbg,
    stride_dbb,
    stride_dbw,
    stride_dbh,
    stride_dbq,
    stride_dbk,
    num_heads,
    num_windows,
    num_samples,
    queries,
    keys,
    head_dim,
    scale,
    scale_log2,
    DQ_PASS: tl.constexpr,
    SAMPLES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    STORE_DBIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # The backward in two passes over key blocks of BLOCK_KB, as EvoAttention's: DQ_PASS writes
    # dQ and delta = rowsum(dO * O) per sample; the other pass (launched after it) walks the key
    # blocks, and within each the samples, writing dK, dV and the block's dBias. P is recomputed
    # in both (7 products per score instead of 5), on [queries, BLOCK_KB] tiles, which keeps the
    # tiles live at once under the register file (the one-pass kernel spills).
    window = tl.program_id(0).to(tl.int64)
    batch = (tl.program_id(1) // num_heads).to(tl.int64)
    head = (tl.program_id(1) % num_heads).to(tl.int64)
    offs_q = tl.arange(0, BLOCK_Q)
    offs_c = tl.arange(0, BLOCK_KB)
    offs_d = tl.arange(0, BLOCK_D)
    valid_q = offs_q < queries
    valid_d = offs_d < head_dim
    q_tile = valid_q[:, None] & valid_d[None, :]
    row = num_heads * head_dim  # the contiguous gradients' stride between positions
    count = tl.minimum(num_samples - tl.program_id(2) * SAMPLES, SAMPLES)
    group = tl.program_id(2).to(tl.int64)
    first = group * SAMPLES
    if DQ_PASS:
        for index in range(0, count):
            sample = first + index
            q = tl.load(
                Q
                + batch * stride_qb
                + sample * stride_qs
                + window * stride_qw
                + head * stride_qh
                + offs_q[:, None] * stride_ql
                + offs_d[None, :] * stride_qd,
                mask=q_tile,
                other=0.0,
            )
            o = tl.load(
                Out
                + batch * stride_ob
                + sample * stride_os
                + window * stride_ow
                + head * stride_oh
                + offs_q[:, None] * stride_ol
                + offs_d[None, :] * stride_od,
                mask=q_tile,
                other=0.0,
            )
            do = tl.load(
                DOut
                + batch * stride_gb
                + sample * stride_gs
                + window * stride_gw
                + head * stride_gh
                + offs_q[:, None] * stride_gl
                + offs_d[None, :] * stride_gd,
                mask=q_tile,
                other=0.0,
            )
            window_index = (batch * num_samples + sample) * num_windows + window
            stat = (window_index * num_heads + head) * queries + offs_q
            lse = tl.load(Lse + stat, mask=valid_q, other=float("inf"))
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
            tl.store(Delta + stat, delta, mask=valid_q)
            dq = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
            for start in range(0, keys, BLOCK_KB):
                cols = start + offs_c
                attend = cols < keys
                if HAS_MASK:
                    attend = attend & (
                        tl.load(Mask + batch * stride_mb + window * stride_mw + cols * stride_mk, mask=attend, other=0)
                        != 0
                    )
                kv_tile = (cols < keys)[:, None] & valid_d[None, :]
                k = tl.load(
                    K
                    + batch * stride_kb
                    + sample * stride_ks
                    + window * stride_kw
                    + head * stride_kh
                    + cols[:, None] * stride_kl
                    + offs_d[None, :] * stride_kd,
                    mask=kv_tile,
                    other=0.0,
                )
                v = tl.load(
                    V
                    + batch * stride_vb
                    + sample * stride_vs
                    + window * stride_vw
                    + head * stride_vh
                    + cols[:, None] * stride_vl
                    + offs_d[None, :] * stride_vd,
                    mask=kv_tile,
                    other=0.0,
                )
                bias_ptrs = (
                    Bias
                    + batch * stride_bb
                    + window * stride_bw
                    + head * stride_bh
                    + offs_q[:, None] * stride_bq
                    + cols[None, :] * stride_bk
                )
                s = _logits(
                    q, k, bias_ptrs, valid_q[:, None] & (cols < keys)[None, :], attend, scale_log2, HAS_BIAS, PRECISION
                )
                p = tl.math.exp2(s - lse[:, None])
                ds = p * (mma(do, tl.trans(v), None, PRECISION) - delta[:, None])
                dq = mma(cast(ds, k.dtype, PRECISION), k, dq, PRECISION)
            q_base = window_index * queries * row + head * head_dim
            tl.store(
                DQ + q_base + offs_q[:, None] * row + offs_d[None, :],
                cast(dq * scale, DQ.dtype.element_ty, PRECISION),
                mask=q_tile,
            )
    else:
        for start in range(0, keys, BLOCK_KB):
            cols = start + offs_c
            valid_c = cols < keys
            attend = valid_c
            if HAS_MASK:
                attend = attend & (
                    tl.load(Mask + batch * stride_mb + window * stride_mw + cols * stride_mk, mask=valid_c, other=0)
                    != 0
                )
            kv_tile = valid_c[:, None] & valid_d[None, :]
            bias_tile = valid_q[:, None] & valid_c[None, :]
            bias_ptrs = (
                Bias
                + batch * stride_bb
                + window * stride_bw
                + head * stride_bh
                + offs_q[:, None] * stride_bq
                + cols[None, :] * stride_bk
            )
            dbias = tl.zeros([BLOCK_Q, BLOCK_KB], tl.float32)
            for index in range(0, count):
                sample = first + index
                q = tl.load(
                    Q
                    + batch * stride_qb
                    + sample * stride_qs
                    + window * stride_qw
                    + head * stride_qh
                    + offs_q[:, None] * stride_ql
                    + offs_d[None, :] * stride_qd,
                    mask=q_tile,
                    other=0.0,
                )
                do = tl.load(
                    DOut
                    + batch * stride_gb
                    + sample * stride_gs
                    + window * stride_gw
                    + head * stride_gh
                    + offs_q[:, None] * stride_gl
                    + offs_d[None, :] * stride_gd,
                    mask=q_tile,
                    other=0.0,
                )
                k = tl.load(
                    K
                    + batch * stride_kb
                    + sample * stride_ks
                    + window * stride_kw
                    + head * stride_kh
                    + cols[:, None] * stride_kl
                    + offs_d[None, :] * stride_kd,
                    mask=kv_tile,
                    other=0.0,
                )
                v = tl.load(
                    V
                    + batch * stride_vb
                    + sample * stride_vs
                    + window * stride_vw
                    + head * stride_vh
                    + cols[:, None] * stride_vl
                    + offs_d[None, :] * stride_vd,
                    mask=kv_tile,
                    other=0.0,
                )
                window_index = (batch * num_samples + sample) * num_windows + window
                stat = (window_index * num_heads + head) * queries + offs_q
                lse = tl.load(Lse + stat, mask=valid_q, other=float("inf"))
                delta = tl.load(Delta + stat, mask=valid_q, other=0.0)
                s = _logits(q, k, bias_ptrs, bias_tile, attend, scale_log2, HAS_BIAS, PRECISION)
                p = tl.math.exp2(s - lse[:, None])
                k_base = window_index * keys * row + head * head_dim
                dv = mma(tl.trans(cast(p, do.dtype, PRECISION)), do, None, PRECISION)
                tl.store(
                    DV + k_base + cols[:, None] * row + offs_d[None, :],
                    cast(dv, DV.dtype.element_ty, PRECISION),
                    mask=kv_tile,
                )
                ds = p * (mma(do, tl.trans(v), None, PRECISION) - delta[:, None])
                dbias += ds
                dk = mma(tl.trans(cast(ds, q.dtype, PRECISION)), q, None, PRECISION) * scale
                tl.store(
                    DK + k_base + cols[:, None] * row + offs_d[None, :],
                    cast(dk, DK.dtype.element_ty, PRECISION),
                    mask=kv_tile,
                )
            if STORE_DBIAS:
                tl.store(
                    DBias
                    + group * stride_dbg
                    + batch * stride_dbb
                    + window * stride_dbw
                    + head * stride_dbh
                    + offs_q[:, None] * stride_dbq
                    + cols[None, :] * stride_dbk,
                    cast(dbias, DBias.dtype.element_ty, PRECISION),
                    mask=bias_tile,
                )
