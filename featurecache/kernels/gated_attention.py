"""Gated attention over the pair, read from one packed projection: triangle attention's core.

TriangleAttention projects z once into [q | k | v | gate | bias] (one LayerNorm+Linear). This op
takes that packed tensor and returns sigmoid(gate) * attention(q, k, v, bias, mask), laid out
for the output projection. What it saves against composing `split`, evo_attention and the gate
in autograd (the reference, `gated_pair_attention_reference`):
- the backward writes dq, dk, dv, d_gate and d_bias straight into one packed gradient laid out
  like the projection (rows 16-element aligned), which the projection's backward reads in
  place; autograd would concatenate five gradients into a new buffer, one more pass over the
  largest tensor of triangle attention;
- the gate is one kernel each way (sigmoid, product and both gradients), not four to five
  elementwise kernels, and it reads the attention output through the ending node's transpose
  instead of copying it.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from featurecache.kernels import runtime
from featurecache.kernels.evo_attention import (
    check_inputs,
    evo_attention,
    evo_attention_backward,
    evo_attention_forward,
)
from featurecache.kernels.primitives import cast
from featurecache.kernels.reference import gated_pair_attention_reference

# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _pair_tile(length, inner, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile, pairs (b, i, j..j + BLOCK_J) x channels: their indices, their
    offsets in a contiguous [B, L, L, inner] tensor, and the mask."""
    pid_bi = tl.program_id(0).to(tl.int64)
    b = pid_bi // length
    i = pid_bi % length
    j = (tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    m = (j < length)[:, None] & (c < inner)[None, :]
    return b, i, j, c, (pid_bi * length + j[:, None]) * inner + c[None, :], m


@triton.jit
def _strided(b, i, j, c, stride_b, stride_i, stride_j):
    """Offsets of the tile in a [B, L, L, C] view with these strides and contiguous channels."""
    return b * stride_b + i * stride_i + j[:, None] * stride_j + c[None, :]


@triton.jit
def _gate_fwd_kernel(
    G, O, Y,
    length, inner,
    stride_gb, stride_gi, stride_gj,
    stride_ob, stride_oi, stride_oj,
    PRECISION: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y[b, i, j] = sigmoid(g[b, i, j]) * o[b, i, j] over the channels; y contiguous."""
    b, i, j, c, dense, m = _pair_tile(length, inner, BLOCK_J, BLOCK_C)
    g = tl.load(G + _strided(b, i, j, c, stride_gb, stride_gi, stride_gj), mask=m, other=0.0)
    o = tl.load(O + _strided(b, i, j, c, stride_ob, stride_oi, stride_oj), mask=m, other=0.0)
    y = tl.sigmoid(g.to(tl.float32)) * o.to(tl.float32)
    tl.store(Y + dense, cast(y, Y.dtype.element_ty, PRECISION), mask=m)


@triton.jit
def _gate_bwd_kernel(
    DY, G, O, DO, DG,
    length, inner,
    stride_gb, stride_gi, stride_gj,
    stride_ob, stride_oi, stride_oj,
    stride_dgb, stride_dgi, stride_dgj,
    PRECISION: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """do = dy * sigmoid(g) (written with o's strides), dg = dy * o * sigmoid'(g)."""
    b, i, j, c, dense, m = _pair_tile(length, inner, BLOCK_J, BLOCK_C)
    dy = tl.load(DY + dense, mask=m, other=0.0).to(tl.float32)
    g = tl.load(G + _strided(b, i, j, c, stride_gb, stride_gi, stride_gj), mask=m, other=0.0)
    o_offsets = _strided(b, i, j, c, stride_ob, stride_oi, stride_oj)
    o = tl.load(O + o_offsets, mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g.to(tl.float32))
    tl.store(DO + o_offsets, cast(dy * s, DO.dtype.element_ty, PRECISION), mask=m)
    tl.store(DG + _strided(b, i, j, c, stride_dgb, stride_dgi, stride_dgj),
             cast(dy * o * s * (1.0 - s), DG.dtype.element_ty, PRECISION), mask=m)


# --------------------------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------------------------


def _gate_grid(batch: int, length: int, inner: int) -> tuple[tuple[int, int], int, int]:
    block_c = triton.next_power_of_2(inner)
    block_j = max(1, min(triton.next_power_of_2(length), 4096 // block_c))
    return (batch * length, triton.cdiv(length, block_j)), block_j, block_c


def _pair_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, i, j) strides of a [B, L, L, C] tensor whose channels are contiguous."""
    if t.stride(-1) != 1:
        raise ValueError(f"gated_pair_attention: channels must be contiguous, got strides {t.stride()}")
    return t.stride(0), t.stride(1), t.stride(2)


def packed_views(packed: torch.Tensor, heads: int, head_dim: int, transpose: bool):
    """q, k, v [B, rows, L, H, D] (rows: i, or j for the transpose), gate [B, L, L, H*D] and the
    bias [B, H, L, L] as strided views of a packed tensor (or of its gradient)."""
    inner = heads * head_dim
    q, k, v = (packed[..., n * inner:(n + 1) * inner].unflatten(-1, (heads, head_dim)) for n in range(3))
    gate = packed[..., 3 * inner:4 * inner]
    bias = packed[..., 4 * inner:4 * inner + heads]
    if transpose:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        bias = bias.permute(0, 3, 2, 1)
    else:
        bias = bias.permute(0, 3, 1, 2)
    return q, k, v, gate, bias


# --------------------------------------------------------------------------------------------
# Autograd and the entry point
# --------------------------------------------------------------------------------------------


class _GatedPairAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, mask, heads, head_dim, transpose, scale):
        batch, length = packed.shape[0], packed.shape[1]
        inner = heads * head_dim
        q, k, v, gate, bias = packed_views(packed, heads, head_dim, transpose)
        # The bias is read as [L, L] tiles per head: a copy with contiguous keys (H * L * L
        # elements, 1/32 of q) reads far faster than the packed columns' 4-element rows.
        bias = bias.unsqueeze(1).contiguous()
        if mask is not None:
            mask = (mask.transpose(1, 2) if transpose else mask).contiguous()
        check_inputs(q, k, v, bias, mask)
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale)
        out_pair = out.flatten(-2)  # [B, rows, L, H*D]: the pair's layout, transposed for the ending node
        if transpose:
            out_pair = out_pair.transpose(1, 2)
        gated = packed.new_empty((batch, length, length, inner))
        grid, block_j, block_c = _gate_grid(batch, length, inner)
        _gate_fwd_kernel[grid](gate, out_pair, gated, length, inner, *_pair_strides(gate), *_pair_strides(out_pair),
                               PRECISION=runtime.dot_precision(packed.dtype), BLOCK_J=block_j, BLOCK_C=block_c)
        ctx.save_for_backward(packed, bias, mask, out, lse, key_end)
        ctx.shape = (heads, head_dim, transpose, scale)
        return gated

    @staticmethod
    def backward(ctx, d_gated):
        packed, bias, mask, out, lse, key_end = ctx.saved_tensors
        heads, head_dim, transpose, scale = ctx.shape
        batch, length, width = packed.shape[0], packed.shape[1], packed.shape[-1]
        inner = heads * head_dim
        d_gated = d_gated.contiguous()
        # The packed gradient, rows as wide as the packed input's (16-element aligned when it is
        # LayerNormLinear(aligned_rows=True)'s output), so the projection's backward reads it in
        # place and the kernels writing into it store aligned rows. The columns past `width`
        # are outside the view: nothing reads them.
        row = max(width, packed.stride(2)) if packed.stride(-1) == 1 else width
        d_packed = packed.new_empty((batch, length, length, row))[..., :width]
        q, k, v, gate, _ = packed_views(packed, heads, head_dim, transpose)
        dq, dk, dv, d_gate, d_bias = packed_views(d_packed, heads, head_dim, transpose)

        d_out = torch.empty_like(out)
        out_pair, d_out_pair = out.flatten(-2), d_out.flatten(-2)
        if transpose:
            out_pair, d_out_pair = out_pair.transpose(1, 2), d_out_pair.transpose(1, 2)
        grid, block_j, block_c = _gate_grid(batch, length, inner)
        _gate_bwd_kernel[grid](d_gated, gate, out_pair, d_out_pair, d_gate, length, inner,
                               *_pair_strides(gate), *_pair_strides(out_pair), *_pair_strides(d_gate),
                               PRECISION=runtime.dot_precision(packed.dtype), BLOCK_J=block_j, BLOCK_C=block_c)
        _, _, _, dbias = evo_attention_backward(d_out, q, k, v, bias, mask, out, lse, key_end, scale,
                                                bias_grad=True, grads=(dq, dk, dv))
        d_bias.copy_(dbias.squeeze(1))
        return d_packed, None, None, None, None, None


def gated_pair_attention(
    packed: torch.Tensor,
    mask: Optional[torch.Tensor],
    heads: int,
    head_dim: int,
    transpose: bool = False,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Triton gated_pair_attention_reference (see there for the layout); same numerics, up to
    the gate's rounding (one rounding here, two there).

    Under torch.compile, and on a CPU without the interpreter, it is the composition of the
    reference with evo_attention (whose custom ops keep a compiled graph whole)."""
    if packed.dim() != 4 or packed.shape[1] != packed.shape[2] or packed.shape[-1] < 4 * heads * head_dim + heads:
        raise ValueError(f"gated_pair_attention: packed has shape {tuple(packed.shape)}, expected "
                         f"[B, L, L, >= {4 * heads * head_dim + heads}] for {heads} heads of {head_dim}")
    if mask is not None and (mask.shape != packed.shape[:3] or mask.dtype != torch.bool):
        raise ValueError(f"gated_pair_attention: mask is {mask.dtype} {tuple(mask.shape)}, expected bool "
                         f"{tuple(packed.shape[:3])}")
    if scale is None:
        scale = head_dim ** -0.5
    if torch.compiler.is_compiling() or not runtime.runs_triton(packed.device):
        return gated_pair_attention_reference(packed, mask, heads, head_dim, transpose, scale, attention=evo_attention)
    packed = runtime.autocast_input(packed)
    return _GatedPairAttention.apply(packed, mask, heads, head_dim, transpose, float(scale))
