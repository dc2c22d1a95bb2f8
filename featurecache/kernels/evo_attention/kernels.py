"""EvoAttention's Triton kernels, flash-attention style with fp32 accumulation.

forward   one program per (q block, row n, b*h): online softmax, writes out and the row's
          logsumexp (kept in log2 units, the kernels' working domain).
backward  two modes (config.BWD_MODES):
          "split"  dQ per (q block, row n, b*h) looping over k blocks, which also writes
                   delta = rowsum(dO * O) and, when the bias is per row, dBias; then dK/dV per
                   (k block, row n, b*h) looping over q blocks; then, for a bias broadcast over
                   N, dBias per (k block, q block, b*h) looping over the N rows in a fixed
                   order, so the sum over N is bitwise reproducible (no atomics).
          "fused"  delta first (`_delta`), then one dK/dV pass (`_bwd_fused`) that adds dQ and
                   the shared bias's gradient to fp32 sums with atomics (not reproducible).
Key loops stop at each row's last attended key, found once by the forward kernel.

The `_rows` variants handle ROWS rows of N per program when the bias is shared by all rows
(batched [ROWS, M, N] products), so each bias tile is loaded and scaled once for all of them.

Offsets: batch, row and head offsets are always 64-bit; offsets inside a tile (position x
stride) are 32-bit unless WIDE_INDEX, which the launcher sets when a tile of some tensor spans
2^31 elements or more (the ending node's transposed views past L ~ 2000).

Logits are in log2 units (exp2 is the GPU's native exponential): scale_log2 = scale * log2(e),
and the bias is multiplied by LOG2E where it is loaded.

Stride names: q, k, v, out (o), dOut (g), the dK/dV/dQ outputs (x) and the fused backward's
fp32 dQ sum (a) are [B, N, L, H, D] (b, n, l, h, d); bias (b*), its fp32 sum (c*) and dBias
(db*) are [B, N or 1, H, L, L] (b, n, h, q, k); mask [B, N, L] (m*).
"""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import mma, tile_range

LOG2E = tl.constexpr(1.4426950408889634)

