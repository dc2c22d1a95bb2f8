"""@triton.jit building blocks shared by the kernels of every op.

- `mma`: a matrix product with fp32 accumulation that is also right under the interpreter;
- `cast`: a rounding cast that rounds the same way on the interpreter as on the GPU;
- the LayerNorm prologue (`layernorm_prologue`, or `layernorm_prologue_saved` from saved
  statistics) that normalizes a [BLOCK_M, BLOCK_C] register tile of rows before its first
  matrix product, `layernorm_params` that loads its weight and bias, and `layernorm_backward`,
  its gradient;
- `row_block`: a program's block of rows; `tile_range`: a tile's positions, 32 or 64-bit.
- the SwiGLU chunk steps both transitions share (`swiglu_chunk_weights`, `swiglu_chunk`,
  `swiglu_chunk_bwd`, `swiglu_chunk_input_grad`, `store_swiglu_grads`).

PRECISION is runtime.dot_precision(dtype): "ieee" or "tf32" on a GPU, "interpret" under the
interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b with fp32 accumulation; acc may be None (a fresh product).

    Under the interpreter (triton 3.9 on CPU) a bf16 tl.dot returns garbage (values ~1e10 on
    N(0, 1) inputs: it multiplies the raw bits), so operands are widened there first: products
    of bf16 values are exact in fp32, so the result matches the GPU's bf16 tensor-core math up
    to summation order.
    """
    if PRECISION == "interpret":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def cast(x, dtype: tl.constexpr, PRECISION: tl.constexpr):
    """x.to(dtype) with round-to-nearest-even, as the GPU does.

    The interpreter truncates fp32 -> bf16 (twice the error, and biased), which would make the
    CPU tests measure the interpreter rather than the kernel; there the rounding is done on the
    bits first, so the truncating cast that follows is exact.
    """
    out = x.to(dtype)
    if PRECISION == "interpret":
        if dtype == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
            out = bits.to(tl.float32, bitcast=True).to(dtype)
    return out


@triton.jit
def row_block(block, BLOCK_M: tl.constexpr, n_rows):
    """Indices of row block `block` and which of them exist; int64, so that a row index times
    the row width cannot overflow 32 bits."""
    rows = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return rows, rows < n_rows


@triton.jit
def tile_range(start, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """start + [0, BLOCK): a tile's positions, int64 when WIDE, so that position x stride cannot
    overflow 32 bits in a tensor spanning 2^31 elements or more (int32 is cheaper otherwise)."""
    offsets = start + tl.arange(0, BLOCK)
    if WIDE:
        offsets = offsets.to(tl.int64)
    return offsets


@triton.jit
def layernorm_params(NORM_W, NORM_B, cols, col_mask):
    """The LayerNorm weight and bias at `cols`, fp32 [BLOCK_C], zero in padded columns.
    Loaded once per program by the caller (outside any row loop) and passed to the functions
    below."""
    norm_w = tl.load(NORM_W + cols, mask=col_mask, other=0.0).to(tl.float32)
    norm_b = tl.load(NORM_B + cols, mask=col_mask, other=0.0).to(tl.float32)
    return norm_w, norm_b


@triton.jit
def layernorm_prologue(x, norm_w, norm_b, col_mask, n_cols, eps, PRECISION: tl.constexpr):
    """LayerNorm of a row tile x [BLOCK_M, BLOCK_C] whose padded columns hold zeros.

    Returns (xn in x's dtype, the next matrix product's operand; xhat, the fp32 normalized rows
    before the affine step; mean and rstd [BLOCK_M], fp32, the statistics a backward reuses).
    """
    x32 = x.to(tl.float32)
    mean = tl.sum(x32, axis=1) / n_cols
    centered = tl.where(col_mask[None, :], x32 - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / n_cols
    rstd = tl.rsqrt(var + eps)
    xhat = centered * rstd[:, None]
    return cast(xhat * norm_w[None, :] + norm_b[None, :], x.dtype, PRECISION), xhat, mean, rstd


@triton.jit
def layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION: tl.constexpr):
    """layernorm_prologue from the statistics saved at `rows` of MEAN and RSTD, with bitwise the
    same xhat. Returns (xn, xhat, rstd)."""
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    xhat = tl.where(col_mask[None, :], x.to(tl.float32) - mean[:, None], 0.0) * rstd[:, None]
    return cast(xhat * norm_w[None, :] + norm_b[None, :], x.dtype, PRECISION), xhat, rstd


@triton.jit
def layernorm_backward(d_xn, xhat, rstd, norm_w, cols, col_mask, n_cols, DNORM_W_PART, DNORM_B_PART, part):
    """Gradient wrt the LayerNorm input (fp32) given d_xn wrt its output; stores this program's
    partial weight and bias gradients as row `part` of two [programs, n_cols] fp32 buffers.

    Padded columns have weight 0 and xhat 0; their result is garbage and must not be stored.
    """
    tl.store(DNORM_W_PART + part * n_cols + cols, tl.sum(d_xn * xhat, axis=0), mask=col_mask)
    tl.store(DNORM_B_PART + part * n_cols + cols, tl.sum(d_xn, axis=0), mask=col_mask)
    d_xhat = d_xn * norm_w[None, :]
    proj = tl.sum(d_xhat * xhat, axis=1) / n_cols
    mean_d = tl.sum(d_xhat, axis=1) / n_cols
    return (d_xhat - xhat * proj[:, None] - mean_d[:, None]) * rstd[:, None]


@triton.jit
def swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, dtype: tl.constexpr, PRECISION: tl.constexpr):
    """The three weight tiles of one hidden chunk of a SwiGLU MLP (the transitions), [BLOCK_H,
    BLOCK_C] each in the compute dtype: WA, WB [n_hidden, C] as stored, WO [C, n_hidden] read
    transposed."""
    wa = tl.load(WA + hids[:, None] * n_ch + cols[None, :], mask=w_mask, other=0.0)
    wb = tl.load(WB + hids[:, None] * n_ch + cols[None, :], mask=w_mask, other=0.0)
    wo = tl.load(WO + cols[None, :] * n_hidden + hids[:, None], mask=w_mask, other=0.0)
    return cast(wa, dtype, PRECISION), cast(wb, dtype, PRECISION), cast(wo, dtype, PRECISION)


