"""EvoAttention: attention with pair bias and key mask, as Triton kernels.

q, k, v: [B, N, L, H, D] with any strides; bias: [B, 1 or N, H, L, L] (fp32 or the input dtype);
mask: [B, N, L] bool (True = attend). Output [B, N, L, H, D]. Used by triangle attention (N = L
rows of the pair map), single attention with pair bias (N = 1) and template / MSA attention.

Kernels, flash-attention style with fp32 accumulation:
  forward   one program per (q block, row n, b*h): online softmax, writes out and the row's
            logsumexp (kept in log2 units, the kernels' working domain).
  backward  dQ per (q block, row n, b*h) looping over k blocks, which also writes
            delta = rowsum(dO * O) and, when the bias is per row, dBias; then dK/dV per
            (k block, row n, b*h) looping over q blocks; then, for a bias broadcast over N,
            dBias per (k block, q block, b*h) looping over the N rows in a fixed order, so the
            sum over N is bitwise reproducible (no atomics).
  Key loops stop at each row's last attended key, found once by the forward kernel.

Host time: a launch costs tens of microseconds of host time, as much as the kernels themselves at
N = 1, so a forward is one launch and a backward two (three with a shared bias), with no other
device work around them. In eager mode a torch.autograd.Function calls the launchers directly;
under torch.compile the same launchers run inside two torch.library custom ops
(featurecache::evo_attention_fwd / _bwd) with registered fake and autograd implementations, so
the compiled graph keeps them without a break.

When the bias is shared by all rows, the "rows" option of a kernel's block config lets one
program handle several rows at once (batched [rows, M, N] products), so each bias tile is loaded
and scaled once for all of them; the tuned config file says where that pays.

Programs of one row n and head are launched next to each other (q block is the fastest grid
axis) so k and v of that row stay in L2 for all its q blocks; a broadcast bias of one head is
L * L elements (1.2 MB in bf16 at L = 768), small enough to stay in L2 for every row that reads
it, which is what keeps the forward from moving the ~7 GB that re-reading an fp32 bias from
memory once per row would cost at L = 768.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from featurecache.kernels import _common
from featurecache.kernels.reference import evo_attention_reference

SUPPORTED_HEAD_DIMS = (8, 16, 24, 32, 48, 64, 128)
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CONFIG_FILE = pathlib.Path(__file__).with_name("configs") / "evo_attention.json"
_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _mma(a, b, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    # Triton's interpreter multiplies bf16 tiles as raw uint16 bits; upcasting the (already
    # bf16-rounded) operands there gives the GPU's result: bf16 products, fp32 accumulation.
    if UPCAST_DOT:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _key_end(mask_row, stride_ml, seq_len, SCAN: tl.constexpr):
    # One past the last attended key of one mask row, 0 when none. Key loops stop there: crop
    # padding sits at the end of the keys (about 10 % in training) and a padded row costs
    # nothing. Scanned in the forward kernel (no extra launch) and kept for the backward.
    end = tl.full([], 0, tl.int32)
    for start in range(0, seq_len, SCAN):
        idx = start + tl.arange(0, SCAN)
        attended = tl.load(mask_row + idx * stride_ml, mask=idx < seq_len, other=0) != 0
        end = tl.maximum(end, tl.max(tl.where(attended, idx + 1, 0), 0))
    return end


@triton.jit
def _key_ends_of_rows(mask_rows, valid_r, stride_ml, seq_len, ROWS: tl.constexpr, SCAN: tl.constexpr):
    # _key_end for a group of rows ([ROWS] pointers to their masks) at once.
    ends = tl.zeros([ROWS], tl.int32)
    for start in range(0, seq_len, SCAN):
        idx = start + tl.arange(0, SCAN)
        attended = tl.load(mask_rows[:, None] + idx[None, :] * stride_ml,
                           mask=valid_r[:, None] & (idx < seq_len)[None, :], other=0) != 0
        ends = tl.maximum(ends, tl.max(tl.where(attended, idx[None, :] + 1, 0), 1))
    return ends


@triton.jit
def _evo_attention_fwd_kernel(
    Q, K, V, Bias, Mask, KeyEnd, Out, Lse,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bn, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    num_heads, seq_len, head_dim, scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < seq_len
    valid_d = offs_d < head_dim

    q_base = Q + batch * stride_qb + row * stride_qn + head * stride_qh
    k_base = K + batch * stride_kb + row * stride_kn + head * stride_kh
    v_base = V + batch * stride_vb + row * stride_vn + head * stride_vh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    mask_base = Mask + batch * stride_mb + row * stride_mn

    q = tl.load(
        q_base + offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    key_end = seq_len
    if HAS_MASK:
        key_end = _key_end(mask_base, stride_ml, seq_len, SCAN_MASK)
    if pid_m == 0:
        tl.store(KeyEnd + batch * tl.num_programs(1) + row, key_end)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        # [BLOCK_D, BLOCK_N]: k read transposed through its strides, no copy.
        k_t = tl.load(
            k_base + cols[None, :] * stride_kl + offs_d[:, None] * stride_kd,
            mask=valid_d[:, None] & valid_n[None, :],
            other=0.0,
        )
        s = _mma(q, k_t, DOT_PRECISION, UPCAST_DOT) * scale_log2
        if HAS_BIAS:
            b = tl.load(
                bias_base + offs_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=valid_m[:, None] & valid_n[None, :],
                other=0.0,
            )
            s += b.to(tl.float32) * 1.4426950408889634
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols * stride_ml, mask=valid_n, other=0) != 0)
        s = tl.where(attend[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no key seen yet keeps m = -inf; shift by 0 there so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd,
            mask=valid_n[:, None] & valid_d[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _mma(p.to(v.dtype), v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    # +inf for fully masked rows makes every recomputed probability exactly 0 in the backward.
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    o_base = Out + batch * stride_ob + row * stride_on + head * stride_oh
    tl.store(
        o_base + offs_m[:, None] * stride_ol + offs_d[None, :] * stride_od,
        out.to(Out.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )
    # Lse is contiguous [B, N, H, L].
    lse_base = Lse + ((batch * tl.num_programs(1) + row) * num_heads + head) * seq_len
    tl.store(lse_base + offs_m, lse, mask=valid_m)


@triton.jit
def _evo_attention_fwd_rows_kernel(
    Q, K, V, Bias, Mask, KeyEnd, Out, Lse,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    num_heads, num_rows, seq_len, head_dim, scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # The forward for ROWS rows at once, for a bias shared by all rows: each bias tile is loaded
    # once and added to the logits of all ROWS rows (batched [ROWS, M, N] products), so bias
    # traffic drops ROWS-fold (3.6 GB per pass at L = 768, H = 4 in bf16 with one row each).
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_r = rows < num_rows
    valid_m = offs_m < seq_len
    valid_d = offs_d < head_dim

    q_mask = valid_r[:, None, None] & valid_m[None, :, None] & valid_d[None, None, :]
    q = tl.load(
        Q + batch * stride_qb + head * stride_qh + rows[:, None, None] * stride_qn
        + offs_m[None, :, None] * stride_ql + offs_d[None, None, :] * stride_qd,
        mask=q_mask,
        other=0.0,
    )
    k_base = K + batch * stride_kb + head * stride_kh + rows[:, None, None] * stride_kn
    v_base = V + batch * stride_vb + head * stride_vh + rows[:, None, None] * stride_vn
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask_base = Mask + batch * stride_mb + rows[:, None] * stride_mn

    m_i = tl.full([ROWS, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS, BLOCK_M], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_M, BLOCK_D], tl.float32)
    ends = tl.full([ROWS], seq_len, tl.int32)
    if HAS_MASK:
        ends = _key_ends_of_rows(Mask + batch * stride_mb + rows * stride_mn, valid_r, stride_ml, seq_len,
                                 ROWS, SCAN_MASK)
    if pid_m == 0:
        tl.store(KeyEnd + batch * num_rows + rows, ends, mask=valid_r)
    key_end = tl.max(tl.where(valid_r, ends, 0), 0)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        k_t = tl.load(
            k_base + offs_d[None, :, None] * stride_kd + cols[None, None, :] * stride_kl,
            mask=valid_r[:, None, None] & valid_d[None, :, None] & valid_n[None, None, :],
            other=0.0,
        )
        s = _mma(q, k_t, DOT_PRECISION, UPCAST_DOT) * scale_log2  # [ROWS, BLOCK_M, BLOCK_N]
        if HAS_BIAS:
            b = tl.load(
                bias_base + offs_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=valid_m[:, None] & valid_n[None, :],
                other=0.0,
            )
            s += (b.to(tl.float32) * 1.4426950408889634)[None, :, :]
        attend = valid_r[:, None] & valid_n[None, :]
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols[None, :] * stride_ml, mask=attend, other=0) != 0)
        s = tl.where(attend[:, None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, :, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 2)
        v = tl.load(
            v_base + cols[None, :, None] * stride_vl + offs_d[None, None, :] * stride_vd,
            mask=valid_r[:, None, None] & valid_n[None, :, None] & valid_d[None, None, :],
            other=0.0,
        )
        acc = acc * alpha[:, :, None] + _mma(p.to(v.dtype), v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, :, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    tl.store(
        Out + batch * stride_ob + head * stride_oh + rows[:, None, None] * stride_on
        + offs_m[None, :, None] * stride_ol + offs_d[None, None, :] * stride_od,
        out.to(Out.dtype.element_ty),
        mask=q_mask,
    )
    lse_offs = ((batch * num_rows + rows[:, None]) * num_heads + head) * seq_len + offs_m[None, :]
    tl.store(Lse + lse_offs, lse, mask=valid_r[:, None] & valid_m[None, :])


@triton.jit
def _evo_attention_bwd_kv_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DK, DV,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bn, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    num_heads, seq_len, head_dim, scale, scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program owns a block of keys of one row and head and loops over all queries;
    # probabilities are built transposed ([keys, queries]) so no tile needs tl.trans.
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    kv_tile = valid_n[:, None] & valid_d[None, :]

    k = tl.load(
        K + batch * stride_kb + row * stride_kn + head * stride_kh
        + cols[:, None] * stride_kl + offs_d[None, :] * stride_kd,
        mask=kv_tile,
        other=0.0,
    )
    v = tl.load(
        V + batch * stride_vb + row * stride_vn + head * stride_vh
        + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd,
        mask=kv_tile,
        other=0.0,
    )
    attend = valid_n
    if HAS_MASK:
        attend = attend & (
            tl.load(Mask + batch * stride_mb + row * stride_mn + cols * stride_ml, mask=valid_n, other=0)
            != 0
        )

    q_base = Q + batch * stride_qb + row * stride_qn + head * stride_qh
    do_base = DOut + batch * stride_gb + row * stride_gn + head * stride_gh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    stat_base = ((batch * tl.num_programs(1) + row) * num_heads + head) * seq_len

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    query_end = seq_len
    if HAS_MASK:
        # A key block past the row's last attended key has zero gradients: skip the loop.
        key_end = tl.load(KeyEnd + batch * tl.num_programs(1) + row)
        query_end = tl.where(pid_n * BLOCK_N < key_end, seq_len, 0)
    for start_m in range(0, query_end, BLOCK_M):
        rows_m = start_m + offs_m
        valid_m = rows_m < seq_len
        q_tile = valid_m[:, None] & valid_d[None, :]
        # Each tile is loaded once; tl.trans of a dot operand is a shared-memory layout, not a copy.
        q = tl.load(q_base + rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd, mask=q_tile, other=0.0)
        do = tl.load(do_base + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd, mask=q_tile, other=0.0)
        lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m, mask=valid_m, other=0.0)

        s_t = _mma(k, tl.trans(q), DOT_PRECISION, UPCAST_DOT) * scale_log2  # [BLOCK_N, BLOCK_M]
        if HAS_BIAS:
            b_t = tl.load(
                bias_base + rows_m[None, :] * stride_bq + cols[:, None] * stride_bk,
                mask=valid_n[:, None] & valid_m[None, :],
                other=0.0,
            )
            s_t += b_t.to(tl.float32) * 1.4426950408889634
        s_t = tl.where(attend[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :])
        dv += _mma(p_t.to(do.dtype), do, DOT_PRECISION, UPCAST_DOT)
        dp_t = _mma(v, tl.trans(do), DOT_PRECISION, UPCAST_DOT)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += _mma(ds_t.to(q.dtype), q, DOT_PRECISION, UPCAST_DOT)

    dk *= scale
    # dK and dV are fresh tensors of one layout (stride_x*), whatever the layout of k and v.
    out_offs = (batch * stride_xb + row * stride_xn + head * stride_xh
                + cols[:, None] * stride_xl + offs_d[None, :] * stride_xd)
    tl.store(DK + out_offs, dk.to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + out_offs, dv.to(DV.dtype.element_ty), mask=kv_tile)


@triton.jit
def _evo_attention_bwd_q_kernel(
    Q, K, V, Bias, Mask, KeyEnd, Out, DOut, Lse, Delta, DQ, DBias,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bn, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_dbb, stride_dbn, stride_dbh, stride_dbq, stride_dbk,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    num_heads, seq_len, head_dim, scale, scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    STORE_DBIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = rows_m < seq_len
    valid_d = offs_d < head_dim
    q_tile = valid_m[:, None] & valid_d[None, :]

    q = tl.load(
        Q + batch * stride_qb + row * stride_qn + head * stride_qh
        + rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd,
        mask=q_tile,
        other=0.0,
    )
    do = tl.load(
        DOut + batch * stride_gb + row * stride_gn + head * stride_gh
        + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd,
        mask=q_tile,
        other=0.0,
    )
    o = tl.load(
        Out + batch * stride_ob + row * stride_on + head * stride_oh
        + rows_m[:, None] * stride_ol + offs_d[None, :] * stride_od,
        mask=q_tile,
        other=0.0,
    )
    stat_base = ((batch * tl.num_programs(1) + row) * num_heads + head) * seq_len
    lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
    # delta = rowsum(dO * O), kept for the dK/dV kernel, which runs after this one.
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + stat_base + rows_m, delta, mask=valid_m)

    k_base = K + batch * stride_kb + row * stride_kn + head * stride_kh
    v_base = V + batch * stride_vb + row * stride_vn + head * stride_vh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    dbias_base = DBias + batch * stride_dbb + row * stride_dbn + head * stride_dbh
    mask_base = Mask + batch * stride_mb + row * stride_mn

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    key_end = seq_len
    if HAS_MASK:
        key_end = tl.load(KeyEnd + batch * tl.num_programs(1) + row)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        kv_tile = valid_n[:, None] & valid_d[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kl + offs_d[None, :] * stride_kd, mask=kv_tile, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd, mask=kv_tile, other=0.0)
        s = _mma(q, tl.trans(k), DOT_PRECISION, UPCAST_DOT) * scale_log2
        bias_tile = valid_m[:, None] & valid_n[None, :]
        if HAS_BIAS:
            b = tl.load(bias_base + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                        mask=bias_tile, other=0.0)
            s += b.to(tl.float32) * 1.4426950408889634
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols * stride_ml, mask=valid_n, other=0) != 0)
        s = tl.where(attend[None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = _mma(do, tl.trans(v), DOT_PRECISION, UPCAST_DOT)
        ds = p * (dp - delta[:, None])
        dq += _mma(ds.to(k.dtype), k, DOT_PRECISION, UPCAST_DOT)
        if STORE_DBIAS:
            # Per-row bias: dBias of this (row, head) tile is dS itself, owned by this program.
            tl.store(dbias_base + rows_m[:, None] * stride_dbq + cols[None, :] * stride_dbk,
                     ds.to(DBias.dtype.element_ty), mask=bias_tile)
    if STORE_DBIAS:
        # Keys past the last attended one were skipped above; their bias gradient is zero.
        for start_n in range(tl.cdiv(key_end, BLOCK_N) * BLOCK_N, seq_len, BLOCK_N):
            cols = start_n + offs_n
            tl.store(dbias_base + rows_m[:, None] * stride_dbq + cols[None, :] * stride_dbk,
                     tl.zeros([BLOCK_M, BLOCK_N], DBias.dtype.element_ty),
                     mask=valid_m[:, None] & (cols < seq_len)[None, :])

    dq *= scale
    tl.store(
        DQ + batch * stride_xb + row * stride_xn + head * stride_xh
        + rows_m[:, None] * stride_xl + offs_d[None, :] * stride_xd,
        dq.to(DQ.dtype.element_ty),
        mask=q_tile,
    )


@triton.jit
def _evo_attention_bwd_kv_rows_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DK, DV,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    num_heads, num_rows, seq_len, head_dim, scale, scale_log2,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # dK/dV for ROWS rows at once with a shared bias: one bias tile per q block serves all rows.
    pid_n = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_r = rows < num_rows
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    kv_mask = valid_r[:, None, None] & valid_n[None, :, None] & valid_d[None, None, :]

    k = tl.load(K + batch * stride_kb + head * stride_kh + rows[:, None, None] * stride_kn
                + cols[None, :, None] * stride_kl + offs_d[None, None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(V + batch * stride_vb + head * stride_vh + rows[:, None, None] * stride_vn
                + cols[None, :, None] * stride_vl + offs_d[None, None, :] * stride_vd, mask=kv_mask, other=0.0)
    attend = valid_r[:, None] & valid_n[None, :]
    if HAS_MASK:
        attend = attend & (
            tl.load(Mask + batch * stride_mb + rows[:, None] * stride_mn + cols[None, :] * stride_ml,
                    mask=attend, other=0) != 0
        )
    q_base = Q + batch * stride_qb + head * stride_qh + rows[:, None, None] * stride_qn
    do_base = DOut + batch * stride_gb + head * stride_gh + rows[:, None, None] * stride_gn
    bias_base = Bias + batch * stride_bb + head * stride_bh
    stat_base = ((batch * num_rows + rows[:, None]) * num_heads + head) * seq_len

    dk = tl.zeros([ROWS, BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([ROWS, BLOCK_N, BLOCK_D], tl.float32)
    query_end = seq_len
    if HAS_MASK:
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + rows, mask=valid_r, other=0), 0)
        query_end = tl.where(pid_n * BLOCK_N < key_end, seq_len, 0)
    for start_m in range(0, query_end, BLOCK_M):
        rows_m = start_m + offs_m
        valid_m = rows_m < seq_len
        q_mask = valid_r[:, None, None] & valid_m[None, :, None] & valid_d[None, None, :]
        q = tl.load(q_base + rows_m[None, :, None] * stride_ql + offs_d[None, None, :] * stride_qd,
                    mask=q_mask, other=0.0)
        do = tl.load(do_base + rows_m[None, :, None] * stride_gl + offs_d[None, None, :] * stride_gd,
                     mask=q_mask, other=0.0)
        stat_mask = valid_r[:, None] & valid_m[None, :]
        lse = tl.load(Lse + stat_base + rows_m[None, :], mask=stat_mask, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m[None, :], mask=stat_mask, other=0.0)
        b_t = tl.load(bias_base + rows_m[None, :] * stride_bq + cols[:, None] * stride_bk,
                      mask=valid_n[:, None] & valid_m[None, :], other=0.0)
        s_t = _mma(k, tl.permute(q, (0, 2, 1)), DOT_PRECISION, UPCAST_DOT) * scale_log2  # [R, N, M]
        s_t += (b_t.to(tl.float32) * 1.4426950408889634)[None, :, :]
        s_t = tl.where(attend[:, :, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[:, None, :])
        dv += _mma(p_t.to(do.dtype), do, DOT_PRECISION, UPCAST_DOT)
        dp_t = _mma(v, tl.permute(do, (0, 2, 1)), DOT_PRECISION, UPCAST_DOT)
        ds_t = p_t * (dp_t - delta[:, None, :])
        dk += _mma(ds_t.to(q.dtype), q, DOT_PRECISION, UPCAST_DOT)

    dk *= scale
    out_offs = (batch * stride_xb + head * stride_xh + rows[:, None, None] * stride_xn
                + cols[None, :, None] * stride_xl + offs_d[None, None, :] * stride_xd)
    tl.store(DK + out_offs, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out_offs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _evo_attention_bwd_q_rows_kernel(
    Q, K, V, Bias, Mask, KeyEnd, Out, DOut, Lse, Delta, DQ,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    num_heads, num_rows, seq_len, head_dim, scale, scale_log2,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # dQ for ROWS rows at once with a shared bias: one bias tile per k block serves all rows.
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_r = rows < num_rows
    valid_m = rows_m < seq_len
    valid_d = offs_d < head_dim
    q_mask = valid_r[:, None, None] & valid_m[None, :, None] & valid_d[None, None, :]

    q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None, None] * stride_qn
                + rows_m[None, :, None] * stride_ql + offs_d[None, None, :] * stride_qd, mask=q_mask, other=0.0)
    do = tl.load(DOut + batch * stride_gb + head * stride_gh + rows[:, None, None] * stride_gn
                 + rows_m[None, :, None] * stride_gl + offs_d[None, None, :] * stride_gd, mask=q_mask, other=0.0)
    o = tl.load(Out + batch * stride_ob + head * stride_oh + rows[:, None, None] * stride_on
                + rows_m[None, :, None] * stride_ol + offs_d[None, None, :] * stride_od, mask=q_mask, other=0.0)
    stat_offs = ((batch * num_rows + rows[:, None]) * num_heads + head) * seq_len + rows_m[None, :]
    stat_mask = valid_r[:, None] & valid_m[None, :]
    lse = tl.load(Lse + stat_offs, mask=stat_mask, other=float("inf"))
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 2)
    tl.store(Delta + stat_offs, delta, mask=stat_mask)

    k_base = K + batch * stride_kb + head * stride_kh + rows[:, None, None] * stride_kn
    v_base = V + batch * stride_vb + head * stride_vh + rows[:, None, None] * stride_vn
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask_base = Mask + batch * stride_mb + rows[:, None] * stride_mn

    dq = tl.zeros([ROWS, BLOCK_M, BLOCK_D], tl.float32)
    key_end = seq_len
    if HAS_MASK:
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + rows, mask=valid_r, other=0), 0)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        kv_mask = valid_r[:, None, None] & valid_n[None, :, None] & valid_d[None, None, :]
        k = tl.load(k_base + cols[None, :, None] * stride_kl + offs_d[None, None, :] * stride_kd,
                    mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[None, :, None] * stride_vl + offs_d[None, None, :] * stride_vd,
                    mask=kv_mask, other=0.0)
        b = tl.load(bias_base + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                    mask=valid_m[:, None] & valid_n[None, :], other=0.0)
        s = _mma(q, tl.permute(k, (0, 2, 1)), DOT_PRECISION, UPCAST_DOT) * scale_log2  # [R, M, N]
        s += (b.to(tl.float32) * 1.4426950408889634)[None, :, :]
        attend = valid_r[:, None] & valid_n[None, :]
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols[None, :] * stride_ml, mask=attend, other=0) != 0)
        s = tl.where(attend[:, None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, :, None])
        dp = _mma(do, tl.permute(v, (0, 2, 1)), DOT_PRECISION, UPCAST_DOT)
        ds = p * (dp - delta[:, :, None])
        dq += _mma(ds.to(k.dtype), k, DOT_PRECISION, UPCAST_DOT)

    dq *= scale
    tl.store(DQ + batch * stride_xb + head * stride_xh + rows[:, None, None] * stride_xn
             + rows_m[None, :, None] * stride_xl + offs_d[None, None, :] * stride_xd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def _evo_attention_bwd_bias_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DBias,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_dbb, stride_dbh, stride_dbq, stride_dbk,
    num_heads, num_rows, seq_len, head_dim, scale_log2,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # dBias of a bias broadcast over N is sum_n dS[n]. Each program owns one bias tile, loads it
    # once, and walks the rows n = 0..N-1 in order: the sum is reproducible bit for bit and the
    # bias tile is read once instead of N times.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_bh = tl.program_id(2)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)

    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = rows_m < seq_len
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    bias_tile = valid_m[:, None] & valid_n[None, :]

    b = tl.load(Bias + batch * stride_bb + head * stride_bh
                + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=bias_tile, other=0.0)
    b = b.to(tl.float32) * 1.4426950408889634

    # Row pointers advance by one row stride per step (64-bit pointer arithmetic, no row * stride).
    q_ptrs = (Q + batch * stride_qb + head * stride_qh
              + rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd)
    do_ptrs = (DOut + batch * stride_gb + head * stride_gh
               + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd)
    k_t_ptrs = (K + batch * stride_kb + head * stride_kh
                + cols[None, :] * stride_kl + offs_d[:, None] * stride_kd)
    v_t_ptrs = (V + batch * stride_vb + head * stride_vh
                + cols[None, :] * stride_vl + offs_d[:, None] * stride_vd)
    mask_ptrs = Mask + batch * stride_mb + cols * stride_ml
    stat_ptrs = Lse + (batch * num_rows * num_heads + head) * seq_len + rows_m
    delta_ptrs = Delta + (batch * num_rows * num_heads + head) * seq_len + rows_m
    q_mask = valid_m[:, None] & valid_d[None, :]
    kv_mask = valid_d[:, None] & valid_n[None, :]

    dbias = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    rows_to_walk = num_rows
    if HAS_MASK:
        # Past the last attended key of every row, dS is zero: such a tile skips the walk.
        key_max = tl.full([], 0, tl.int32)
        for start in range(0, num_rows, SCAN_MASK):
            idx = start + tl.arange(0, SCAN_MASK)
            ends = tl.load(KeyEnd + batch * num_rows + idx, mask=idx < num_rows, other=0)
            key_max = tl.maximum(key_max, tl.max(ends, 0))
        rows_to_walk = tl.where(pid_n * BLOCK_N < key_max, num_rows, 0)
    for _ in range(0, rows_to_walk):
        q = tl.load(q_ptrs, mask=q_mask, other=0.0)
        do = tl.load(do_ptrs, mask=q_mask, other=0.0)
        k_t = tl.load(k_t_ptrs, mask=kv_mask, other=0.0)
        v_t = tl.load(v_t_ptrs, mask=kv_mask, other=0.0)
        lse = tl.load(stat_ptrs, mask=valid_m, other=float("inf"))
        delta = tl.load(delta_ptrs, mask=valid_m, other=0.0)
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(mask_ptrs, mask=valid_n, other=0) != 0)
        s = _mma(q, k_t, DOT_PRECISION, UPCAST_DOT) * scale_log2 + b
        s = tl.where(attend[None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = _mma(do, v_t, DOT_PRECISION, UPCAST_DOT)
        dbias += p * (dp - delta[:, None])
        q_ptrs += stride_qn
        do_ptrs += stride_gn
        k_t_ptrs += stride_kn
        v_t_ptrs += stride_vn
        mask_ptrs += stride_mn
        stat_ptrs += num_heads * seq_len
        delta_ptrs += num_heads * seq_len

    tl.store(DBias + batch * stride_dbb + head * stride_dbh
             + rows_m[:, None] * stride_dbq + cols[None, :] * stride_dbk,
             dbias.to(DBias.dtype.element_ty), mask=bias_tile)


# --------------------------------------------------------------------------------------------
# Block configurations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockConfig:
    """Tile sizes and launch options of one kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Rows of N per program when the bias is shared by all rows (1 = the plain kernels); the
    # dBias kernel ignores it (it walks all rows already).
    rows: int = 1