# ---------------------------------------------------------------------------------------------
# Building blocks (inlined by Triton: a helper costs nothing over writing its body out)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _batch_and_head(num_heads):
    """The (batch, head) this program works on: grid axis 2 runs over batch * heads."""
    pid_bh = tl.program_id(2)
    return (pid_bh // num_heads).to(tl.int64), (pid_bh % num_heads).to(tl.int64)


@triton.jit
def _stats_offset(batch, row, num_rows, num_heads, head, seq_len):
    """Where (batch, row, head) starts in the contiguous [B, N, H, L] lse and delta."""
    return ((batch * num_rows + row) * num_heads + head) * seq_len


@triton.jit
def _tile_ptrs(base, offs_a, offs_b, stride_a, stride_b):
    """Pointers of a [len(offs_a), len(offs_b)] tile; swap the two axes to read a tile transposed
    through its strides, without a copy."""
    return base + offs_a[:, None] * stride_a + offs_b[None, :] * stride_b


@triton.jit
def _load_tile(base, offs_a, offs_b, stride_a, stride_b, valid_a, valid_b):
    """A tile (as _tile_ptrs), zeros outside valid_a x valid_b."""
    return tl.load(
        _tile_ptrs(base, offs_a, offs_b, stride_a, stride_b), mask=valid_a[:, None] & valid_b[None, :], other=0.0
    )


@triton.jit
def _store_tile(base, value, offs_a, offs_b, stride_a, stride_b, valid_a, valid_b):
    tl.store(_tile_ptrs(base, offs_a, offs_b, stride_a, stride_b), value, mask=valid_a[:, None] & valid_b[None, :])


@triton.jit
def _load_bias_log2(base, offs_a, offs_b, stride_a, stride_b, valid_a, valid_b):
    """A bias tile in fp32 and log2 units, as the logits it is added to."""
    return _load_tile(base, offs_a, offs_b, stride_a, stride_b, valid_a, valid_b).to(tl.float32) * LOG2E


@triton.jit
def _attended(mask_row, cols, stride_ml, valid_n, HAS_MASK: tl.constexpr):
    """Which keys `cols` of one row exist and are attended."""
    attend = valid_n
    if HAS_MASK:
        attend = attend & (tl.load(mask_row + cols * stride_ml, mask=valid_n, other=0) != 0)
    return attend


@triton.jit
def _row_delta(o, do, AXIS: tl.constexpr):
    """delta = rowsum(dO * O) in fp32: the softmax backward's correction term."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), AXIS)


@triton.jit
def _load_row_tiles(base, rows, offs_a, offs_b, stride_n, stride_a, stride_b, valid_r, valid_a, valid_b):
    """[ROWS, len(offs_a), len(offs_b)] tiles of a group of rows, zeros outside the valid ranges."""
    return tl.load(
        base + rows[:, None, None] * stride_n + offs_a[None, :, None] * stride_a + offs_b[None, None, :] * stride_b,
        mask=valid_r[:, None, None] & valid_a[None, :, None] & valid_b[None, None, :],
        other=0.0,
    )


@triton.jit
def _store_row_tiles(base, value, rows, offs_a, offs_b, stride_n, stride_a, stride_b, valid_r, valid_a, valid_b):
    tl.store(
        base + rows[:, None, None] * stride_n + offs_a[None, :, None] * stride_a + offs_b[None, None, :] * stride_b,
        value,
        mask=valid_r[:, None, None] & valid_a[None, :, None] & valid_b[None, None, :],
    )


@triton.jit
def _attended_rows(mask_base, rows, cols, stride_mn, stride_ml, valid_r, valid_n, HAS_MASK: tl.constexpr):
    """_attended for a group of rows: [ROWS, len(cols)]."""
    attend = valid_r[:, None] & valid_n[None, :]
    if HAS_MASK:
        attend = attend & (
            tl.load(mask_base + rows[:, None] * stride_mn + cols[None, :] * stride_ml, mask=attend, other=0) != 0
        )
    return attend


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
def _score_grads(s, attend, lse, do, v_t, delta, PRECISION: tl.constexpr):
    """dS of one [queries, keys] block (or [ROWS, queries, keys] blocks) from its logits s (log2
    units, bias added): P again from the forward's lse, dP = dO V^T (v_t: V^T, or a transposed
    view of a V tile)."""
    s = tl.where(tl.expand_dims(attend, -2), s, float("-inf"))
    p = tl.math.exp2(s - tl.expand_dims(lse, -1))
    dp = mma(do, v_t, None, PRECISION)
    return p * (dp - tl.expand_dims(delta, -1))


@triton.jit
def _kv_block_grads(k, v, q, do, do_t, s_t, attend, lse, delta, dk, dv, PRECISION: tl.constexpr):
    """One query block of dK / dV (or of ROWS rows' dK / dV), built transposed ([keys, queries])
    so no tile needs a transpose but q's and dO's (do_t; a shared-memory layout, not a copy):
    from the block's logits s_t (log2 units, bias added), the updated (dk, dv, unscaled) and
    the block's dS^T."""
    s_t = tl.where(tl.expand_dims(attend, -1), s_t, float("-inf"))
    p_t = tl.math.exp2(s_t - tl.expand_dims(lse, -2))
    dv += mma(p_t.to(do.dtype), do, None, PRECISION)
    dp_t = mma(v, do_t, None, PRECISION)
    ds_t = p_t * (dp_t - tl.expand_dims(delta, -2))
    dk += mma(ds_t.to(q.dtype), q, None, PRECISION)
    return dk, dv, ds_t


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
        attended = (
            tl.load(
                mask_rows[:, None] + idx[None, :] * stride_ml, mask=valid_r[:, None] & (idx < seq_len)[None, :], other=0
            )
            != 0
        )
        ends = tl.maximum(ends, tl.max(tl.where(attended, idx[None, :] + 1, 0), 1))
    return ends


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


@triton.jit
def _evo_attention_fwd_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    Out,
    Lse,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bn,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_ob,
    stride_on,
    stride_ol,
    stride_oh,
    stride_od,
    num_heads,
    seq_len,
    head_dim,
    scale_log2,
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

    q = _load_tile(q_base, offs_m, offs_d, stride_ql, stride_qd, valid_m, valid_d)
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
        k_t = _load_tile(k_base, offs_d, cols, stride_kd, stride_kl, valid_d, valid_n)
        s = mma(q, k_t, None, PRECISION) * scale_log2
        if HAS_BIAS:
            s += _load_bias_log2(bias_base, offs_m, cols, stride_bq, stride_bk, valid_m, valid_n)
        attend = _attended(mask_base, cols, stride_ml, valid_n, HAS_MASK)
        s = tl.where(attend[None, :], s, float("-inf"))

        p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i)
        v = _load_tile(v_base, cols, offs_d, stride_vl, stride_vd, valid_n, valid_d)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, None, PRECISION)

    out, lse = _online_softmax_result(acc, m_i, l_i)
    o_base = Out + batch * stride_ob + row * stride_on + head * stride_oh
    _store_tile(o_base, out.to(Out.dtype.element_ty), offs_m, offs_d, stride_ol, stride_od, valid_m, valid_d)
    # Lse is contiguous [B, N, H, L].
    tl.store(Lse + _stats_offset(batch, row, tl.num_programs(1), num_heads, head, seq_len) + offs_m, lse, mask=valid_m)