@triton.jit
def swiglu_chunk(x, wa, wb, zeros_h, PRECISION: tl.constexpr):
    """One hidden chunk silu(x @ wa^T) * (x @ wb^T) of row tile x, in x's dtype [BLOCK_M, BLOCK_H]."""
    a = mma(x, tl.trans(wa), zeros_h, PRECISION)
    b = mma(x, tl.trans(wb), zeros_h, PRECISION)
    return cast(a * tl.sigmoid(a) * b, x.dtype, PRECISION)


@triton.jit
def swiglu_chunk_bwd(x, dy, wa, wb, wo, zeros_h, PRECISION: tl.constexpr):
    """Recompute one hidden chunk and its gradients given dy wrt the output projection:
    (hidden, d_a, d_b), fp32 [BLOCK_M, BLOCK_H]."""
    a = mma(x, tl.trans(wa), zeros_h, PRECISION)
    b = mma(x, tl.trans(wb), zeros_h, PRECISION)
    d_hidden = mma(dy, tl.trans(wo), zeros_h, PRECISION)
    sig = tl.sigmoid(a)
    silu = a * sig
    d_a = d_hidden * b * sig * (1.0 + a * (1.0 - sig))
    d_b = d_hidden * silu
    return silu * b, d_a, d_b


@triton.jit
def store_swiglu_grads(D_AB, HIDDEN, d_a, d_b, hidden, rows, row_mask, hids, n_hidden, PRECISION: tl.constexpr):
    """Store one hidden chunk's operands of the weight gradients: D_AB [rows, 2 * n_hidden] =
    [d_a | d_b] and HIDDEN [rows, n_hidden], all in d_a's dtype."""
    h_offsets = rows[:, None] * n_hidden + hids[None, :]
    h_mask = row_mask[:, None] & (hids < n_hidden)[None, :]
    tl.store(D_AB + rows[:, None] * n_hidden + h_offsets, d_a, mask=h_mask)
    tl.store(D_AB + rows[:, None] * n_hidden + h_offsets + n_hidden, d_b, mask=h_mask)
    tl.store(HIDDEN + h_offsets, cast(hidden, d_a.dtype, PRECISION), mask=h_mask)


@triton.jit
def swiglu_chunk_input_grad(x, dy, wa, wb, wo, d_x, zeros_h, PRECISION: tl.constexpr):
    """One hidden chunk's share of the gradient wrt the MLP's input x, added to d_x (fp32
    [BLOCK_M, BLOCK_C]); returns (d_x, hidden fp32, d_a, d_b in x's dtype: the weight gradients'
    operands)."""
    hidden, d_a, d_b = swiglu_chunk_bwd(x, dy, wa, wb, wo, zeros_h, PRECISION)
    d_a = cast(d_a, x.dtype, PRECISION)
    d_b = cast(d_b, x.dtype, PRECISION)
    d_x = mma(d_a, wa, d_x, PRECISION)
    d_x = mma(d_b, wb, d_x, PRECISION)
    return d_x, hidden, d_a, d_b