@dataclass(frozen=True)
class EvoAttentionConfig:
    """Block configurations of the four main kernels for one shape class."""

    fwd: BlockConfig
    bwd_kv: BlockConfig
    bwd_q: BlockConfig
    bwd_bias: BlockConfig


_KERNEL_NAMES = ("fwd", "bwd_kv", "bwd_q", "bwd_bias")


def _padded_head_dim(head_dim: int) -> int:
    # tl.dot needs an inner dimension of at least 16 and tiles are powers of two.
    return max(16, triton.next_power_of_2(head_dim))


def _parse_block(raw: dict, where: str) -> BlockConfig:
    try:
        return BlockConfig(
            block_m=int(raw["block_m"]),
            block_n=int(raw["block_n"]),
            num_warps=int(raw["num_warps"]),
            num_stages=int(raw["num_stages"]),
            rows=int(raw.get("rows", 1)),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{_CONFIG_FILE}: bad block config at {where}: {raw!r} ({err})") from err


@functools.lru_cache(maxsize=None)
def _load_tuned_configs() -> dict[str, list[tuple[int, int, EvoAttentionConfig]]]:
    """GPU name -> [(max padded head dim, max sequence length, config)], most specific first."""
    if not _CONFIG_FILE.is_file():
        return {}
    with open(_CONFIG_FILE) as handle:
        raw = json.load(handle)
    tuned: dict[str, list[tuple[int, int, EvoAttentionConfig]]] = {}
    for gpu, entries in raw.get("gpus", {}).items():
        parsed = []
        for index, entry in enumerate(entries):
            where = f"gpus[{gpu!r}][{index}]"
            missing = [name for name in ("head_dim_max", "seq_len_max", *_KERNEL_NAMES) if name not in entry]
            if missing:
                raise ValueError(f"{_CONFIG_FILE}: {where} lacks {missing}")
            blocks = {name: _parse_block(entry[name], f"{where}.{name}") for name in _KERNEL_NAMES}
            parsed.append((int(entry["head_dim_max"]), int(entry["seq_len_max"]), EvoAttentionConfig(**blocks)))
        tuned[gpu] = sorted(parsed, key=lambda item: (item[0], item[1]))
    return tuned


def _heuristic_config(padded_dim: int, seq_len: int, interpreted: bool) -> EvoAttentionConfig:
    if interpreted:
        # Small tiles make the interpreter cover several blocks and ragged edges at test sizes;
        # two rows per program exercise the row-group kernels whenever the bias is shared.
        small = BlockConfig(16, 16, 1, 1)
        grouped = BlockConfig(16, 16, 1, 1, rows=2)
        return EvoAttentionConfig(grouped, grouped, grouped, small)
    wide = 64 if padded_dim <= 64 else 32
    short = 32 if seq_len <= 64 else 64
    block = min(wide, short)
    return EvoAttentionConfig(
        fwd=BlockConfig(min(64, short), block, 4, 3 if padded_dim <= 64 else 2),
        bwd_kv=BlockConfig(min(32, block), block, 4, 2),
        bwd_q=BlockConfig(block, min(32, block), 4, 2),
        bwd_bias=BlockConfig(min(64, short), min(64, short), 4, 2),
    )


def select_config(head_dim: int, seq_len: int, device: torch.device) -> EvoAttentionConfig:
    """Tuned block sizes for this GPU and shape class, else a heuristic; never autotunes."""
    interpreted = _interpreting() or device.type != "cuda"
    gpu = None if interpreted else _gpu_name(device.index if device.index is not None else torch.cuda.current_device())
    return _select_config_cached(_padded_head_dim(head_dim), seq_len, gpu)


@functools.lru_cache(maxsize=None)
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=1024)
def _select_config_cached(padded_dim: int, seq_len: int, gpu: Optional[str]) -> EvoAttentionConfig:
    if gpu is not None:
        for dim_max, len_max, config in _load_tuned_configs().get(gpu, []):
            if padded_dim <= dim_max and seq_len <= len_max:
                return config
    return _heuristic_config(padded_dim, seq_len, interpreted=gpu is None)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs ask for fp32 products: tf32 would make fp32 no more accurate than bf16.
    return "ieee" if dtype == torch.float32 else "tf32"