@triton.jit
def _evo_attention_fwd_rows_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    Out,
    Lse,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_ob,
    stride_on,
    stride_ol,
    stride_oh,
    stride_od,
    num_heads,
    num_rows,
    seq_len,
    head_dim,
    scale_log2,
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

    q = _load_row_tiles(
        Q + batch * stride_qb + head * stride_qh,
        rows,
        offs_m,
        offs_d,
        stride_qn,
        stride_ql,
        stride_qd,
        valid_r,
        valid_m,
        valid_d,
    )
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask_base = Mask + batch * stride_mb

    m_i = tl.full([ROWS, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS, BLOCK_M], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_M, BLOCK_D], tl.float32)
    ends = tl.full([ROWS], seq_len, tl.int32)
    if HAS_MASK:
        ends = _key_ends_of_rows(mask_base + rows * stride_mn, valid_r, stride_ml, seq_len, ROWS, SCAN_MASK)
    if pid_m == 0:
        tl.store(KeyEnd + batch * num_rows + rows, ends, mask=valid_r)
    key_end = tl.max(tl.where(valid_r, ends, 0), 0)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        k_t = _load_row_tiles(k_base, rows, offs_d, cols, stride_kn, stride_kd, stride_kl, valid_r, valid_d, valid_n)
        s = mma(q, k_t, None, PRECISION) * scale_log2  # [ROWS, BLOCK_M, BLOCK_N]
        if HAS_BIAS:
            s += _load_bias_log2(bias_base, offs_m, cols, stride_bq, stride_bk, valid_m, valid_n)[None, :, :]
        attend = _attended_rows(mask_base, rows, cols, stride_mn, stride_ml, valid_r, valid_n, HAS_MASK)
        s = tl.where(attend[:, None, :], s, float("-inf"))

        p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i)
        v = _load_row_tiles(v_base, rows, cols, offs_d, stride_vn, stride_vl, stride_vd, valid_r, valid_n, valid_d)
        acc = acc * alpha[:, :, None] + mma(p.to(v.dtype), v, None, PRECISION)

    out, lse = _online_softmax_result(acc, m_i, l_i)
    _store_row_tiles(
        Out + batch * stride_ob + head * stride_oh,
        out.to(Out.dtype.element_ty),
        rows,
        offs_m,
        offs_d,
        stride_on,
        stride_ol,
        stride_od,
        valid_r,
        valid_m,
        valid_d,
    )
    lse_offs = _stats_offset(batch, rows[:, None], num_rows, num_heads, head, seq_len) + offs_m[None, :]
    tl.store(Lse + lse_offs, lse, mask=valid_r[:, None] & valid_m[None, :])


