"""The Transition's autograd Function and custom ops, and `transition`, the entry point."""

from __future__ import annotations

import torch

from featurecache.kernels import runtime
from featurecache.kernels.reference import transition_reference
from featurecache.kernels.transition.config import OP
from featurecache.kernels.transition.launch import transition_bwd, transition_fwd

# Below this many rows (on a GPU) the fused kernel cannot fill the device: its grid is a program
# per row tile of 32-128 rows, each looping over the whole hidden width. At the single
# representation's 384 rows it took 0.164 ms against LayerNorm + cuBLAS's 0.0325 ms; at the
# pair's 147,456 rows it is 3x faster than they are (H100, 2026-12-06, benchmarks/NOTES.md
# section 20). Interpreted runs (tests, on the CPU) always take the kernel.
FUSED_MIN_ROWS = 16384


class _TransitionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = transition_fwd(x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)
        ctx.save_for_backward(x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d = ctx.saved_tensors[0]
        grads = transition_bwd(dy.reshape(x2d.shape).contiguous(), *ctx.saved_tensors)
        return (grads[0].view(ctx.x_shape), *grads[1:], None)


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (Dynamo would otherwise trace the launchers' host code into the graph).


@torch.library.custom_op("featurecache::transition_fwd", mutates_args=())
def _transition_fwd_op(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    weight_out: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = transition_fwd(
        x.reshape(-1, x.shape[-1]).contiguous(), norm_weight, norm_bias, weight_a, weight_b, weight_out, eps
    )
    return y.view(x.shape), mean, rstd


@_transition_fwd_op.register_fake
def _(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
    stats = x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::transition_bwd", mutates_args=())
def _transition_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    weight_out: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> list[torch.Tensor]:
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    grads = transition_bwd(
        dy.reshape(x2d.shape).contiguous(), x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd
    )
    return list(runtime.unaliased((grads[0].view(x.shape), *grads[1:])))


@_transition_bwd_op.register_fake
def _(dy, x, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd):
    return [
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (x, norm_weight, norm_bias, weight_a, weight_b, weight_out)
    ]


def _transition_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:6], *output[1:])


def _transition_backward(ctx, dy, _dmean, _drstd):
    return (*_transition_bwd_op(dy, *ctx.saved_tensors), None)


_transition_fwd_op.register_autograd(_transition_backward, setup_context=_transition_setup)


def transition(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps=1e-5):
    """Triton Transition; same signature and numerics as transition_reference."""
    runtime.check_triton_inputs(OP, x)
    x = runtime.autocast_input(x)
    runtime.max_channels_check(OP, "dim", x.shape[-1])
    if x.is_cuda and x.element_size() > 2 and x.shape[-1] > 512:
        raise ValueError(
            f"{OP}: dim={x.shape[-1]} in {x.dtype} needs more shared memory than a GPU has; "
            f"pass bf16/fp16 activations (autocast) or use kernels='torch'"
        )
    if weight_a.shape[1] != x.shape[-1] or weight_out.shape != weight_a.shape[::-1]:
        raise ValueError(
            f"{OP}: x has {x.shape[-1]} channels but weight_a is {tuple(weight_a.shape)} and "
            f"weight_out is {tuple(weight_out.shape)}"
        )
    if x.numel() == 0 or (x.is_cuda and x.numel() // x.shape[-1] < FUSED_MIN_ROWS):
        # no rows (nothing to launch; the result stays connected to the graph for autograd), or
        # too few to fill the GPU
        return transition_reference(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)
    weight_a, weight_b, weight_out = runtime.weights_like(x, weight_a, weight_b, weight_out)
    if torch.compiler.is_compiling():
        return _transition_fwd_op(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)[0]
    return _TransitionFunction.apply(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)