def _upcast_dot(q: torch.Tensor) -> bool:
    return q.dtype == torch.bfloat16 and q.device.type != "cuda"


class SizeLimitError(ValueError):
    """Inputs beyond what the kernels can index (32-bit offsets): a size to avoid, not a bug."""


def _check_inputs(q, k, v, bias, mask) -> None:
    if q.dim() != 5:
        raise ValueError(f"evo_attention: q must be [B, N, L, H, D], got shape {tuple(q.shape)}")
    for name, tensor in (("k", k), ("v", v)):
        if tensor.shape != q.shape:
            raise ValueError(f"evo_attention: {name} has shape {tuple(tensor.shape)}, q has {tuple(q.shape)}")
        if tensor.dtype != q.dtype or tensor.device != q.device:
            raise ValueError(
                f"evo_attention: {name} is {tensor.dtype} on {tensor.device}, q is {q.dtype} on {q.device}"
            )
    if q.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"evo_attention: dtype {q.dtype} not supported, use one of {_SUPPORTED_DTYPES}")
    batch, rows, seq_len, heads, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"evo_attention: head dim {head_dim} not supported, use one of {SUPPORTED_HEAD_DIMS}")
    if bias is not None:
        if bias.dim() != 5 or bias.shape[1] not in (1, rows) or (
            (bias.shape[0], bias.shape[2], bias.shape[3], bias.shape[4]) != (batch, heads, seq_len, seq_len)
        ):
            raise ValueError(
                f"evo_attention: bias has shape {tuple(bias.shape)}, expected "
                f"[{batch}, 1 or {rows}, {heads}, {seq_len}, {seq_len}]"
            )
        if bias.dtype not in (torch.float32, q.dtype) or bias.device != q.device:
            raise ValueError(
                f"evo_attention: bias is {bias.dtype} on {bias.device}, expected float32 or {q.dtype} on {q.device}"
            )
    if mask is not None:
        if tuple(mask.shape) != (batch, rows, seq_len) or mask.dtype != torch.bool or mask.device != q.device:
            raise ValueError(
                f"evo_attention: mask is {mask.dtype} {tuple(mask.shape)} on {mask.device}, "
                f"expected bool [{batch}, {rows}, {seq_len}] on {q.device}"
            )
    for name, tensor in (("q", q), ("k", k), ("v", v), ("bias", bias)):
        # The kernels add tile offsets (position x stride) in 32 bits; past 2^31 elements the
        # address wraps (seen as an illegal memory access at L = 3072 on the H200).
        if tensor is not None and sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride())) >= 2**31:
            raise SizeLimitError(
                f"evo_attention: {name} {tuple(tensor.shape)} with strides {tensor.stride()} spans 2^31 elements or "
                f"more; the kernels use 32-bit offsets (split the batch or rows, or use a smaller L)"
            )


