"""The gated pair attention's host side: the packed projection's strided views, and the gate's
launchers (grid, block sizes, one kernel each way)."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.gated_attention.kernels import _gate_bwd_kernel, _gate_fwd_kernel


def _gate_grid(batch: int, rows: int, length: int, inner: int) -> tuple[tuple[int, int], int, int]:
    block_c = triton.next_power_of_2(inner)
    block_j = max(1, min(triton.next_power_of_2(length), 4096 // block_c))
    return (batch * rows, triton.cdiv(length, block_j)), block_j, block_c


def _pair_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, row, column) strides of a [B, R, L, C] tensor whose channels are contiguous."""
    if t.stride(-1) != 1:
        raise ValueError(f"gate kernels: channels must be contiguous, got strides {t.stride()}")
    return t.stride(0), t.stride(1), t.stride(2)


def packed_views(packed: torch.Tensor, heads: int, head_dim: int, transpose: bool):
    """q, k, v [B, rows, L, H, D] (rows: i, or j for the transpose), gate [B, L, L, H*D] and the
    bias [B, H, L, L] as strided views of a packed tensor (or of its gradient)."""
    inner = heads * head_dim
    q, k, v = (packed[..., n * inner : (n + 1) * inner].unflatten(-1, (heads, head_dim)) for n in range(3))
    gate = packed[..., 3 * inner : 4 * inner]
    bias = packed[..., 4 * inner : 4 * inner + heads]
    if transpose:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        bias = bias.permute(0, 3, 2, 1)
    else:
        bias = bias.permute(0, 3, 1, 2)
    return q, k, v, gate, bias


def gate_forward(gate: torch.Tensor, out_pair: torch.Tensor, swish: bool = False) -> torch.Tensor:
    """sigmoid(gate) * out_pair (swish: silu(gate) * out_pair), both [B, R, L, C] with contiguous
    channels (either may be a strided view: the packed projection's slice, the ending node's
    transpose): one kernel, a new contiguous [B, R, L, C] tensor in gate's dtype."""
    batch, rows, length, inner = gate.shape
    gated = gate.new_empty((batch, rows, length, inner))
    grid, block_j, block_c = _gate_grid(batch, rows, length, inner)
    _gate_fwd_kernel[grid](
        gate,
        out_pair,
        gated,
        rows,
        length,
        inner,
        *_pair_strides(gate),
        *_pair_strides(out_pair),
        SWISH=swish,
        PRECISION=runtime.dot_precision(gate.dtype),
        BLOCK_J=block_j,
        BLOCK_C=block_c,
    )
    return gated


def gate_backward(
    d_gated: torch.Tensor,
    gate: torch.Tensor,
    out_pair: torch.Tensor,
    d_out_pair: torch.Tensor,
    d_gate: torch.Tensor,
    swish: bool = False,
) -> None:
    """The gate's backward in one kernel: writes d_out_pair (the attention output's gradient,
    with out_pair's strides) and d_gate (any strides: a view into the packed gradient), all
    [B, R, L, C]; d_gated is contiguous."""
    batch, rows, length, inner = gate.shape
    grid, block_j, block_c = _gate_grid(batch, rows, length, inner)
    _gate_bwd_kernel[grid](
        d_gated,
        gate,
        out_pair,
        d_out_pair,
        d_gate,
        rows,
        length,
        inner,
        *_pair_strides(gate),
        *_pair_strides(out_pair),
        *_pair_strides(d_gate),
        SWISH=swish,
        PRECISION=runtime.dot_precision(gate.dtype),
        BLOCK_J=block_j,
        BLOCK_C=block_c,
    )
