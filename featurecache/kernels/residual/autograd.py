"""The residual add's autograd Function and `residual_add`, the entry point."""

from __future__ import annotations

import torch

from featurecache.kernels import runtime
from featurecache.kernels.reference import DropoutSite, residual_add_reference
from featurecache.kernels.residual.launch import residual_add_bwd, residual_add_fwd


class _ResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, update, low_dtype, dropout):
        ctx.update_dtype, ctx.dropout = update.dtype, dropout  # the mask is drawn again in backward
        ctx.set_materialize_grads(False)  # an unused result's gradient is None: no zeros to read
        return residual_add_fwd(z, update, low_dtype, dropout)

    @staticmethod
    def backward(ctx, d_new, d_low):
        if d_new is None and d_low is None:
            return None, None, None, None
        return (*residual_add_bwd(d_new, d_low, ctx.update_dtype, ctx.dropout), None, None)


class _StreamResidualAdd(torch.autograd.Function):
    """A stream in the update's dtype (the bf16 pair under autocast, or anything without it) with
    dropout: the sum once (the mask drawn in the kernel), returned as two outputs, the sum and a
    view of it, as the fp32 stream's add returns the sum in two dtypes. The next update reads one
    and the next residual add the other, so their gradients reach backward separately and one
    kernel adds them: autograd would otherwise add them in a pass of its own over the stream."""

    @staticmethod
    def forward(ctx, z, update, dropout):
        ctx.dtypes, ctx.dropout = (update.dtype, z.dtype), dropout
        ctx.set_materialize_grads(False)  # an unused result's gradient is None: no zeros to read
        new = residual_add_fwd(z, update, None, dropout)[0]
        return new, new.view(new.shape)

    @staticmethod
    def backward(ctx, d_new, d_low):
        if d_new is None and d_low is None:
            return None, None, None
        update_dtype, stream_dtype = ctx.dtypes
        return (*residual_add_bwd(d_new, d_low, update_dtype, ctx.dropout, stream_dtype), None)


def residual_add(
    z: torch.Tensor, update: torch.Tensor, dropout: DropoutSite | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_add_reference (with `dropout` of the update, where given) in one Triton kernel
    each way, where it matters, on CUDA (or the interpreter), outside torch.compile (which fuses
    the composition itself): an fp32 stream under autocast (the sum in both dtypes), or a stream
    of the update's dtype with dropout (the bf16 pair under autocast: the sum and a view of it,
    whose two gradients backward adds in its one kernel). The mask is drawn in the kernel from
    the seed: no mask tensor, no pass of its own."""
    if dropout is not None and dropout.rate <= 0.0:
        dropout = None
    if (
        z.shape != update.shape
        or not z.is_contiguous()
        or not update.is_contiguous()
        or torch.compiler.is_compiling()
        or not runtime.runs_triton(z.device)
        or (dropout is not None and update.dim() != 4)
    ):
        return residual_add_reference(z, update, dropout)
    if z.dtype == torch.float32 and torch.is_autocast_enabled(z.device.type):
        return _ResidualAdd.apply(z, update, torch.get_autocast_dtype(z.device.type), dropout)
    if dropout is not None and z.dtype == update.dtype:
        return _StreamResidualAdd.apply(z, update, dropout)
    # Without dropout, a stream of the update's dtype is the reference's one add: its backward is
    # autograd's one add of the two gradients, which are then z's and the update's alike (a
    # kernel would write that sum twice; measured, H100 2026-12-07, NOTES.md section 26).
    return residual_add_reference(z, update, dropout)