def _bias_strides(bias: Optional[torch.Tensor]) -> tuple[int, int, int, int, int]:
    if bias is None:
        return (0, 0, 0, 0, 0)
    # A bias shared by all rows gets row stride 0: the kernels then read one tile for every row.
    row_stride = 0 if bias.shape[1] == 1 else bias.stride(1)
    return (bias.stride(0), row_stride, bias.stride(2), bias.stride(3), bias.stride(4))


def _mask_arg(mask: Optional[torch.Tensor], q: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    if mask is None:
        return q, (0, 0, 0)
    # bool and uint8 share a layout; Triton reads uint8 pointers more predictably than int1.
    as_bytes = mask.view(torch.uint8)
    return as_bytes, tuple(as_bytes.stride())


_SCAN_MASK = 256  # mask bytes per step of the forward's scan for each row's last attended key


def evo_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    scale: float,
    config: Optional[EvoAttentionConfig] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: one launch, nothing else on the host's path.

    Returns out [B, N, L, H, D], lse [B, N, H, L] (fp32, log2 units) and key_end [B, N] (int32,
    one past each row's last attended key; L without a mask), which the backward takes.
    config overrides the tuned block sizes (for tuning runs); inputs are assumed checked.
    """
    batch, rows, seq_len, heads, head_dim = q.shape
    config = (config or select_config(head_dim, seq_len, q.device)).fwd
    out = q.new_empty(q.shape)
    lse = torch.empty((batch, rows, heads, seq_len), device=q.device, dtype=torch.float32)
    key_end = torch.empty((batch, rows), device=q.device, dtype=torch.int32)
    mask_tensor, mask_strides = _mask_arg(mask, q)
    shared_bias = bias is not None and bias.shape[1] == 1 and rows > 1
    common = dict(
        HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        UPCAST_DOT=_upcast_dot(q),
        SCAN_MASK=_SCAN_MASK,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_D=_padded_head_dim(head_dim),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if shared_bias and config.rows > 1:
        grid = (triton.cdiv(seq_len, config.block_m), triton.cdiv(rows, config.rows), batch * heads)
        _evo_attention_fwd_rows_kernel[grid](
            q, k, v, bias, mask_tensor, key_end, out, lse,
            *q.stride(), *k.stride(), *v.stride(),
            bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4),
            *mask_strides, *out.stride(),
            heads, rows, seq_len, head_dim, scale * _LOG2E,
            ROWS=config.rows,
            **common,
        )
    else:
        grid = (triton.cdiv(seq_len, config.block_m), rows, batch * heads)
        _evo_attention_fwd_kernel[grid](
            q, k, v, bias if bias is not None else q, mask_tensor, key_end, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias), *mask_strides, *out.stride(),
            heads, seq_len, head_dim, scale * _LOG2E,
            **common,
        )
    return out, lse, key_end


def evo_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    bias_grad: bool,
    config: Optional[EvoAttentionConfig] = None,
    grads: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Launch the backward kernels (two, three for a shared bias). Returns dq, dk, dv, dbias.

    dbias is None unless bias_grad. Order matters: the dQ kernel writes delta = rowsum(dO * O),
    which the dK/dV and dBias kernels read. `grads`: tensors of q's shape to write dq, dk, dv
    into (views of a packed gradient, say); dk and dv must share their strides.
    """
    batch, rows, seq_len, heads, head_dim = q.shape
    config = config or select_config(head_dim, seq_len, q.device)
    has_bias = bias is not None
    bias_arg = bias if has_bias else q
    mask_tensor, mask_strides = _mask_arg(mask, q)
    shared_bias = has_bias and bias.shape[1] == 1 and rows > 1
    per_row_dbias = bias_grad and bias.shape[1] == rows
    common = dict(
        HAS_MASK=mask is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        UPCAST_DOT=_upcast_dot(q),
        BLOCK_D=_padded_head_dim(head_dim),
    )

    def tiles(block: BlockConfig) -> dict:
        return dict(BLOCK_M=block.block_m, BLOCK_N=block.block_n, num_warps=block.num_warps,
                    num_stages=block.num_stages, **common)

    delta = torch.empty_like(lse)
    if grads is not None:
        dq, dk, dv = grads
        if not (dq.shape == dk.shape == dv.shape == q.shape) or dk.stride() != dv.stride():
            raise ValueError("evo_attention_backward: grads must have q's shape, and dk and dv equal strides")
    else:
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dbias = bias.new_empty(bias.shape) if bias_grad else None
    qc = config.bwd_q
    if shared_bias and qc.rows > 1:
        _evo_attention_bwd_q_rows_kernel[(triton.cdiv(seq_len, qc.block_m), triton.cdiv(rows, qc.rows), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, out, grad_out, lse, delta, dq,
            *q.stride(), *k.stride(), *v.stride(),
            bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4),
            *mask_strides, *out.stride(), *grad_out.stride(), *dq.stride(),
            heads, rows, seq_len, head_dim, scale, scale * _LOG2E,
            ROWS=qc.rows,
            **tiles(qc),
        )
    else:
        _evo_attention_bwd_q_kernel[(triton.cdiv(seq_len, qc.block_m), rows, batch * heads)](
            q, k, v, bias_arg, mask_tensor, key_end, out, grad_out, lse, delta, dq,
            dbias if per_row_dbias else q,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias),
            *mask_strides, *out.stride(), *grad_out.stride(),
            *(dbias.stride() if per_row_dbias else (0, 0, 0, 0, 0)),
            *dq.stride(),
            heads, seq_len, head_dim, scale, scale * _LOG2E,
            HAS_BIAS=has_bias,
            STORE_DBIAS=per_row_dbias,
            **tiles(qc),
        )

    kv = config.bwd_kv
    if shared_bias and kv.rows > 1:
        _evo_attention_bwd_kv_rows_kernel[(triton.cdiv(seq_len, kv.block_n), triton.cdiv(rows, kv.rows), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, grad_out, lse, delta, dk, dv,
            *q.stride(), *k.stride(), *v.stride(),
            bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4),
            *mask_strides, *grad_out.stride(), *dk.stride(),
            heads, rows, seq_len, head_dim, scale, scale * _LOG2E,
            ROWS=kv.rows,
            **tiles(kv),
        )
    else:
        _evo_attention_bwd_kv_kernel[(triton.cdiv(seq_len, kv.block_n), rows, batch * heads)](
            q, k, v, bias_arg, mask_tensor, key_end, grad_out, lse, delta, dk, dv,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias),
            *mask_strides, *grad_out.stride(), *dk.stride(),
            heads, seq_len, head_dim, scale, scale * _LOG2E,
            HAS_BIAS=has_bias,
            **tiles(kv),
        )

    if bias_grad and not per_row_dbias:
        bc = config.bwd_bias
        _evo_attention_bwd_bias_kernel[(triton.cdiv(seq_len, bc.block_n), triton.cdiv(seq_len, bc.block_m), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, grad_out, lse, delta, dbias,
            *q.stride(), *k.stride(), *v.stride(),
            bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4),
            *mask_strides, *grad_out.stride(),
            dbias.stride(0), dbias.stride(2), dbias.stride(3), dbias.stride(4),
            heads, rows, seq_len, head_dim, scale * _LOG2E,
            SCAN_MASK=_SCAN_MASK,
            **tiles(bc),
        )
    return dq, dk, dv, dbias