# ---------------------------------------------------------------------------------------------
# Backward, "split": dQ (and delta), dK/dV, then dBias of a shared bias
# ---------------------------------------------------------------------------------------------


@triton.jit
def _evo_attention_bwd_kv_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    DOut,
    Lse,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bn,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_xb,
    stride_xn,
    stride_xl,
    stride_xh,
    stride_xd,
    num_heads,
    seq_len,
    head_dim,
    scale,
    scale_log2,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # One program owns a block of keys of one row and head and loops over all queries.
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    batch, head = _batch_and_head(num_heads)

    cols = tile_range(pid_n * BLOCK_N, BLOCK_N, WIDE_INDEX)
    offs_m = tile_range(0, BLOCK_M, WIDE_INDEX)
    offs_d = tile_range(0, BLOCK_D, WIDE_INDEX)
    valid_n = cols < seq_len
    valid_d = offs_d < head_dim

    k = _load_tile(
        K + batch * stride_kb + row * stride_kn + head * stride_kh, cols, offs_d, stride_kl, stride_kd, valid_n, valid_d
    )
    v = _load_tile(
        V + batch * stride_vb + row * stride_vn + head * stride_vh, cols, offs_d, stride_vl, stride_vd, valid_n, valid_d
    )
    attend = _attended(Mask + batch * stride_mb + row * stride_mn, cols, stride_ml, valid_n, HAS_MASK)

    q_base = Q + batch * stride_qb + row * stride_qn + head * stride_qh
    do_base = DOut + batch * stride_gb + row * stride_gn + head * stride_gh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    stat_base = _stats_offset(batch, row, tl.num_programs(1), num_heads, head, seq_len)

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
        q = _load_tile(q_base, rows_m, offs_d, stride_ql, stride_qd, valid_m, valid_d)
        do = _load_tile(do_base, rows_m, offs_d, stride_gl, stride_gd, valid_m, valid_d)
        lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m, mask=valid_m, other=0.0)

        s_t = mma(k, tl.trans(q), None, PRECISION) * scale_log2  # [BLOCK_N, BLOCK_M]
        if HAS_BIAS:
            s_t += _load_bias_log2(bias_base, cols, rows_m, stride_bk, stride_bq, valid_n, valid_m)
        dk, dv, _ = _kv_block_grads(k, v, q, do, tl.trans(do), s_t, attend, lse, delta, dk, dv, PRECISION)

    dk *= scale
    # dK and dV are fresh tensors of one layout (stride_x*), whatever the layout of k and v.
    out_base = batch * stride_xb + row * stride_xn + head * stride_xh
    _store_tile(DK + out_base, dk.to(DK.dtype.element_ty), cols, offs_d, stride_xl, stride_xd, valid_n, valid_d)
    _store_tile(DV + out_base, dv.to(DV.dtype.element_ty), cols, offs_d, stride_xl, stride_xd, valid_n, valid_d)


