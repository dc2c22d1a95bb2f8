"""The gated pair attention's autograd Function and `gated_pair_attention`, the entry point:
evo_attention's launchers on the packed views, then the gate."""

from __future__ import annotations


import torch

from featurecache.kernels import runtime
from featurecache.kernels.evo_attention import (
    check_inputs,
    evo_attention,
    evo_attention_backward,
    evo_attention_forward,
)
from featurecache.kernels.gated_attention.launch import gate_backward, gate_forward, packed_views
from featurecache.kernels.reference import gated_pair_attention_reference, sigmoid_gate_reference, swiglu_reference


class _GatedPairAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, mask, heads, head_dim, transpose, scale):
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
        gated = gate_forward(gate, out_pair)
        ctx.save_for_backward(packed, bias, mask, out, lse, key_end)
        ctx.shape = (heads, head_dim, transpose, scale)
        return gated

    @staticmethod
    def backward(ctx, d_gated):
        packed, bias, mask, out, lse, key_end = ctx.saved_tensors
        heads, head_dim, transpose, scale = ctx.shape
        batch, length, width = packed.shape[0], packed.shape[1], packed.shape[-1]
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
        gate_backward(d_gated, gate, out_pair, d_out_pair, d_gate)
        _, _, _, dbias = evo_attention_backward(
            d_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad=True, grads=(dq, dk, dv)
        )
        d_bias.copy_(dbias.squeeze(1))
        return d_packed, None, None, None, None, None


def gated_pair_attention(
    packed: torch.Tensor,
    mask: torch.Tensor | None,
    heads: int,
    head_dim: int,
    transpose: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Triton gated_pair_attention_reference (see there for the layout); same numerics, up to
    the gate's rounding (one rounding here, two there).

    Under torch.compile, and on a CPU without the interpreter, it is the composition of the
    reference with evo_attention (whose custom ops keep a compiled graph whole)."""
    if packed.dim() != 4 or packed.shape[1] != packed.shape[2] or packed.shape[-1] < 4 * heads * head_dim + heads:
        raise ValueError(
            f"gated_pair_attention: packed has shape {tuple(packed.shape)}, expected "
            f"[B, L, L, >= {4 * heads * head_dim + heads}] for {heads} heads of {head_dim}"
        )
    if mask is not None and (mask.shape != packed.shape[:3] or mask.dtype != torch.bool):
        raise ValueError(
            f"gated_pair_attention: mask is {mask.dtype} {tuple(mask.shape)}, expected bool {tuple(packed.shape[:3])}"
        )
    if scale is None:
        scale = head_dim**-0.5
    if torch.compiler.is_compiling() or not runtime.runs_triton(packed.device):
        return gated_pair_attention_reference(packed, mask, heads, head_dim, transpose, scale, attention=evo_attention)
    packed = runtime.autocast_input(packed)
    return _GatedPairAttention.apply(packed, mask, heads, head_dim, transpose, float(scale))


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, out, swish):
        ctx.save_for_backward(gate, out)
        ctx.swish = swish
        return gate_forward(gate, out, swish)

    @staticmethod
    def backward(ctx, d_gated):
        gate, out = ctx.saved_tensors
        # the kernel writes d_out with out's strides (contiguous here) and d_gate with its own
        d_out, d_gate = torch.empty_like(out), torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        gate_backward(d_gated.contiguous(), gate, out, d_out, d_gate, ctx.swish)
        return d_gate, d_out, None


def _gate(gate: torch.Tensor, out: torch.Tensor, swish: bool) -> torch.Tensor:
    if torch.compiler.is_compiling() or not runtime.runs_triton(gate.device) or gate.dim() != 4:
        return (swiglu_reference if swish else sigmoid_gate_reference)(gate, out)
    if gate.shape != out.shape:
        name = "swiglu" if swish else "sigmoid_gate"
        raise ValueError(f"{name}: gate {tuple(gate.shape)} and out {tuple(out.shape)} differ")
    out = out.contiguous()
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    return _Gate.apply(gate, out, swish)


def sigmoid_gate(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """sigmoid(gate) * out in gate's dtype, both [B, R, L, C] (gate may be a strided slice, as the
    conditioned attention's packed projection gives it): one kernel each way where the Triton
    kernels run, instead of a sigmoid and a product forward (strided, so not vectorized) and
    three kernels backward. The sigmoid is not rounded on its own before the product (one
    rounding; the composition rounds twice). Elsewhere, and under torch.compile (which fuses the
    composition itself), the composition."""
    return _gate(gate, out, swish=False)


def swiglu(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """silu(gate) * out in gate's dtype, both [B, R, L, C] (the SwiGLU of the conditioned
    transition where it is not one fused op): one kernel each way instead of silu and a product
    forward and three kernels backward; sigmoid_gate's conditions otherwise."""
    return _gate(gate, out, swish=True)
