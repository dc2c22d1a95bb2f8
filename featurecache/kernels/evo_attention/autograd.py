"""EvoAttention's custom ops and autograd, and `evo_attention`, the entry point.

In eager mode a torch.autograd.Function calls the launchers directly; under torch.compile the
same launchers run inside two torch.library custom ops (featurecache::evo_attention_fwd / _bwd)
with registered fake and autograd implementations, so the compiled graph keeps them without a
break.
"""

from __future__ import annotations


import torch

from featurecache.kernels import runtime
from featurecache.kernels.evo_attention.launch import check_inputs, evo_attention_backward, evo_attention_forward
from featurecache.kernels.reference import evo_attention_reference


@torch.library.custom_op("featurecache::evo_attention_fwd", mutates_args=())
def _evo_attention_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return evo_attention_forward(q, k, v, bias, mask, scale)


@_evo_attention_fwd_op.register_fake
def _(q, k, v, bias, mask, scale):
    batch, rows, seq_len, heads, _ = q.shape
    return (
        q.new_empty(q.shape),
        q.new_empty((batch, rows, heads, seq_len), dtype=torch.float32),
        q.new_empty((batch, rows), dtype=torch.int32),
    )


@torch.library.custom_op("featurecache::evo_attention_bwd", mutates_args=())
def _evo_attention_bwd_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = evo_attention_backward(grad_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad)
    # Custom ops cannot return None: an empty tensor stands for "no bias gradient".
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)


@_evo_attention_bwd_op.register_fake
def _(grad_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bias, mask, scale = inputs
    out, lse, key_end = output
    ctx.save_for_backward(q, k, v, bias, mask, out, lse, key_end)
    ctx.scale = scale
    ctx.bias_grad = bias is not None and ctx.needs_input_grad[3]


def _backward(ctx, grad_out, grad_lse, grad_key_end):
    q, k, v, bias, mask, out, lse, key_end = ctx.saved_tensors
    dq, dk, dv, dbias = _evo_attention_bwd_op(
        grad_out, q, k, v, bias, mask, out, lse, key_end, ctx.scale, ctx.bias_grad
    )
    return dq, dk, dv, dbias if ctx.bias_grad else None, None, None


_evo_attention_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EvoAttentionFunction(torch.autograd.Function):
    """The eager path: same launchers, without custom-op dispatch.

    A custom-op call costs a few hundred microseconds of host time, as much as the kernels
    themselves at N = 1 (benchmarks/NOTES-evo_attention.md). Under torch.compile the custom ops
    are used instead, so the graph has no break.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse, key_end)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse, key_end = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = evo_attention_backward(
            grad_out, q, k, v, bias, mask, out, lse, key_end, ctx.scale, bias_grad
        )
        return dq, dk, dv, dbias, None, None


def evo_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over L with pair bias and key mask, independently for each of the N rows.

    q, k, v: [B, N, L, H, D], any strides; bias: [B, 1 or N, H, L, L] in fp32 or q's dtype;
    mask: [B, N, L] bool, True = attend. Returns [B, N, L, H, D] in q's dtype; rows with every
    key masked give zeros. scale defaults to D ** -0.5. On CUDA (or on CPU under
    TRITON_INTERPRET=1) this runs the Triton kernels; otherwise the PyTorch reference.
    """
    if runtime.runs_triton(q.device):
        # Autocast does not reach inside the kernels: cast q, k, v where it would (an fp32
        # bias is read as is).
        q, k, v = (runtime.autocast_input(t) for t in (q, k, v))
    check_inputs(q, k, v, bias, mask)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not runtime.runs_triton(q.device):
        return evo_attention_reference(q, k, v, bias, mask, scale)
    if torch.compiler.is_compiling():
        out, _, _ = _evo_attention_fwd_op(q, k, v, bias, mask, float(scale))
        return out
    return _EvoAttentionFunction.apply(q, k, v, bias, mask, float(scale))
