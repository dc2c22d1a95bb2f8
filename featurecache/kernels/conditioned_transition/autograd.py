"""The conditioned transition's autograd Functions and custom ops, and the entry points
`conditioned_transition` (Algorithm 25 with its AdaLN) and `adaptive_layernorm` (Algorithm 26).

FUSED_MAX_CHANNELS is read as config.FUSED_MAX_CHANNELS at each call, so a benchmark or test
that lowers it sends narrow rows down the wide path."""

from __future__ import annotations

import torch

from featurecache.kernels import runtime
from featurecache.kernels.conditioned_transition import config
from featurecache.kernels.weight_casts import cast_weight
from featurecache.kernels.conditioned_transition.launch import (
    adaln_bwd,
    adaln_fwd,
    conditioned_transition_bwd,
    conditioned_transition_fwd,
)
from featurecache.kernels.reference import (
    adaln_conditioning,
    adaln_modulate,
    conditioned_transition_reference,
)


class _ConditionedTransitionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
        y, out, mean, rstd = conditioned_transition_fwd(a, scale, shift, gate, weight_a, weight_b, weight_out, eps)
        ctx.save_for_backward(a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        return (*conditioned_transition_bwd(dy.contiguous(), *ctx.saved_tensors), None)


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (as the other ops: transition/autograd.py).


@torch.library.custom_op("featurecache::conditioned_transition_fwd", mutates_args=())
def _conditioned_transition_fwd_op(
    a: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    weight_out: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return conditioned_transition_fwd(
        *(t.contiguous() for t in (a, scale, shift, gate, weight_a, weight_b, weight_out)), eps
    )


@_conditioned_transition_fwd_op.register_fake
def _(a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
    stats = a.new_empty(a.numel() // a.shape[-1], dtype=torch.float32)
    like = torch.empty_like(a, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::conditioned_transition_bwd", mutates_args=())
def _conditioned_transition_bwd_op(
    dy: torch.Tensor,
    a: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    weight_out: torch.Tensor,
    out: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> list[torch.Tensor]:
    tensors = (dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out)
    grads = conditioned_transition_bwd(*(t.contiguous() for t in tensors), mean, rstd)
    return list(runtime.unaliased(grads))


@_conditioned_transition_bwd_op.register_fake
def _(dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd):
    return [
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (a, scale, shift, gate, weight_a, weight_b, weight_out)
    ]


def _conditioned_transition_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:7], *output[1:])


def _conditioned_transition_backward(ctx, dy, _dout, _dmean, _drstd):
    return (*_conditioned_transition_bwd_op(dy, *ctx.saved_tensors), None)


_conditioned_transition_fwd_op.register_autograd(
    _conditioned_transition_backward, setup_context=_conditioned_transition_setup
)


class _AdaLNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, scale, shift, eps):
        x, mean, rstd = adaln_fwd(a, scale, shift, eps)
        ctx.save_for_backward(a, scale, shift, mean, rstd)
        return x

    @staticmethod
    def backward(ctx, dx):
        return (*adaln_bwd(dx.contiguous(), *ctx.saved_tensors), None)


@torch.library.custom_op("featurecache::adaln_fwd", mutates_args=())
def _adaln_fwd_op(
    a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return adaln_fwd(a.contiguous(), scale.contiguous(), shift.contiguous(), eps)


@_adaln_fwd_op.register_fake
def _(a, scale, shift, eps):
    stats = a.new_empty(a.numel() // a.shape[-1], dtype=torch.float32)
    return torch.empty_like(a, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::adaln_bwd", mutates_args=())
def _adaln_bwd_op(
    dx: torch.Tensor, a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> list[torch.Tensor]:
    return list(runtime.unaliased(adaln_bwd(*(t.contiguous() for t in (dx, a, scale, shift)), mean, rstd)))


@_adaln_bwd_op.register_fake
def _(dx, a, scale, shift, mean, rstd):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (a, scale, shift)]


def _adaln_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:3], *output[1:])


def _adaln_backward_op(ctx, dx, _dmean, _drstd):
    return (*_adaln_bwd_op(dx, *ctx.saved_tensors), None)


_adaln_fwd_op.register_autograd(_adaln_backward_op, setup_context=_adaln_setup)


def _adaln_modulate(a, scale, shift, eps):
    """x = sigmoid(scale) * LayerNorm(a) + shift by the one-pass kernel."""
    if torch.compiler.is_compiling():
        return _adaln_fwd_op(a, scale, shift, eps)[0]
    return _AdaLNFunction.apply(a.contiguous(), scale.contiguous(), shift.contiguous(), eps)


def _prepared(a, s, weight_a, weight_out):
    """Checks shared by the entry points; a and s in the dtype the kernels compute in."""
    runtime.check_triton_inputs(config.OP, a, s)
    a, s = runtime.autocast_input(a), runtime.autocast_input(s)
    runtime.max_channels_check(config.OP, "dim", a.shape[-1])
    _check_shapes(a, s, weight_a, weight_out)
    return a, s.to(a.dtype)


def adaptive_layernorm(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps=1e-5):
    """Triton AdaLN (Algorithm 26): sigmoid(Linear(LN(s))) * LayerNorm(a) + LinearNoBias(LN(s)),
    the s side with PyTorch (once per s row) and the rest in one pass over a. Shapes as
    conditioned_transition's; returns [..., C_a] in a's dtype."""
    a, s = _prepared(a, s, None, None)
    scale, shift = adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)
    return adaptive_layernorm_modulated(a, scale, shift, eps)


def adaptive_layernorm_modulated(a, scale, shift, eps=1e-5):
    """adaptive_layernorm with its s side given: scale logits and shift [..., C_a], s's leading
    shape (adaln_conditioning's outputs), e.g. computed once for a sampler's steps."""
    a = runtime.autocast_input(a)
    scale, shift = scale.to(a.dtype), shift.to(a.dtype)
    if a.numel() == 0:
        return adaln_modulate(a, scale, shift, eps)
    return _adaln_modulate(a, scale, shift, eps)


def _check_shapes(a, s, weight_a, weight_out) -> None:
    if weight_a is not None and (weight_a.shape[1] != a.shape[-1] or weight_out.shape != weight_a.shape[::-1]):
        raise ValueError(
            f"{config.OP}: a has {a.shape[-1]} channels but weight_a is {tuple(weight_a.shape)} and "
            f"weight_out is {tuple(weight_out.shape)}"
        )
    leading = s.shape[:-1]
    shared = a.dim() >= 3 and leading == (*a.shape[:-3], 1, a.shape[-2])
    if leading != a.shape[:-1] and not shared:
        raise ValueError(
            f"{config.OP}: s of shape {tuple(s.shape)} neither matches a {tuple(a.shape)} row for row nor "
            f"is shared by its samples ([..., 1, L, C_s])"
        )


def conditioned_transition(
    a,
    s,
    norm_s_weight,
    scale_weight,
    scale_bias,
    shift_weight,
    weight_a,
    weight_b,
    weight_out,
    gate_weight,
    gate_bias,
    eps=1e-5,
):
    """Triton ConditionedTransitionBlock; same signature and numerics as
    conditioned_transition_reference. s is [..., S, L, C_s] like a, or [..., 1, L, C_s] shared by
    a's S samples (then the s side runs once per token, not once per sample)."""
    a, s = _prepared(a, s, weight_a, weight_out)
    if a.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return conditioned_transition_reference(
            a,
            s,
            norm_s_weight,
            scale_weight,
            scale_bias,
            shift_weight,
            weight_a,
            weight_b,
            weight_out,
            gate_weight,
            gate_bias,
            eps,
        )
    # the s side with PyTorch, once per s row; its products in a's dtype, as the kernel's
    scale, shift = adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)
    gate = torch.nn.functional.linear(s, cast_weight(gate_weight, s.dtype), cast_weight(gate_bias, s.dtype))
    return conditioned_transition_modulated(a, scale, shift, gate, weight_a, weight_b, weight_out, eps)


def conditioned_transition_modulated(a, scale, shift, gate, weight_a, weight_b, weight_out, eps=1e-5):
    """conditioned_transition with its s side given: the AdaLN's scale logits and shift and the
    gate's logits [..., C_a], s's leading shape (e.g. computed once for a sampler's steps)."""
    a = runtime.autocast_input(a)
    scale, shift, gate = (t.to(a.dtype) for t in (scale, shift, gate))
    weight_a, weight_b, weight_out = runtime.weights_like(a, weight_a, weight_b, weight_out)
    if a.numel() == 0 or a.shape[-1] > config.FUSED_MAX_CHANNELS:
        # no rows (nothing to launch; the result stays connected to the graph for autograd), or
        # rows too wide for registers: the one-pass AdaLN, then cuBLAS products (see the top)
        x = adaln_modulate(a, scale, shift, eps) if a.numel() == 0 else _adaln_modulate(a, scale, shift, eps)
        hidden = torch.nn.functional.silu(x @ weight_a.t()) * (x @ weight_b.t())
        return (torch.sigmoid(gate.float()) * (hidden @ weight_out.t()).float()).to(a.dtype)
    if torch.compiler.is_compiling():
        return _conditioned_transition_fwd_op(a, scale, shift, gate, weight_a, weight_b, weight_out, eps)[0]
    tensors = (t.contiguous() for t in (a, scale, shift, gate, weight_a, weight_b, weight_out))
    return _ConditionedTransitionFunction.apply(*tensors, eps)
