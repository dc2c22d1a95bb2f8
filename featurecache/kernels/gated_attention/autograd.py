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


class _GatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, bias, mask, heads, scale):
        q, k, v, gate = _attention_views(packed, heads)
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale)
        gated = gate_forward(gate, out.flatten(-2))
        ctx.save_for_backward(packed, bias, mask, out, lse, key_end)
        ctx.heads, ctx.scale = heads, scale
        return gated

    @staticmethod
    def backward(ctx, d_gated):
        packed, bias, mask, out, lse, key_end = ctx.saved_tensors
        q, k, v, gate = _attention_views(packed, ctx.heads)
        d_packed = torch.empty_like(packed, memory_format=torch.contiguous_format)  # packed is contiguous
        dq, dk, dv, d_gate = _attention_views(d_packed, ctx.heads)
        d_out = torch.empty_like(out)
        gate_backward(d_gated.contiguous(), gate, out.flatten(-2), d_out.flatten(-2), d_gate)
        bias_grad = bias is not None and ctx.needs_input_grad[1]
        _, _, _, d_bias = evo_attention_backward(
            d_out, q, k, v, bias, mask, out, lse, key_end, ctx.scale, bias_grad, grads=(dq, dk, dv)
        )
        return d_packed, d_bias, None, None, None


def _attention_views(packed: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    """q, k, v [B, N, L, H, D] and gate [B, N, L, C]: views of a packed [B, N, L, 4C]."""
    q, k, v, gate = packed.chunk(4, dim=-1)
    return (*(t.unflatten(-1, (heads, -1)) for t in (q, k, v)), gate)


def gated_attention(
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    heads: int,
    scale: float | None = None,
) -> torch.Tensor:
    """sigmoid(gate) * evo_attention(q, k, v, bias, mask), flattened over the heads, from one
    packed projection [B, N, L, 4C] = [q | k | v | gate] (C = heads x D; q with its bias, which
    the projection adds): attention with pair bias and its output gate, the core of AF3's
    Algorithm 24 (the diffusion transformer's). bias [B, 1 or N, H, L, L]; mask [B, N, L] bool.
    Returns [B, N, L, C] in packed's dtype.

    The same kernels as composing a split, evo_attention and sigmoid_gate on the packed views,
    but the backward writes dq, dk, dv and d_gate into one packed gradient, the projection's
    gradient as it is: autograd would concatenate the four into a new buffer, one more pass over
    the largest tensor of the diffusion transformer's attention. Under torch.compile, and on a
    CPU without the interpreter, the composition."""
    if packed.dim() != 4 or packed.shape[-1] % (4 * heads):
        raise ValueError(
            f"gated_attention: packed has shape {tuple(packed.shape)}, expected [B, N, L, 4 x {heads} heads x D]"
        )
    scale = (packed.shape[-1] // (4 * heads)) ** -0.5 if scale is None else scale
    if torch.compiler.is_compiling() or not runtime.runs_triton(packed.device):
        q, k, v, gate = _attention_views(packed, heads)
        return sigmoid_gate_reference(gate, evo_attention(q, k, v, bias, mask, scale).flatten(-2))
    packed = runtime.autocast_input(packed).contiguous()
    check_inputs(*_attention_views(packed, heads)[:3], bias, mask)
    return _GatedAttention.apply(packed, bias, mask, heads, float(scale))


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


class _PackedSwiGLU(torch.autograd.Function):
    """silu(packed[..., :C]) * packed[..., C:]: the two halves of one product's output, read in
    place; backward writes both halves' gradients into one packed gradient."""

    @staticmethod
    def forward(ctx, packed):
        ctx.save_for_backward(packed)
        return gate_forward(*_halves(packed), swish=True)

    @staticmethod
    def backward(ctx, d_gated):
        (packed,) = ctx.saved_tensors
        d_packed = torch.empty_like(packed, memory_format=torch.contiguous_format)  # packed is contiguous
        d_gate, d_out = _halves(d_packed)
        gate_backward(d_gated.contiguous(), *_halves(packed), d_out, d_gate, swish=True)
        return d_packed


def _halves(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    width = packed.shape[-1] // 2
    return packed[..., :width], packed[..., width:]


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


def swiglu_packed(packed: torch.Tensor) -> torch.Tensor:
    """silu(packed[..., :C]) * packed[..., C:] in packed's dtype, packed [B, R, L, 2C]: the SwiGLU
    of both its products as one (the conditioned transition's linear_a and linear_b, one matrix
    product). swiglu's kernels read the two halves in place, and backward writes their gradients
    into one [B, R, L, 2C] tensor, the product's gradient as it is: two gradients of views of one
    tensor would cost autograd a zero-filled copy each and their sum. swiglu's conditions
    otherwise (the composition where the Triton kernels do not run)."""
    if packed.shape[-1] % 2:
        raise ValueError(f"swiglu_packed: the last axis of {tuple(packed.shape)} has no two equal halves")
    if torch.compiler.is_compiling() or not runtime.runs_triton(packed.device) or packed.dim() != 4:
        return swiglu_reference(*_halves(packed))
    return _PackedSwiGLU.apply(packed.contiguous())
