"""The triangle multiplicative update's autograd Function and `triangle_mult`, the entry point."""

from __future__ import annotations


import torch

from featurecache.kernels import runtime
from featurecache.kernels.reference import triangle_mult_reference
from featurecache.kernels.triangle_mult.launch import DIRECTIONS, OP, triangle_mult_bwd, triangle_mult_fwd


class _TriangleMultFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, mask, direction, eps, *params):
        out, (z2d, mask_rows, x, stats) = triangle_mult_fwd(z.contiguous(), mask, params, direction, eps)
        saved_mask = () if mask_rows is None else (mask_rows,)
        ctx.save_for_backward(z2d, x, stats, *params, *saved_mask)
        ctx.has_mask = mask_rows is not None
        ctx.direction = direction
        ctx.eps = eps
        ctx.z_shape = z.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        z2d, x, stats, *rest = ctx.saved_tensors
        params = tuple(rest[:10])
        mask_rows = rest[10] if ctx.has_mask else None
        dz, dparams = triangle_mult_bwd(
            dout.reshape(z2d.shape).contiguous(), z2d, mask_rows, x, stats, params, ctx.direction, ctx.eps
        )
        return (dz.view(ctx.z_shape), None, None, None, *dparams)


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them: traced, the mask's reinterpretation as bytes (aten.view.dtype on a bool tensor) reached
# Inductor, which cannot lower it ("torch.bool is not supported by torch.iinfo").


@torch.library.custom_op("featurecache::triangle_mult_fwd", mutates_args=())
def _triangle_mult_fwd_op(
    z: torch.Tensor,
    mask: torch.Tensor | None,
    norm_in_weight: torch.Tensor,
    norm_in_bias: torch.Tensor,
    weight_a_p: torch.Tensor,
    weight_a_g: torch.Tensor,
    weight_b_p: torch.Tensor,
    weight_b_g: torch.Tensor,
    weight_g: torch.Tensor,
    norm_out_weight: torch.Tensor,
    norm_out_bias: torch.Tensor,
    weight_z: torch.Tensor,
    direction: str,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    params = (
        norm_in_weight,
        norm_in_bias,
        weight_a_p,
        weight_a_g,
        weight_b_p,
        weight_b_g,
        weight_g,
        norm_out_weight,
        norm_out_bias,
        weight_z,
    )
    out, (_, _, x, stats) = triangle_mult_fwd(z.contiguous(), mask, params, direction, eps)
    return out, x, stats


@_triangle_mult_fwd_op.register_fake
def _(z, mask, norm_in_weight, norm_in_bias, weight_a_p, *rest):
    batch, length, _, _ = z.shape
    x = z.new_empty((batch, weight_a_p.shape[0], length, length))
    return z.new_empty(z.shape), x, z.new_empty((4, batch * length * length), dtype=torch.float32)


@torch.library.custom_op("featurecache::triangle_mult_bwd", mutates_args=())
def _triangle_mult_bwd_op(
    dout: torch.Tensor,
    z: torch.Tensor,
    mask: torch.Tensor | None,
    x: torch.Tensor,
    stats: torch.Tensor,
    params: list[torch.Tensor],
    direction: str,
    eps: float,
) -> list[torch.Tensor]:
    z2d = z.contiguous().view(-1, z.shape[-1])
    mask_rows = None if mask is None else mask.contiguous().view(-1).view(torch.uint8)
    dz, dparams = triangle_mult_bwd(
        dout.reshape(z2d.shape).contiguous(), z2d, mask_rows, x, stats, tuple(params), direction, eps
    )
    return list(runtime.unaliased((dz.view(z.shape), *dparams)))


@_triangle_mult_bwd_op.register_fake
def _(dout, z, mask, x, stats, params, direction, eps):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (z, *params)]


def _triangle_mult_setup(ctx, inputs, output) -> None:
    z, mask, *params = inputs[:12]
    _, x, stats = output
    ctx.save_for_backward(z, mask, x, stats, *params)
    ctx.direction, ctx.eps = inputs[12], inputs[13]


def _triangle_mult_backward(ctx, dout, _dx, _dstats):
    z, mask, x, stats, *params = ctx.saved_tensors
    dz, *dparams = _triangle_mult_bwd_op(dout, z, mask, x, stats, params, ctx.direction, ctx.eps)
    return (dz, None, *dparams, None, None)


_triangle_mult_fwd_op.register_autograd(_triangle_mult_backward, setup_context=_triangle_mult_setup)


def triangle_mult(
    z,
    mask,
    norm_in_weight,
    norm_in_bias,
    weight_a_p,
    weight_a_g,
    weight_b_p,
    weight_b_g,
    weight_g,
    norm_out_weight,
    norm_out_bias,
    weight_z,
    direction="outgoing",
    eps=1e-5,
):
    """Triton triangle multiplicative update; same signature and numerics as
    triangle_mult_reference."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    runtime.check_triton_inputs(OP, z)
    z = runtime.autocast_input(z)
    if z.dim() != 4 or z.shape[1] != z.shape[2]:
        raise ValueError(f"{OP}: z must be [B, L, L, C], got {tuple(z.shape)}")
    if mask is not None and (mask.shape != z.shape[:3] or mask.dtype != torch.bool):
        raise ValueError(f"{OP}: mask must be bool {tuple(z.shape[:3])}, got {mask.dtype} {tuple(mask.shape)}")
    runtime.max_channels_check(OP, "dim", z.shape[-1], limit=256)
    runtime.max_channels_check(OP, "hidden_dim", weight_a_p.shape[0], limit=256)
    # the weights as given (fp32 under autocast): the launchers cast them to z's dtype and return
    # their gradients in their own dtype
    params = (
        norm_in_weight,
        norm_in_bias,
        weight_a_p,
        weight_a_g,
        weight_b_p,
        weight_b_g,
        weight_g,
        norm_out_weight,
        norm_out_bias,
        weight_z,
    )
    if z.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return triangle_mult_reference(z, mask, *params, direction=direction, eps=eps)
    if mask is not None:
        mask = mask.contiguous()
    if torch.compiler.is_compiling():
        return _triangle_mult_fwd_op(z, mask, *params, direction, eps)[0]
    return _TriangleMultFunction.apply(z, mask, direction, eps, *params)