@triton.jit
def _evo_attention_bwd_q_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    Out,
    DOut,
    Lse,
    Delta,
    DQ,
    DBias,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bn,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_ob,
    stride_on,
    stride_ol,
    stride_oh,
    stride_od,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_dbb,
    stride_dbn,
    stride_dbh,
    stride_dbq,
    stride_dbk,
    stride_xb,
    stride_xn,
    stride_xl,
    stride_xh,
    stride_xd,
    num_heads,
    seq_len,
    head_dim,
    scale,
    scale_log2,
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

    q = _load_tile(
        Q + batch * stride_qb + row * stride_qn + head * stride_qh,
        rows_m,
        offs_d,
        stride_ql,
        stride_qd,
        valid_m,
        valid_d,
    )
    do = _load_tile(
        DOut + batch * stride_gb + row * stride_gn + head * stride_gh,
        rows_m,
        offs_d,
        stride_gl,
        stride_gd,
        valid_m,
        valid_d,
    )
    o = _load_tile(
        Out + batch * stride_ob + row * stride_on + head * stride_oh,
        rows_m,
        offs_d,
        stride_ol,
        stride_od,
        valid_m,
        valid_d,
    )
    stat_base = _stats_offset(batch, row, tl.num_programs(1), num_heads, head, seq_len)
    lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
    # delta = rowsum(dO * O), kept for the dK/dV kernel, which runs after this one.
    delta = _row_delta(o, do, 1)
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
        k = _load_tile(k_base, cols, offs_d, stride_kl, stride_kd, valid_n, valid_d)
        v = _load_tile(v_base, cols, offs_d, stride_vl, stride_vd, valid_n, valid_d)
        s = mma(q, tl.trans(k), None, PRECISION) * scale_log2
        if HAS_BIAS:
            s += _load_bias_log2(bias_base, rows_m, cols, stride_bq, stride_bk, valid_m, valid_n)
        attend = _attended(mask_base, cols, stride_ml, valid_n, HAS_MASK)
        ds = _score_grads(s, attend, lse, do, tl.trans(v), delta, PRECISION)
        dq += mma(ds.to(k.dtype), k, None, PRECISION)
        if STORE_DBIAS:
            # Per-row bias: dBias of this (row, head) tile is dS itself, owned by this program.
            _store_tile(
                dbias_base, ds.to(DBias.dtype.element_ty), rows_m, cols, stride_dbq, stride_dbk, valid_m, valid_n
            )
    if STORE_DBIAS:
        # Keys past the last attended one were skipped above; their bias gradient is zero.
        for start_n in range(tl.cdiv(key_end, BLOCK_N) * BLOCK_N, seq_len, BLOCK_N):
            cols = start_n + offs_n
            _store_tile(
                dbias_base,
                tl.zeros([BLOCK_M, BLOCK_N], DBias.dtype.element_ty),
                rows_m,
                cols,
                stride_dbq,
                stride_dbk,
                valid_m,
                cols < seq_len,
            )

    dq *= scale
    _store_tile(
        DQ + batch * stride_xb + row * stride_xn + head * stride_xh,
        dq.to(DQ.dtype.element_ty),
        rows_m,
        offs_d,
        stride_xl,
        stride_xd,
        valid_m,
        valid_d,
    )


@triton.jit
def _evo_attention_bwd_kv_rows_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    DOut,
    Lse,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_xb,
    stride_xn,
    stride_xl,
    stride_xh,
    stride_xd,
    num_heads,
    num_rows,
    seq_len,
    head_dim,
    scale,
    scale_log2,
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

    k = _load_row_tiles(
        K + batch * stride_kb + head * stride_kh,
        rows,
        cols,
        offs_d,
        stride_kn,
        stride_kl,
        stride_kd,
        valid_r,
        valid_n,
        valid_d,
    )
    v = _load_row_tiles(
        V + batch * stride_vb + head * stride_vh,
        rows,
        cols,
        offs_d,
        stride_vn,
        stride_vl,
        stride_vd,
        valid_r,
        valid_n,
        valid_d,
    )
    attend = _attended_rows(Mask + batch * stride_mb, rows, cols, stride_mn, stride_ml, valid_r, valid_n, HAS_MASK)
    q_base = Q + batch * stride_qb + head * stride_qh
    do_base = DOut + batch * stride_gb + head * stride_gh
    bias_base = Bias + batch * stride_bb + head * stride_bh
    stat_base = _stats_offset(batch, rows[:, None], num_rows, num_heads, head, seq_len)

    dk = tl.zeros([ROWS, BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([ROWS, BLOCK_N, BLOCK_D], tl.float32)
    query_end = seq_len
    if HAS_MASK:
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + rows, mask=valid_r, other=0), 0)
        query_end = tl.where(pid_n * BLOCK_N < key_end, seq_len, 0)
    for start_m in range(0, query_end, BLOCK_M):
        rows_m = start_m + offs_m
        valid_m = rows_m < seq_len
        q = _load_row_tiles(q_base, rows, rows_m, offs_d, stride_qn, stride_ql, stride_qd, valid_r, valid_m, valid_d)
        do = _load_row_tiles(do_base, rows, rows_m, offs_d, stride_gn, stride_gl, stride_gd, valid_r, valid_m, valid_d)
        stat_mask = valid_r[:, None] & valid_m[None, :]
        lse = tl.load(Lse + stat_base + rows_m[None, :], mask=stat_mask, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m[None, :], mask=stat_mask, other=0.0)
        s_t = mma(k, tl.permute(q, (0, 2, 1)), None, PRECISION) * scale_log2  # [R, N, M]
        s_t += _load_bias_log2(bias_base, cols, rows_m, stride_bk, stride_bq, valid_n, valid_m)[None, :, :]
        dk, dv, _ = _kv_block_grads(k, v, q, do, tl.permute(do, (0, 2, 1)), s_t, attend, lse, delta, dk, dv, PRECISION)

    dk *= scale
    out_base = batch * stride_xb + head * stride_xh
    _store_row_tiles(
        DK + out_base,
        dk.to(DK.dtype.element_ty),
        rows,
        cols,
        offs_d,
        stride_xn,
        stride_xl,
        stride_xd,
        valid_r,
        valid_n,
        valid_d,
    )
    _store_row_tiles(
        DV + out_base,
        dv.to(DV.dtype.element_ty),
        rows,
        cols,
        offs_d,
        stride_xn,
        stride_xl,
        stride_xd,
        valid_r,
        valid_n,
        valid_d,
    )


