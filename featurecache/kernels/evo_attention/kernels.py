"""EvoAttention's Triton kernels, flash-attention style with fp32 accumulation.

forward   one program per (q block, row n, b*h): online softmax, writes out and the row's
          logsumexp (kept in log2 units, the kernels' working domain).
backward  dQ per (q block, row n, b*h) looping over k blocks, which also writes
          delta = rowsum(dO * O) and, when the bias is per row, dBias; then dK/dV per
          (k block, row n, b*h) looping over q blocks; then, for a bias broadcast over N,
          dBias per (k block, q block, b*h) looping over the N rows in a fixed order, so the
          sum over N is bitwise reproducible (no atomics).
          Other backward modes (config.BWD_MODES): the dK/dV kernel adding dQ and / or dBias with
          fp32 atomics (`_bwd_fused`, after `_delta`), or one program per bias tile walking the
          rows with dQ, dK, dV added by atomics (`_bwd_walk`).
Key loops stop at each row's last attended key, found once by the forward kernel.

The `_rows` variants handle ROWS rows of N per program when the bias is shared by all rows
(batched [ROWS, M, N] products), so each bias tile is loaded and scaled once for all of them;
the `_pair` variants do the same for two rows with 2-D products each.

Offsets: batch, row and head offsets are always 64-bit; offsets inside a tile (position x
stride) are 32-bit unless WIDE_INDEX, which the launcher sets when a tile of some tensor spans
2^31 elements or more (the ending node's transposed views past L ~ 2000).

Logits are in log2 units (exp2 is the GPU's native exponential): scale_log2 = scale * log2(e),
and the bias is multiplied by LOG2E where it is loaded.
"""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import mma, tile_range

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _batch_and_head(num_heads):
    """The (batch, head) this program works on: grid axis 2 runs over batch * heads."""
    pid_bh = tl.program_id(2)
    return (pid_bh // num_heads).to(tl.int64), (pid_bh % num_heads).to(tl.int64)


@triton.jit
def _online_softmax_step(s, m_i, l_i):
    """One key block of the online softmax over the last axis of the logits s (log2 units).

    m_i, l_i: running maximum and sum of exp2 per query. Returns (p, the block's unnormalized
    probabilities; alpha, the factor that rescales what was accumulated before; the new m_i and
    l_i).
    """
    m_new = tl.maximum(m_i, tl.max(s, -1))
    # A row with no key seen yet keeps m = -inf; shift by 0 there so exp2 gives 0, not NaN.
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - tl.expand_dims(m_shift, -1))
    alpha = tl.math.exp2(m_i - m_shift)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, -1)