# --------------------------------------------------------------------------------------------
# Custom ops and autograd: torch.compile sees two opaque ops and keeps them in the graph.
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("featurecache::evo_attention_fwd", mutates_args=())
def _evo_attention_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return evo_attention_forward(q, k, v, bias, mask, scale)


@_evo_attention_fwd_op.register_fake
def _(q, k, v, bias, mask, scale):
    batch, rows, seq_len, heads, _ = q.shape
    return (q.new_empty(q.shape), q.new_empty((batch, rows, heads, seq_len), dtype=torch.float32),
            q.new_empty((batch, rows), dtype=torch.int32))


@torch.library.custom_op("featurecache::evo_attention_bwd", mutates_args=())
def _evo_attention_bwd_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = evo_attention_backward(grad_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad)
    # Custom ops cannot return None: an empty tensor stands for "no bias gradient".
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)


@_evo_attention_bwd_op.register_fake
def _(grad_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bias, mask, scale = inputs
    out, lse, key_end = output
    ctx.save_for_backward(q, k, v, bias, mask, out, lse, key_end)
    ctx.scale = scale
    ctx.bias_grad = bias is not None and ctx.needs_input_grad[3]


def _backward(ctx, grad_out, grad_lse, grad_key_end):
    q, k, v, bias, mask, out, lse, key_end = ctx.saved_tensors
    dq, dk, dv, dbias = _evo_attention_bwd_op(
        grad_out, q, k, v, bias, mask, out, lse, key_end, ctx.scale, ctx.bias_grad
    )
    return dq, dk, dv, dbias if ctx.bias_grad else None, None, None


_evo_attention_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EvoAttentionFunction(torch.autograd.Function):
    """The eager path: same launchers, without custom-op dispatch.

    A custom-op call costs a few hundred microseconds of host time (H200 run of 2026-12-02: a
    0.27 ms kernel sequence measured 1.78 ms end to end), as much as the kernels themselves at
    N = 1. Under torch.compile the custom ops are used instead, so the graph has no break.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse, key_end)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse, key_end = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = evo_attention_backward(
            grad_out, q, k, v, bias, mask, out, lse, key_end, ctx.scale, bias_grad
        )
        return dq, dk, dv, dbias, None, None


def evo_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Attention over L with pair bias and key mask, independently for each of the N rows.

    q, k, v: [B, N, L, H, D], any strides; bias: [B, 1 or N, H, L, L] in fp32 or q's dtype;
    mask: [B, N, L] bool, True = attend. Returns [B, N, L, H, D] in q's dtype; rows with every
    key masked give zeros. scale defaults to D ** -0.5. On CUDA (or on CPU under
    TRITON_INTERPRET=1) this runs the Triton kernels; otherwise the PyTorch reference.
    """
    if q.device.type == "cuda" or _interpreting():
        # Autocast does not reach inside the kernels: cast q, k, v where it would (an fp32
        # bias is read as is).
        q, k, v = (_common.autocast_input(t) for t in (q, k, v))
    _check_inputs(q, k, v, bias, mask)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if q.device.type != "cuda" and not _interpreting():
        return evo_attention_reference(q, k, v, bias, mask, scale)
    if torch.compiler.is_compiling():
        out, _, _ = _evo_attention_fwd_op(q, k, v, bias, mask, float(scale))
        return out
    return _EvoAttentionFunction.apply(q, k, v, bias, mask, float(scale))
