"""The smooth LDDT's autograd Function and custom op, and `smooth_lddt_sums`, the entry point."""

from __future__ import annotations

import torch

from featurecache.kernels import runtime
from featurecache.kernels.smooth_lddt.launch import smooth_lddt_sums_fwd


def _smooth_lddt_setup(ctx, inputs, output) -> None:
    """What the backward needs, for the eager Function and the custom op alike: the gradient
    (output[2]) and predicted's dtype."""
    ctx.save_for_backward(output[2])
    ctx.dtype = inputs[0].dtype


def _smooth_lddt_backward(ctx, d_score, *_other_grads):
    """The saved d(score sum)/d(predicted) [B, S, A, 3] scaled by d_score [B, S]; the pair
    counts (and, under compile, the saved gradient itself) take no gradient, nor do true and radius."""
    (grad,) = ctx.saved_tensors
    return (d_score[..., None, None] * grad).to(ctx.dtype), None, None


class _SmoothLddtSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, predicted, true, radius):
        score, count, grad = smooth_lddt_sums_fwd(predicted, true, radius)
        _smooth_lddt_setup(ctx, (predicted, true, radius), (score, count, grad))
        ctx.mark_non_differentiable(count)
        return score, count

    backward = staticmethod(_smooth_lddt_backward)


# Under torch.compile: the same launch as a custom op, so neither Dynamo nor Inductor traces it.
@torch.library.custom_op("featurecache::smooth_lddt_sums", mutates_args=())
def _smooth_lddt_op(
    predicted: torch.Tensor, true: torch.Tensor, radius: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return smooth_lddt_sums_fwd(predicted, true, radius)


@_smooth_lddt_op.register_fake
def _(predicted, true, radius):
    batch, samples = predicted.shape[:2]
    return (
        predicted.new_empty((batch, samples), dtype=torch.float32),
        predicted.new_empty(batch, dtype=torch.float32),
        predicted.new_empty(predicted.shape, dtype=torch.float32),
    )


_smooth_lddt_op.register_autograd(_smooth_lddt_backward, setup_context=_smooth_lddt_setup)


def smooth_lddt_sums(
    predicted: torch.Tensor, true: torch.Tensor, radius: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """smooth_lddt_sums_reference in one Triton kernel (fp32, with the gradient with respect to
    `predicted`; none for `true`). On CUDA or the interpreter only."""
    if not runtime.runs_triton(predicted.device):
        raise RuntimeError("smooth_lddt_sums: Triton does not run on this device; use the reference")
    if torch.compiler.is_compiling():
        score, count, _ = _smooth_lddt_op(predicted, true.detach(), radius.detach())
        return score, count
    return _SmoothLddtSums.apply(predicted, true.detach(), radius.detach())