@triton.jit
def _evo_attention_bwd_q_rows_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    Out,
    DOut,
    Lse,
    Delta,
    DQ,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_ob,
    stride_on,
    stride_ol,
    stride_oh,
    stride_od,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_xb,
    stride_xn,
    stride_xl,
    stride_xh,
    stride_xd,
    num_heads,
    num_rows,
    seq_len,
    head_dim,
    scale,
    scale_log2,
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

    q = _load_row_tiles(
        Q + batch * stride_qb + head * stride_qh,
        rows,
        rows_m,
        offs_d,
        stride_qn,
        stride_ql,
        stride_qd,
        valid_r,
        valid_m,
        valid_d,
    )
    do = _load_row_tiles(
        DOut + batch * stride_gb + head * stride_gh,
        rows,
        rows_m,
        offs_d,
        stride_gn,
        stride_gl,
        stride_gd,
        valid_r,
        valid_m,
        valid_d,
    )
    o = _load_row_tiles(
        Out + batch * stride_ob + head * stride_oh,
        rows,
        rows_m,
        offs_d,
        stride_on,
        stride_ol,
        stride_od,
        valid_r,
        valid_m,
        valid_d,
    )
    stat_offs = _stats_offset(batch, rows[:, None], num_rows, num_heads, head, seq_len) + rows_m[None, :]
    stat_mask = valid_r[:, None] & valid_m[None, :]
    lse = tl.load(Lse + stat_offs, mask=stat_mask, other=float("inf"))
    delta = _row_delta(o, do, 2)
    tl.store(Delta + stat_offs, delta, mask=stat_mask)

    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    bias_base = Bias + batch * stride_bb + head * stride_bh
    mask_base = Mask + batch * stride_mb

    dq = tl.zeros([ROWS, BLOCK_M, BLOCK_D], tl.float32)
    key_end = seq_len
    if HAS_MASK:
        key_end = tl.max(tl.load(KeyEnd + batch * num_rows + rows, mask=valid_r, other=0), 0)
    for start_n in range(0, key_end, BLOCK_N):
        cols = start_n + offs_n
        valid_n = cols < seq_len
        k = _load_row_tiles(k_base, rows, cols, offs_d, stride_kn, stride_kl, stride_kd, valid_r, valid_n, valid_d)
        v = _load_row_tiles(v_base, rows, cols, offs_d, stride_vn, stride_vl, stride_vd, valid_r, valid_n, valid_d)
        s = mma(q, tl.permute(k, (0, 2, 1)), None, PRECISION) * scale_log2  # [R, M, N]
        s += _load_bias_log2(bias_base, rows_m, cols, stride_bq, stride_bk, valid_m, valid_n)[None, :, :]
        attend = _attended_rows(mask_base, rows, cols, stride_mn, stride_ml, valid_r, valid_n, HAS_MASK)
        ds = _score_grads(s, attend, lse, do, tl.permute(v, (0, 2, 1)), delta, PRECISION)
        dq += mma(ds.to(k.dtype), k, None, PRECISION)

    dq *= scale
    _store_row_tiles(
        DQ + batch * stride_xb + head * stride_xh,
        dq.to(DQ.dtype.element_ty),
        rows,
        rows_m,
        offs_d,
        stride_xn,
        stride_xl,
        stride_xd,
        valid_r,
        valid_m,
        valid_d,
    )


