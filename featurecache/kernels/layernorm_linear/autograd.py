"""LayerNormLinear's autograd Function and custom ops, and `layernorm_linear`, the entry point."""

from __future__ import annotations


import torch

from featurecache.kernels import runtime
from featurecache.kernels.layernorm_linear.launch import OP, layernorm_linear_bwd, layernorm_linear_fwd
from featurecache.kernels.reference import layernorm_linear_reference


class _LayerNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, weight, bias, eps, aligned_rows):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = layernorm_linear_fwd(x2d, norm_weight, norm_bias, weight, bias, eps, aligned_rows)
        ctx.save_for_backward(x2d, norm_weight, norm_bias, weight, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2d, norm_weight, norm_bias, weight, mean, rstd = ctx.saved_tensors
        # A gradient written into an aligned buffer (gated_pair_attention) is read in place.
        dy2d = dy.reshape(-1, weight.shape[0])
        if dy2d.stride(1) != 1:
            dy2d = dy2d.contiguous()
        dx, dnw, dnb, dw, dbias = layernorm_linear_bwd(
            dy2d, x2d, norm_weight, norm_bias, weight, mean, rstd, ctx.bias_dtype is not None
        )
        if dbias is not None:
            dbias = dbias.to(ctx.bias_dtype)
        return dx.view(ctx.x_shape), dnw, dnb, dw, dbias, None, None


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (Dynamo would otherwise trace the launchers' host code into the graph).


@torch.library.custom_op("featurecache::layernorm_linear_fwd", mutates_args=())
def _layernorm_linear_fwd_op(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = layernorm_linear_fwd(
        x.reshape(-1, x.shape[-1]).contiguous(), norm_weight, norm_bias, weight, bias, eps
    )
    return y.view(*x.shape[:-1], weight.shape[0]), mean, rstd


@_layernorm_linear_fwd_op.register_fake
def _(x, norm_weight, norm_bias, weight, bias, eps):
    rows = x.numel() // x.shape[-1]
    stats = x.new_empty(rows, dtype=torch.float32)
    return x.new_empty((*x.shape[:-1], weight.shape[0])), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::layernorm_linear_bwd", mutates_args=())
def _layernorm_linear_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    has_bias: bool,
) -> list[torch.Tensor]:
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    dx, dnw, dnb, dw, dbias = layernorm_linear_bwd(
        dy.reshape(-1, weight.shape[0]).contiguous(), x2d, norm_weight, norm_bias, weight, mean, rstd, has_bias
    )
    # Custom ops cannot return None: an empty tensor stands for "no bias".
    grads = (dx.view(x.shape), dnw, dnb, dw, dbias if dbias is not None else x.new_empty(0))
    return list(runtime.unaliased(grads))


@_layernorm_linear_bwd_op.register_fake
def _(dy, x, norm_weight, norm_bias, weight, mean, rstd, has_bias):
    dbias = weight.new_empty(weight.shape[0], dtype=torch.float32) if has_bias else x.new_empty(0)
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, norm_weight, norm_bias, weight)] + [
        dbias
    ]


def _layernorm_linear_setup(ctx, inputs, output) -> None:
    x, norm_weight, norm_bias, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, norm_weight, norm_bias, weight, mean, rstd)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _layernorm_linear_backward(ctx, dy, _dmean, _drstd):
    dx, dnw, dnb, dw, dbias = _layernorm_linear_bwd_op(dy, *ctx.saved_tensors, ctx.bias_dtype is not None)
    return dx, dnw, dnb, dw, None if ctx.bias_dtype is None else dbias.to(ctx.bias_dtype), None


_layernorm_linear_fwd_op.register_autograd(_layernorm_linear_backward, setup_context=_layernorm_linear_setup)


def layernorm_linear(x, norm_weight, norm_bias, weight, bias=None, eps=1e-5, aligned_rows=False):
    """Triton linear(layer_norm(x)); same numerics as layernorm_linear_reference.

    aligned_rows: return a view whose rows are 16-element aligned (see layernorm_linear_fwd)
    instead of a contiguous tensor."""
    runtime.check_triton_inputs(OP, x)
    x = runtime.autocast_input(x)
    runtime.max_channels_check(OP, "in_features", x.shape[-1])
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{OP}: x has {x.shape[-1]} features, weight expects {weight.shape[1]}")
    if x.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return layernorm_linear_reference(x, norm_weight, norm_bias, weight, bias, eps)
    (weight,) = runtime.weights_like(x, weight)
    if torch.compiler.is_compiling():
        # contiguous rows (aligned_rows serves the eager gated-attention kernels only)
        return _layernorm_linear_fwd_op(x, norm_weight, norm_bias, weight, bias, eps)[0]
    return _LayerNormLinearFunction.apply(x, norm_weight, norm_bias, weight, bias, eps, aligned_rows)
