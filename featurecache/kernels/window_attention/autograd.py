"""Windowed attention's custom ops and autograd, and `window_attention`, the entry point.

In eager mode a torch.autograd.Function calls the launchers directly (a custom-op call costs
host time, benchmarks/NOTES-evo_attention.md attempt 1); under torch.compile the same launchers
run inside two torch.library custom ops (featurecache::window_attention_fwd / _bwd) with fake
and autograd implementations, so neither Dynamo nor Inductor traces into the launchers.
"""

from __future__ import annotations


import torch

from featurecache.kernels import runtime
from featurecache.kernels.reference import window_attention_reference
from featurecache.kernels.window_attention.launch import (
    check_inputs,
    config_for,
    window_attention_backward,
    window_attention_forward,
)


@torch.library.custom_op("featurecache::window_attention_fwd", mutates_args=())
def _window_attention_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return window_attention_forward(q, k, v, bias, mask, scale)


@_window_attention_fwd_op.register_fake
def _(q, k, v, bias, mask, scale):
    batch, samples, windows, queries, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, samples, windows, heads, queries), dtype=torch.float32)


@torch.library.custom_op("featurecache::window_attention_bwd", mutates_args=())
def _window_attention_bwd_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = window_attention_backward(grad_out, q, k, v, bias, mask, out, lse, scale, bias_grad)
    # Custom ops cannot return None: an empty tensor stands for "no bias gradient".
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)


@_window_attention_bwd_op.register_fake
def _(grad_out, q, k, v, bias, mask, out, lse, scale, bias_grad):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bias, mask, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, bias, mask, out, lse)
    ctx.scale = scale
    ctx.bias_grad = bias is not None and ctx.needs_input_grad[3]


def _backward(ctx, grad_out, grad_lse):
    q, k, v, bias, mask, out, lse = ctx.saved_tensors
    dq, dk, dv, dbias = _window_attention_bwd_op(
        grad_out.contiguous(), q, k, v, bias, mask, out, lse, ctx.scale, ctx.bias_grad
    )
    return dq, dk, dv, dbias if ctx.bias_grad else None, None, None


_window_attention_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _WindowAttentionFunction(torch.autograd.Function):
    """The eager path: the same launchers without custom-op dispatch."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        # One configuration for both directions (the benchmarks override it around a forward).
        ctx.config = config_for(q)
        out, lse = window_attention_forward(q, k, v, bias, mask, scale, ctx.config)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = window_attention_backward(
            grad_out.contiguous(), q, k, v, bias, mask, out, lse, ctx.scale, bias_grad, ctx.config
        )
        return dq, dk, dv, dbias, None, None


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention inside windows, the bias and key mask shared by the samples.

    q [B, S, W, queries, H, D]; k, v [B, S, W, keys, H, D] (any strides); bias
    [B, W, H, queries, keys] in fp32 or q's dtype; mask [B, W, keys] bool, True = attend.
    Returns [B, S, W, queries, H, D] in q's dtype; queries with every key masked give zeros.
    scale defaults to D ** -0.5. On CUDA (or on CPU under TRITON_INTERPRET=1) this runs the
    Triton kernels; otherwise window_attention_reference.
    """
    if runtime.runs_triton(q.device):
        # Autocast does not reach inside the kernels: cast q, k, v where it would.
        q, k, v = (runtime.autocast_input(t) for t in (q, k, v))
    check_inputs(q, k, v, bias, mask)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not runtime.runs_triton(q.device):
        return window_attention_reference(q, k, v, bias, mask, scale)
    if torch.compiler.is_compiling():
        out, _ = _window_attention_fwd_op(q, k, v, bias, mask, float(scale))
        return out
    return _WindowAttentionFunction.apply(q, k, v, bias, mask, float(scale))