@triton.jit
def _evo_attention_bwd_bias_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    DOut,
    Lse,
    Delta,
    DBias,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_dbb,
    stride_dbh,
    stride_dbq,
    stride_dbk,
    num_heads,
    num_rows,
    seq_len,
    head_dim,
    scale_log2,
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

    b = _load_bias_log2(
        Bias + batch * stride_bb + head * stride_bh, rows_m, cols, stride_bq, stride_bk, valid_m, valid_n
    )

    # Row pointers advance by one row stride per step (64-bit pointer arithmetic, no row * stride).
    q_ptrs = _tile_ptrs(Q + batch * stride_qb + head * stride_qh, rows_m, offs_d, stride_ql, stride_qd)
    do_ptrs = _tile_ptrs(DOut + batch * stride_gb + head * stride_gh, rows_m, offs_d, stride_gl, stride_gd)
    k_t_ptrs = _tile_ptrs(K + batch * stride_kb + head * stride_kh, offs_d, cols, stride_kd, stride_kl)
    v_t_ptrs = _tile_ptrs(V + batch * stride_vb + head * stride_vh, offs_d, cols, stride_vd, stride_vl)
    mask_ptrs = Mask + batch * stride_mb + cols * stride_ml
    stat_ptrs = Lse + _stats_offset(batch, 0, num_rows, num_heads, head, seq_len) + rows_m
    delta_ptrs = Delta + _stats_offset(batch, 0, num_rows, num_heads, head, seq_len) + rows_m
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
        dbias += _score_grads(mma(q, k_t, None, PRECISION) * scale_log2 + b, attend, lse, do, v_t, delta, PRECISION)
        q_ptrs += stride_qn
        do_ptrs += stride_gn
        k_t_ptrs += stride_kn
        v_t_ptrs += stride_vn
        mask_ptrs += stride_mn
        stat_ptrs += num_heads * seq_len
        delta_ptrs += num_heads * seq_len

    _store_tile(
        DBias + batch * stride_dbb + head * stride_dbh,
        dbias.to(DBias.dtype.element_ty),
        rows_m,
        cols,
        stride_dbq,
        stride_dbk,
        valid_m,
        valid_n,
    )


# ---------------------------------------------------------------------------------------------
# Backward, "fused": delta, then one dK/dV pass adding dQ and dBias by fp32 atomics
# ---------------------------------------------------------------------------------------------