@triton.jit
def _online_softmax_result(acc, m_i, l_i):
    """(out = acc / l_i, lse = log2 of the softmax denominator): zeros and +inf for a query that
    saw no key. The +inf makes every recomputed probability exactly 0 in the backward."""
    empty = l_i == 0.0
    out = acc / tl.expand_dims(tl.where(empty, 1.0, l_i), -1)
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    return out, lse


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
    PRECISION: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)

    offs_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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
        s = mma(q, k_t, None, PRECISION) * scale_log2
        if HAS_BIAS:
            b = tl.load(
                bias_base + offs_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=valid_m[:, None] & valid_n[None, :],
                other=0.0,
            )
            s += b.to(tl.float32) * LOG2E
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols * stride_ml, mask=valid_n, other=0) != 0)
        s = tl.where(attend[None, :], s, float("-inf"))

        p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i)
        v = tl.load(
            v_base + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd,
            mask=valid_n[:, None] & valid_d[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, None, PRECISION)

    out, lse = _online_softmax_result(acc, m_i, l_i)
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
    PRECISION: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # The forward for ROWS rows at once, for a bias shared by all rows: each bias tile is loaded
    # once and added to the logits of all ROWS rows (batched [ROWS, M, N] products), so bias
    # traffic drops ROWS-fold (3.6 GB per pass at L = 768, H = 4 in bf16 with one row each).
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    batch, head = _batch_and_head(num_heads)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    offs_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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
        s = mma(q, k_t, None, PRECISION) * scale_log2  # [ROWS, BLOCK_M, BLOCK_N]
        if HAS_BIAS:
            b = tl.load(
                bias_base + offs_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=valid_m[:, None] & valid_n[None, :],
                other=0.0,
            )
            s += (b.to(tl.float32) * LOG2E)[None, :, :]
        attend = valid_r[:, None] & valid_n[None, :]
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols[None, :] * stride_ml, mask=attend, other=0) != 0)
        s = tl.where(attend[:, None, :], s, float("-inf"))

        p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i)
        v = tl.load(
            v_base + cols[None, :, None] * stride_vl + offs_d[None, None, :] * stride_vd,
            mask=valid_r[:, None, None] & valid_n[None, :, None] & valid_d[None, None, :],
            other=0.0,
        )
        acc = acc * alpha[:, :, None] + mma(p.to(v.dtype), v, None, PRECISION)

    out, lse = _online_softmax_result(acc, m_i, l_i)
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
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # One program owns a block of keys of one row and head and loops over all queries;
    # probabilities are built transposed ([keys, queries]) so no tile needs tl.trans.
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)

    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_m = tile_range(0, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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

        s_t = mma(k, tl.trans(q), None, PRECISION) * scale_log2  # [BLOCK_N, BLOCK_M]
        if HAS_BIAS:
            b_t = tl.load(
                bias_base + rows_m[None, :] * stride_bq + cols[:, None] * stride_bk,
                mask=valid_n[:, None] & valid_m[None, :],
                other=0.0,
            )
            s_t += b_t.to(tl.float32) * LOG2E
        s_t = tl.where(attend[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :])
        dv += mma(p_t.to(do.dtype), do, None, PRECISION)
        dp_t = mma(v, tl.trans(do), None, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += mma(ds_t.to(q.dtype), q, None, PRECISION)

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
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)

    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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
        s = mma(q, tl.trans(k), None, PRECISION) * scale_log2
        bias_tile = valid_m[:, None] & valid_n[None, :]
        if HAS_BIAS:
            b = tl.load(bias_base + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                        mask=bias_tile, other=0.0)
            s += b.to(tl.float32) * LOG2E
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols * stride_ml, mask=valid_n, other=0) != 0)
        s = tl.where(attend[None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = mma(do, tl.trans(v), None, PRECISION)
        ds = p * (dp - delta[:, None])
        dq += mma(ds.to(k.dtype), k, None, PRECISION)
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
    PRECISION: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # dK/dV for ROWS rows at once with a shared bias: one bias tile per q block serves all rows.
    pid_n = tl.program_id(0)
    pid_r = tl.program_id(1)
    batch, head = _batch_and_head(num_heads)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_m = tile_range(0, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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
        s_t = mma(k, tl.permute(q, (0, 2, 1)), None, PRECISION) * scale_log2  # [R, N, M]
        s_t += (b_t.to(tl.float32) * LOG2E)[None, :, :]
        s_t = tl.where(attend[:, :, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[:, None, :])
        dv += mma(p_t.to(do.dtype), do, None, PRECISION)
        dp_t = mma(v, tl.permute(do, (0, 2, 1)), None, PRECISION)
        ds_t = p_t * (dp_t - delta[:, None, :])
        dk += mma(ds_t.to(q.dtype), q, None, PRECISION)

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
    PRECISION: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # dQ for ROWS rows at once with a shared bias: one bias tile per k block serves all rows.
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    batch, head = _batch_and_head(num_heads)

    rows = (pid_r * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
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
        s = mma(q, tl.permute(k, (0, 2, 1)), None, PRECISION) * scale_log2  # [R, M, N]
        s += (b.to(tl.float32) * LOG2E)[None, :, :]
        attend = valid_r[:, None] & valid_n[None, :]
        if HAS_MASK:
            attend = attend & (tl.load(mask_base + cols[None, :] * stride_ml, mask=attend, other=0) != 0)
        s = tl.where(attend[:, None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, :, None])
        dp = mma(do, tl.permute(v, (0, 2, 1)), None, PRECISION)
        ds = p * (dp - delta[:, :, None])
        dq += mma(ds.to(k.dtype), k, None, PRECISION)

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
    PRECISION: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # dBias of a bias broadcast over N is sum_n dS[n]. Each program owns one bias tile, loads it
    # once, and walks the rows n = 0..N-1 in order: the sum is reproducible bit for bit and the
    # bias tile is read once instead of N times.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    batch, head = _batch_and_head(num_heads)

    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_m = rows_m < seq_len
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    bias_tile = valid_m[:, None] & valid_n[None, :]

    b = tl.load(Bias + batch * stride_bb + head * stride_bh
                + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=bias_tile, other=0.0)
    b = b.to(tl.float32) * LOG2E

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
        s = mma(q, k_t, None, PRECISION) * scale_log2 + b
        s = tl.where(attend[None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = mma(do, v_t, None, PRECISION)
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




@triton.jit
def _evo_attention_delta_kernel(
    Out, DOut, Delta,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    num_heads, seq_len, head_dim,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # delta = rowsum(dO * O) for the fused backward, which has no dQ kernel to compute it.
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)
    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_m = rows_m < seq_len
    tile = valid_m[:, None] & (offs_d < head_dim)[None, :]
    o = tl.load(Out + batch * stride_ob + row * stride_on + head * stride_oh
                + rows_m[:, None] * stride_ol + offs_d[None, :] * stride_od, mask=tile, other=0.0)
    do = tl.load(DOut + batch * stride_gb + row * stride_gn + head * stride_gh
                 + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd, mask=tile, other=0.0)
    stat_base = ((batch * tl.num_programs(1) + row) * num_heads + head) * seq_len
    tl.store(Delta + stat_base + rows_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=valid_m)


@triton.jit
def _evo_attention_bwd_fused_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DK, DV, DQAcc, DBiasAcc,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bn, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    stride_ab, stride_an, stride_al, stride_ah, stride_ad,
    stride_cb, stride_ch, stride_cq, stride_ck,
    num_heads, seq_len, head_dim, scale, scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    ATOMIC_DBIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # The dK/dV kernel that also adds its share of dQ (ATOMIC_DQ) and of the shared bias's
    # gradient (ATOMIC_DBIAS) with fp32 atomics, so the backward needs no second pass over the
    # scores for dQ or dBias. Sums by atomics are not bitwise reproducible run to run.
    # The query loop of each program starts at a different block ((row + key block) mod count),
    # so programs running at the same time add into different addresses.
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)

    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_m = tile_range(0, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    kv_tile = valid_n[:, None] & valid_d[None, :]

    k = tl.load(K + batch * stride_kb + row * stride_kn + head * stride_kh
                + cols[:, None] * stride_kl + offs_d[None, :] * stride_kd, mask=kv_tile, other=0.0)
    v = tl.load(V + batch * stride_vb + row * stride_vn + head * stride_vh
                + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd, mask=kv_tile, other=0.0)
    attend = valid_n
    if HAS_MASK:
        attend = attend & (
            tl.load(Mask + batch * stride_mb + row * stride_mn + cols * stride_ml, mask=valid_n, other=0) != 0
        )

    q_base = Q + batch * stride_qb + row * stride_qn + head * stride_qh
    do_base = DOut + batch * stride_gb + row * stride_gn + head * stride_gh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    dq_base = DQAcc + batch * stride_ab + row * stride_an + head * stride_ah
    db_base = DBiasAcc + batch * stride_cb + head * stride_ch
    stat_base = ((batch * tl.num_programs(1) + row) * num_heads + head) * seq_len

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    q_blocks = tl.cdiv(seq_len, BLOCK_M)
    loop_blocks = q_blocks
    if HAS_MASK:
        key_end = tl.load(KeyEnd + batch * tl.num_programs(1) + row)
        loop_blocks = tl.where(pid_n * BLOCK_N < key_end, q_blocks, 0)
    first = (row + pid_n) % q_blocks
    for step in range(0, loop_blocks):
        block = first + step
        block = tl.where(block >= q_blocks, block - q_blocks, block)
        rows_m = block * BLOCK_M + offs_m
        valid_m = rows_m < seq_len
        q_tile = valid_m[:, None] & valid_d[None, :]
        q = tl.load(q_base + rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd, mask=q_tile, other=0.0)
        do = tl.load(do_base + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd, mask=q_tile, other=0.0)
        lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m, mask=valid_m, other=0.0)

        s_t = mma(k, tl.trans(q), None, PRECISION) * scale_log2  # [BLOCK_N, BLOCK_M]
        if HAS_BIAS:
            b_t = tl.load(bias_base + rows_m[None, :] * stride_bq + cols[:, None] * stride_bk,
                          mask=valid_n[:, None] & valid_m[None, :], other=0.0)
            s_t += b_t.to(tl.float32) * LOG2E
        s_t = tl.where(attend[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :])
        dv += mma(p_t.to(do.dtype), do, None, PRECISION)
        dp_t = mma(v, tl.trans(do), None, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        ds_low = ds_t.to(q.dtype)
        dk += mma(ds_low, q, None, PRECISION)
        if ATOMIC_DQ:
            dq_part = mma(tl.trans(ds_low), k, None, PRECISION) * scale  # [BLOCK_M, BLOCK_D]
            tl.atomic_add(dq_base + rows_m[:, None] * stride_al + offs_d[None, :] * stride_ad, dq_part,
                          mask=q_tile, sem="relaxed")
        if ATOMIC_DBIAS:
            tl.atomic_add(db_base + rows_m[None, :] * stride_cq + cols[:, None] * stride_ck, ds_t,
                          mask=valid_n[:, None] & valid_m[None, :], sem="relaxed")

    dk *= scale
    out_offs = (batch * stride_xb + row * stride_xn + head * stride_xh
                + cols[:, None] * stride_xl + offs_d[None, :] * stride_xd)
    tl.store(DK + out_offs, dk.to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + out_offs, dv.to(DV.dtype.element_ty), mask=kv_tile)


# ---------------------------------------------------------------------------------------------
# Row pairs: two rows of N per program for a bias shared by all rows, each row with its own 2-D
# products (the batched [ROWS, M, N] products of the `_rows` kernels lowered to slow code), so
# each bias tile is loaded, converted and scaled once for both rows, and the fused backward adds
# one dBias tile (the two rows' sum) per pair instead of one per row.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _fwd_row_step(q, k_t, v, bias_log2, attend, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr):
    """One key block of the forward for one row: the updated (m_i, l_i, acc)."""
    s = mma(q, k_t, None, PRECISION) * scale_log2 + bias_log2
    s = tl.where(attend[None, :], s, float("-inf"))
    p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, None, PRECISION)
    return m_i, l_i, acc


@triton.jit
def _evo_attention_fwd_pair_kernel(
    Q, K, V, Bias, Mask, KeyEnd, Out, Lse,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_ob, stride_on, stride_ol, stride_oh, stride_od,
    num_heads, num_rows, seq_len, head_dim, scale_log2,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row0 = tl.program_id(1).to(tl.int64) * 2
    # The second row may not exist (odd N): it then has no positions (len1 = 0), so every mask
    # derived from len1 is false (vector masks: the interpreter rejects scalar ones).
    len1 = tl.where(row0 + 1 < num_rows, seq_len, 0)
    batch, head = _batch_and_head(num_heads)

    offs_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_m = offs_m < seq_len
    valid_d = offs_d < head_dim
    q_tile = valid_m[:, None] & valid_d[None, :]
    q_offs = offs_m[:, None] * stride_ql + offs_d[None, :] * stride_qd
    q0 = tl.load(Q + batch * stride_qb + row0 * stride_qn + head * stride_qh + q_offs, mask=q_tile, other=0.0)
    q1 = tl.load(Q + batch * stride_qb + (row0 + 1) * stride_qn + head * stride_qh + q_offs,
                 mask=(offs_m < len1)[:, None] & valid_d[None, :], other=0.0)
    k0_base = K + batch * stride_kb + row0 * stride_kn + head * stride_kh
    v0_base = V + batch * stride_vb + row0 * stride_vn + head * stride_vh
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask0 = Mask + batch * stride_mb + row0 * stride_mn

    m0 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l0 = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    end0 = tl.full([], seq_len, tl.int32)
    end1 = tl.full([], 0, tl.int32) + len1
    if HAS_MASK:
        end0 = _key_end(mask0, stride_ml, seq_len, SCAN_MASK)
        end1 = _key_end(mask0 + stride_mn, stride_ml, len1, SCAN_MASK)
    if pid_m == 0:
        pair = row0 + tl.arange(0, 2)
        tl.store(KeyEnd + batch * num_rows + pair, tl.where(pair == row0, end0, end1), mask=pair < num_rows)
    for start_n in range(0, tl.maximum(end0, end1), BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        bias_log2 = tl.load(bias_base + offs_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                            mask=valid_m[:, None] & valid_n[None, :], other=0.0).to(tl.float32) * LOG2E
        kt_offs = cols[None, :] * stride_kl + offs_d[:, None] * stride_kd
        kt_tile = valid_d[:, None] & valid_n[None, :]
        v_offs = cols[:, None] * stride_vl + offs_d[None, :] * stride_vd
        v_tile = valid_n[:, None] & valid_d[None, :]
        attend0 = valid_n
        attend1 = cols < len1
        if HAS_MASK:
            attend0 = attend0 & (tl.load(mask0 + cols * stride_ml, mask=valid_n, other=0) != 0)
            attend1 = attend1 & (tl.load(mask0 + stride_mn + cols * stride_ml, mask=attend1, other=0) != 0)
        k_t = tl.load(k0_base + kt_offs, mask=kt_tile, other=0.0)
        v = tl.load(v0_base + v_offs, mask=v_tile, other=0.0)
        m0, l0, acc0 = _fwd_row_step(q0, k_t, v, bias_log2, attend0, m0, l0, acc0, scale_log2, PRECISION)
        k_t = tl.load(k0_base + stride_kn + kt_offs, mask=valid_d[:, None] & attend1[None, :], other=0.0)
        v = tl.load(v0_base + stride_vn + v_offs, mask=attend1[:, None] & valid_d[None, :], other=0.0)
        m1, l1, acc1 = _fwd_row_step(q1, k_t, v, bias_log2, attend1, m1, l1, acc1, scale_log2, PRECISION)

    o_offs = offs_m[:, None] * stride_ol + offs_d[None, :] * stride_od
    o_base = Out + batch * stride_ob + row0 * stride_on + head * stride_oh
    lse_base = Lse + ((batch * num_rows + row0) * num_heads + head) * seq_len
    out, lse = _online_softmax_result(acc0, m0, l0)
    tl.store(o_base + o_offs, out.to(Out.dtype.element_ty), mask=q_tile)
    tl.store(lse_base + offs_m, lse, mask=valid_m)
    out, lse = _online_softmax_result(acc1, m1, l1)
    valid_m1 = offs_m < len1
    tl.store(o_base + stride_on + o_offs, out.to(Out.dtype.element_ty), mask=valid_m1[:, None] & valid_d[None, :])
    tl.store(lse_base + num_heads * seq_len + offs_m, lse, mask=valid_m1)


@triton.jit
def _bwd_row_step(k, v, q, do, lse, delta, bias_log2, attend, dk, dv, DQ_PTRS, dq_tile, scale, scale_log2,
                  ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr):
    """One query block of the fused backward for one row, transposed ([keys, queries]): the
    updated (dk, dv) and the block's dS; adds the block's dQ at DQ_PTRS when ATOMIC_DQ."""
    s_t = mma(k, tl.trans(q), None, PRECISION) * scale_log2 + bias_log2
    s_t = tl.where(attend[:, None], s_t, float("-inf"))
    p_t = tl.math.exp2(s_t - lse[None, :])
    dv += mma(p_t.to(do.dtype), do, None, PRECISION)
    dp_t = mma(v, tl.trans(do), None, PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    ds_low = ds_t.to(q.dtype)
    dk += mma(ds_low, q, None, PRECISION)
    if ATOMIC_DQ:
        tl.atomic_add(DQ_PTRS, mma(tl.trans(ds_low), k, None, PRECISION) * scale, mask=dq_tile, sem="relaxed")
    return dk, dv, ds_t


@triton.jit
def _evo_attention_bwd_fused_pair_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DK, DV, DQAcc, DBiasAcc,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_xb, stride_xn, stride_xl, stride_xh, stride_xd,
    stride_ab, stride_an, stride_al, stride_ah, stride_ad,
    stride_cb, stride_ch, stride_cq, stride_ck,
    num_heads, num_rows, seq_len, head_dim, scale, scale_log2,
    HAS_MASK: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    ATOMIC_DBIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # _evo_attention_bwd_fused_kernel for two rows sharing the bias (row pairs, above).
    pid_n = tl.program_id(0)
    pid_r = tl.program_id(1)
    row0 = pid_r.to(tl.int64) * 2
    len1 = tl.where(row0 + 1 < num_rows, seq_len, 0)  # 0: no second row (odd N), as in the forward
    batch, head = _batch_and_head(num_heads)

    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_m = tile_range(0, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    kv_tile = valid_n[:, None] & valid_d[None, :]

    k_offs = batch * stride_kb + row0 * stride_kn + head * stride_kh + cols[:, None] * stride_kl + offs_d[None, :] * stride_kd
    v_offs = batch * stride_vb + row0 * stride_vn + head * stride_vh + cols[:, None] * stride_vl + offs_d[None, :] * stride_vd
    k0 = tl.load(K + k_offs, mask=kv_tile, other=0.0)
    v0 = tl.load(V + v_offs, mask=kv_tile, other=0.0)
    attend0 = valid_n
    attend1 = cols < len1
    kv1_tile = attend1[:, None] & valid_d[None, :]
    k1 = tl.load(K + stride_kn + k_offs, mask=kv1_tile, other=0.0)
    v1 = tl.load(V + stride_vn + v_offs, mask=kv1_tile, other=0.0)
    loop_blocks = tl.cdiv(seq_len, BLOCK_M)
    q_blocks = loop_blocks
    if HAS_MASK:
        mask0 = Mask + batch * stride_mb + row0 * stride_mn + cols * stride_ml
        attend0 = attend0 & (tl.load(mask0, mask=valid_n, other=0) != 0)
        attend1 = attend1 & (tl.load(mask0 + stride_mn, mask=attend1, other=0) != 0)
        pair = row0 + tl.arange(0, 2)
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + pair, mask=pair < num_rows, other=0), 0)
        loop_blocks = tl.where(pid_n * BLOCK_N < key_end, q_blocks, 0)

    q0_base = Q + batch * stride_qb + row0 * stride_qn + head * stride_qh
    do0_base = DOut + batch * stride_gb + row0 * stride_gn + head * stride_gh
    dq0_base = DQAcc + batch * stride_ab + row0 * stride_an + head * stride_ah
    bias_base = Bias + batch * stride_bb + head * stride_bh
    db_base = DBiasAcc + batch * stride_cb + head * stride_ch
    stat0 = ((batch * num_rows + row0) * num_heads + head) * seq_len
    stat1 = stat0 + num_heads * seq_len

    dk0 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv0 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dk1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first = (pid_r + pid_n) % q_blocks
    for step in range(0, loop_blocks):
        block = first + step
        block = tl.where(block >= q_blocks, block - q_blocks, block)
        rows_m = block * BLOCK_M + offs_m
        valid_m = rows_m < seq_len
        q_tile = valid_m[:, None] & valid_d[None, :]
        q_offs = rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd
        do_offs = rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd
        dq_offs = rows_m[:, None] * stride_al + offs_d[None, :] * stride_ad
        bias_tile = valid_n[:, None] & valid_m[None, :]
        bias_log2 = tl.load(bias_base + rows_m[None, :] * stride_bq + cols[:, None] * stride_bk,
                            mask=bias_tile, other=0.0).to(tl.float32) * LOG2E

        q = tl.load(q0_base + q_offs, mask=q_tile, other=0.0)
        do = tl.load(do0_base + do_offs, mask=q_tile, other=0.0)
        lse = tl.load(Lse + stat0 + rows_m, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat0 + rows_m, mask=valid_m, other=0.0)
        dk0, dv0, ds_sum = _bwd_row_step(k0, v0, q, do, lse, delta, bias_log2, attend0, dk0, dv0,
                                         dq0_base + dq_offs, q_tile, scale, scale_log2, ATOMIC_DQ, PRECISION)
        valid_m1 = rows_m < len1
        q1_tile = valid_m1[:, None] & valid_d[None, :]
        q = tl.load(q0_base + stride_qn + q_offs, mask=q1_tile, other=0.0)
        do = tl.load(do0_base + stride_gn + do_offs, mask=q1_tile, other=0.0)
        lse = tl.load(Lse + stat1 + rows_m, mask=valid_m1, other=float("inf"))
        delta = tl.load(Delta + stat1 + rows_m, mask=valid_m1, other=0.0)
        dk1, dv1, ds_t = _bwd_row_step(k1, v1, q, do, lse, delta, bias_log2, attend1, dk1, dv1,
                                       dq0_base + stride_an + dq_offs, q1_tile, scale, scale_log2,
                                       ATOMIC_DQ, PRECISION)
        if ATOMIC_DBIAS:
            tl.atomic_add(db_base + rows_m[None, :] * stride_cq + cols[:, None] * stride_ck, ds_sum + ds_t,
                          mask=bias_tile, sem="relaxed")

    x_offs = (batch * stride_xb + row0 * stride_xn + head * stride_xh
              + cols[:, None] * stride_xl + offs_d[None, :] * stride_xd)
    tl.store(DK + x_offs, (dk0 * scale).to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + x_offs, dv0.to(DV.dtype.element_ty), mask=kv_tile)
    tl.store(DK + stride_xn + x_offs, (dk1 * scale).to(DK.dtype.element_ty), mask=kv1_tile)
    tl.store(DV + stride_xn + x_offs, dv1.to(DV.dtype.element_ty), mask=kv1_tile)


@triton.jit
def _dq_row_step(q, do, k, v, lse, delta, bias_log2, attend, dq, scale_log2, PRECISION: tl.constexpr):
    """One key block of dQ for one row: the updated dq (unscaled)."""
    s = mma(q, tl.trans(k), None, PRECISION) * scale_log2 + bias_log2
    s = tl.where(attend[None, :], s, float("-inf"))
    p = tl.math.exp2(s - lse[:, None])
    dp = mma(do, tl.trans(v), None, PRECISION)
    ds = p * (dp - delta[:, None])
    return dq + mma(ds.to(k.dtype), k, None, PRECISION)


@triton.jit
def _evo_attention_bwd_q_pair_kernel(
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
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # The dQ kernel (which also writes delta) for two rows sharing the bias (row pairs, above).
    pid_m = tl.program_id(0)
    row0 = tl.program_id(1).to(tl.int64) * 2
    len1 = tl.where(row0 + 1 < num_rows, seq_len, 0)  # 0: no second row (odd N)
    batch, head = _batch_and_head(num_heads)

    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    offs_n = tile_range(0, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_m = rows_m < seq_len
    valid_m1 = rows_m < len1
    valid_d = offs_d < head_dim
    q_tile = valid_m[:, None] & valid_d[None, :]
    q1_tile = valid_m1[:, None] & valid_d[None, :]

    q_offs = batch * stride_qb + row0 * stride_qn + head * stride_qh + rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd
    g_offs = batch * stride_gb + row0 * stride_gn + head * stride_gh + rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd
    o_offs = batch * stride_ob + row0 * stride_on + head * stride_oh + rows_m[:, None] * stride_ol + offs_d[None, :] * stride_od
    q0 = tl.load(Q + q_offs, mask=q_tile, other=0.0)
    q1 = tl.load(Q + stride_qn + q_offs, mask=q1_tile, other=0.0)
    do0 = tl.load(DOut + g_offs, mask=q_tile, other=0.0)
    do1 = tl.load(DOut + stride_gn + g_offs, mask=q1_tile, other=0.0)
    delta0 = tl.sum(tl.load(Out + o_offs, mask=q_tile, other=0.0).to(tl.float32) * do0.to(tl.float32), 1)
    delta1 = tl.sum(tl.load(Out + stride_on + o_offs, mask=q1_tile, other=0.0).to(tl.float32)
                    * do1.to(tl.float32), 1)
    stat0 = ((batch * num_rows + row0) * num_heads + head) * seq_len
    stat1 = stat0 + num_heads * seq_len
    tl.store(Delta + stat0 + rows_m, delta0, mask=valid_m)
    tl.store(Delta + stat1 + rows_m, delta1, mask=valid_m1)
    lse0 = tl.load(Lse + stat0 + rows_m, mask=valid_m, other=float("inf"))
    lse1 = tl.load(Lse + stat1 + rows_m, mask=valid_m1, other=float("inf"))

    k0_base = K + batch * stride_kb + row0 * stride_kn + head * stride_kh
    v0_base = V + batch * stride_vb + row0 * stride_vn + head * stride_vh
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask0 = Mask + batch * stride_mb + row0 * stride_mn

    dq0 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    key_end = seq_len
    if HAS_MASK:
        pair = row0 + tl.arange(0, 2)
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + pair, mask=pair < num_rows, other=0), 0)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        bias_log2 = tl.load(bias_base + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                            mask=valid_m[:, None] & valid_n[None, :], other=0.0).to(tl.float32) * LOG2E
        attend0 = valid_n
        attend1 = cols < len1
        if HAS_MASK:
            attend0 = attend0 & (tl.load(mask0 + cols * stride_ml, mask=valid_n, other=0) != 0)
            attend1 = attend1 & (tl.load(mask0 + stride_mn + cols * stride_ml, mask=attend1, other=0) != 0)
        kv_offs_k = cols[:, None] * stride_kl + offs_d[None, :] * stride_kd
        kv_offs_v = cols[:, None] * stride_vl + offs_d[None, :] * stride_vd
        kv_tile = valid_n[:, None] & valid_d[None, :]
        k = tl.load(k0_base + kv_offs_k, mask=kv_tile, other=0.0)
        v = tl.load(v0_base + kv_offs_v, mask=kv_tile, other=0.0)
        dq0 = _dq_row_step(q0, do0, k, v, lse0, delta0, bias_log2, attend0, dq0, scale_log2, PRECISION)
        kv1_tile = attend1[:, None] & valid_d[None, :]
        k = tl.load(k0_base + stride_kn + kv_offs_k, mask=kv1_tile, other=0.0)
        v = tl.load(v0_base + stride_vn + kv_offs_v, mask=kv1_tile, other=0.0)
        dq1 = _dq_row_step(q1, do1, k, v, lse1, delta1, bias_log2, attend1, dq1, scale_log2, PRECISION)

    x_offs = batch * stride_xb + row0 * stride_xn + head * stride_xh + rows_m[:, None] * stride_xl + offs_d[None, :] * stride_xd
    tl.store(DQ + x_offs, (dq0 * scale).to(DQ.dtype.element_ty), mask=q_tile)
    tl.store(DQ + stride_xn + x_offs, (dq1 * scale).to(DQ.dtype.element_ty), mask=q1_tile)


@triton.jit
def _evo_attention_bwd_walk_kernel(
    Q, K, V, Bias, Mask, KeyEnd, DOut, Lse, Delta, DBias, DQAcc, DKAcc, DVAcc,
    stride_qb, stride_qn, stride_ql, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kl, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vl, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bq, stride_bk,
    stride_mb, stride_mn, stride_ml,
    stride_gb, stride_gn, stride_gl, stride_gh, stride_gd,
    stride_dbb, stride_dbh, stride_dbq, stride_dbk,
    stride_ab, stride_an, stride_al, stride_ah, stride_ad,
    num_heads, num_rows, seq_len, head_dim, scale, scale_log2,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    SCAN_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # The whole backward in one pass for a bias shared by all rows: each program owns one bias
    # tile, loads it once and walks the N rows (as the dBias kernel does), keeping dBias in
    # registers (a fixed order: reproducible) and adding each row's dQ, dK and dV shares to fp32
    # sums (DQAcc, DKAcc, DVAcc: contiguous [B, N, L, H, D]) with atomics. The walk starts at a
    # different row per tile so the programs in flight add into different rows.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    batch, head = _batch_and_head(num_heads)

    rows_m = tile_range(pid_m * BLOCK_M, BLOCK_M, WIDE_INDEX)
    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_m = rows_m < seq_len
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim
    bias_tile = valid_m[:, None] & valid_n[None, :]
    q_tile = valid_m[:, None] & valid_d[None, :]
    kv_tile = valid_n[:, None] & valid_d[None, :]

    b = tl.load(Bias + batch * stride_bb + head * stride_bh + rows_m[:, None] * stride_bq + cols[None, :] * stride_bk,
                mask=bias_tile, other=0.0).to(tl.float32) * LOG2E
    q_offs = rows_m[:, None] * stride_ql + offs_d[None, :] * stride_qd
    do_offs = rows_m[:, None] * stride_gl + offs_d[None, :] * stride_gd
    k_offs = cols[:, None] * stride_kl + offs_d[None, :] * stride_kd
    v_offs = cols[:, None] * stride_vl + offs_d[None, :] * stride_vd
    acc_q_offs = rows_m[:, None] * stride_al + offs_d[None, :] * stride_ad
    acc_k_offs = cols[:, None] * stride_al + offs_d[None, :] * stride_ad

    dbias = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    rows_to_walk = num_rows
    if HAS_MASK:
        # Past the last attended key of every row, dS is zero: such a tile skips the walk.
        key_max = tl.full([], 0, tl.int32)
        for start in range(0, num_rows, SCAN_MASK):
            idx = start + tl.arange(0, SCAN_MASK)
            key_max = tl.maximum(key_max, tl.max(tl.load(KeyEnd + batch * num_rows + idx, mask=idx < num_rows,
                                                         other=0), 0))
        rows_to_walk = tl.where(pid_n * BLOCK_N < key_max, num_rows, 0)
    first = (pid_m * tl.num_programs(0) + pid_n) % num_rows
    for step in range(0, rows_to_walk):
        row = first + step
        row = tl.where(row >= num_rows, row - num_rows, row).to(tl.int64)
        # A row whose last attended key comes before this tile adds nothing: its atomics are
        # masked off (live_len 0). No branch around the work, which would stop the loads of the
        # loop from being pipelined.
        live_len = seq_len
        if HAS_MASK:
            live_len = tl.where(pid_n * BLOCK_N < tl.load(KeyEnd + batch * num_rows + row), seq_len, 0)
        q = tl.load(Q + batch * stride_qb + row * stride_qn + head * stride_qh + q_offs, mask=q_tile, other=0.0)
        do = tl.load(DOut + batch * stride_gb + row * stride_gn + head * stride_gh + do_offs, mask=q_tile, other=0.0)
        k = tl.load(K + batch * stride_kb + row * stride_kn + head * stride_kh + k_offs, mask=kv_tile, other=0.0)
        v = tl.load(V + batch * stride_vb + row * stride_vn + head * stride_vh + v_offs, mask=kv_tile, other=0.0)
        stat = ((batch * num_rows + row) * num_heads + head) * seq_len + rows_m
        lse = tl.load(Lse + stat, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat, mask=valid_m, other=0.0)
        attend = valid_n
        if HAS_MASK:
            attend = attend & (tl.load(Mask + batch * stride_mb + row * stride_mn + cols * stride_ml,
                                       mask=valid_n, other=0) != 0)
        s = mma(q, tl.trans(k), None, PRECISION) * scale_log2 + b
        s = tl.where(attend[None, :], s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = mma(do, tl.trans(v), None, PRECISION)
        ds = p * (dp - delta[:, None])
        dbias += ds
        ds_low = ds.to(q.dtype)
        acc_base = batch * stride_ab + row * stride_an + head * stride_ah
        live_kv = (cols < live_len)[:, None] & valid_d[None, :]
        tl.atomic_add(DVAcc + acc_base + acc_k_offs, mma(tl.trans(p.to(do.dtype)), do, None, PRECISION),
                      mask=live_kv, sem="relaxed")
        tl.atomic_add(DKAcc + acc_base + acc_k_offs, mma(tl.trans(ds_low), q, None, PRECISION) * scale,
                      mask=live_kv, sem="relaxed")
        tl.atomic_add(DQAcc + acc_base + acc_q_offs, mma(ds_low, k, None, PRECISION) * scale,
                      mask=(rows_m < live_len)[:, None] & valid_d[None, :], sem="relaxed")

    tl.store(DBias + batch * stride_dbb + head * stride_dbh + rows_m[:, None] * stride_dbq + cols[None, :] * stride_dbk,
             dbias.to(DBias.dtype.element_ty), mask=bias_tile)
