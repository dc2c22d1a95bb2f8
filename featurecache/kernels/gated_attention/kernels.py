"""The gated pair attention's Triton kernels: the gate sigmoid(g) * o (with SWISH, the SwiGLU
product silu(g) * o) and its gradients, over [B, R, L, C] tiles (the pair's [B, L, L, H*D], or
the conditioned attention's [B, S, L, c_a]) read through any (batch, row, column) strides."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import cast


@triton.jit
def _pair_tile(rows, length, inner, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile, positions (b, i, j..j + BLOCK_J) x channels: their indices, their
    offsets in a contiguous [B, rows, length, inner] tensor, and the mask."""
    pid_bi = tl.program_id(0).to(tl.int64)
    b = pid_bi // rows
    i = pid_bi % rows
    j = (tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    m = (j < length)[:, None] & (c < inner)[None, :]
    return b, i, j, c, (pid_bi * length + j[:, None]) * inner + c[None, :], m


@triton.jit
def _strided(b, i, j, c, stride_b, stride_i, stride_j):
    """Offsets of the tile in a [B, R, L, C] view with these strides and contiguous channels."""
    return b * stride_b + i * stride_i + j[:, None] * stride_j + c[None, :]


@triton.jit
def _gate_fwd_kernel(
    G,
    O,
    Y,
    rows,
    length,
    inner,
    stride_gb,
    stride_gi,
    stride_gj,
    stride_ob,
    stride_oi,
    stride_oj,
    SWISH: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y[b, i, j] = sigmoid(g[b, i, j]) * o[b, i, j] over the channels (SWISH: g sigmoid(g) o);
    y contiguous."""
    b, i, j, c, dense, m = _pair_tile(rows, length, inner, BLOCK_J, BLOCK_C)
    g = tl.load(G + _strided(b, i, j, c, stride_gb, stride_gi, stride_gj), mask=m, other=0.0).to(tl.float32)
    o = tl.load(O + _strided(b, i, j, c, stride_ob, stride_oi, stride_oj), mask=m, other=0.0)
    act = tl.sigmoid(g)
    if SWISH:
        act = g * act
    y = act * o.to(tl.float32)
    tl.store(Y + dense, cast(y, Y.dtype.element_ty, PRECISION), mask=m)


@triton.jit
def _gate_bwd_kernel(
    DY,
    G,
    O,
    DO,
    DG,
    rows,
    length,
    inner,
    stride_gb,
    stride_gi,
    stride_gj,
    stride_ob,
    stride_oi,
    stride_oj,
    stride_dgb,
    stride_dgi,
    stride_dgj,
    SWISH: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """do = dy * act(g) (written with o's strides), dg = dy * o * act'(g); act is sigmoid, or
    with SWISH silu (silu' = s + g s (1 - s), s = sigmoid(g))."""
    b, i, j, c, dense, m = _pair_tile(rows, length, inner, BLOCK_J, BLOCK_C)
    dy = tl.load(DY + dense, mask=m, other=0.0).to(tl.float32)
    g = tl.load(G + _strided(b, i, j, c, stride_gb, stride_gi, stride_gj), mask=m, other=0.0).to(tl.float32)
    o_offsets = _strided(b, i, j, c, stride_ob, stride_oi, stride_oj)
    o = tl.load(O + o_offsets, mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    d_act = s * (1.0 - s)
    act = s
    if SWISH:
        act = g * s
        d_act = s + g * d_act
    tl.store(DO + o_offsets, cast(dy * act, DO.dtype.element_ty, PRECISION), mask=m)
    tl.store(
        DG + _strided(b, i, j, c, stride_dgb, stride_dgi, stride_dgj),
        cast(dy * o * d_act, DG.dtype.element_ty, PRECISION),
        mask=m,
    )