@triton.jit
def _evo_attention_delta_kernel(
    Out,
    DOut,
    Delta,
    stride_ob,
    stride_on,
    stride_ol,
    stride_oh,
    stride_od,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    num_heads,
    seq_len,
    head_dim,
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
    valid_d = offs_d < head_dim
    o = _load_tile(
        Out + batch * stride_ob + row * stride_on + head * stride_oh,
        rows_m,
        offs_d,
        stride_ol,
        stride_od,
        valid_m,
        valid_d,
    )
    do = _load_tile(
        DOut + batch * stride_gb + row * stride_gn + head * stride_gh,
        rows_m,
        offs_d,
        stride_gl,
        stride_gd,
        valid_m,
        valid_d,
    )
    stat_base = _stats_offset(batch, row, tl.num_programs(1), num_heads, head, seq_len)
    tl.store(Delta + stat_base + rows_m, _row_delta(o, do, 1), mask=valid_m)


@triton.jit
def _evo_attention_bwd_fused_kernel(
    Q,
    K,
    V,
    Bias,
    Mask,
    KeyEnd,
    DOut,
    Lse,
    Delta,
    DK,
    DV,
    DQAcc,
    DBiasAcc,
    stride_qb,
    stride_qn,
    stride_ql,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kl,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vl,
    stride_vh,
    stride_vd,
    stride_bb,
    stride_bn,
    stride_bh,
    stride_bq,
    stride_bk,
    stride_mb,
    stride_mn,
    stride_ml,
    stride_gb,
    stride_gn,
    stride_gl,
    stride_gh,
    stride_gd,
    stride_xb,
    stride_xn,
    stride_xl,
    stride_xh,
    stride_xd,
    stride_ab,
    stride_an,
    stride_al,
    stride_ah,
    stride_ad,
    stride_cb,
    stride_ch,
    stride_cq,
    stride_ck,
    num_heads,
    seq_len,
    head_dim,
    scale,
    scale_log2,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    # The dK/dV kernel that also adds its share of dQ and of the shared bias's gradient with fp32
    # atomics, so the backward needs no second pass over the scores for dQ or dBias. Sums by
    # atomics are not bitwise reproducible run to run.
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

    k = _load_tile(
        K + batch * stride_kb + row * stride_kn + head * stride_kh, cols, offs_d, stride_kl, stride_kd, valid_n, valid_d
    )
    v = _load_tile(
        V + batch * stride_vb + row * stride_vn + head * stride_vh, cols, offs_d, stride_vl, stride_vd, valid_n, valid_d
    )
    attend = _attended(Mask + batch * stride_mb + row * stride_mn, cols, stride_ml, valid_n, HAS_MASK)

    q_base = Q + batch * stride_qb + row * stride_qn + head * stride_qh
    do_base = DOut + batch * stride_gb + row * stride_gn + head * stride_gh
    bias_base = Bias + batch * stride_bb + row * stride_bn + head * stride_bh
    dq_base = DQAcc + batch * stride_ab + row * stride_an + head * stride_ah
    db_base = DBiasAcc + batch * stride_cb + head * stride_ch
    stat_base = _stats_offset(batch, row, tl.num_programs(1), num_heads, head, seq_len)

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
        q = _load_tile(q_base, rows_m, offs_d, stride_ql, stride_qd, valid_m, valid_d)
        do = _load_tile(do_base, rows_m, offs_d, stride_gl, stride_gd, valid_m, valid_d)
        lse = tl.load(Lse + stat_base + rows_m, mask=valid_m, other=float("inf"))
        delta = tl.load(Delta + stat_base + rows_m, mask=valid_m, other=0.0)

        s_t = mma(k, tl.trans(q), None, PRECISION) * scale_log2  # [BLOCK_N, BLOCK_M]
        s_t += _load_bias_log2(bias_base, cols, rows_m, stride_bk, stride_bq, valid_n, valid_m)
        dk, dv, ds_t = _kv_block_grads(k, v, q, do, tl.trans(do), s_t, attend, lse, delta, dk, dv, PRECISION)
        dq_part = mma(tl.trans(ds_t.to(q.dtype)), k, None, PRECISION) * scale  # [BLOCK_M, BLOCK_D]
        tl.atomic_add(
            _tile_ptrs(dq_base, rows_m, offs_d, stride_al, stride_ad),
            dq_part,
            mask=valid_m[:, None] & valid_d[None, :],
            sem="relaxed",
        )
        tl.atomic_add(
            _tile_ptrs(db_base, cols, rows_m, stride_ck, stride_cq),
            ds_t,
            mask=valid_n[:, None] & valid_m[None, :],
            sem="relaxed",
        )

    dk *= scale
    out_base = batch * stride_xb + row * stride_xn + head * stride_xh
    _store_tile(DK + out_base, dk.to(DK.dtype.element_ty), cols, offs_d, stride_xl, stride_xd, valid_n, valid_d)
    _store_tile(DV + out_base, dv.to(DV.dtype.element_ty), cols, offs_d, stride_xl, stride_xd, valid_n, valid_d)
