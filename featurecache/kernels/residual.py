"""Residual add of a low-precision update to an fp32 stream, returning the sum in both precisions.

Under bf16 autocast the pair representation z stays fp32 between updates (as autocast leaves
any residual stream), while every update reads it in bf16. Composed from PyTorch ops, each of
the Pairformer's five pair updates then costs four memory-bound kernels around it: the add
(fp32 + bf16), the next module's cast to bf16, and in the backward the cast of that module's
bf16 input gradient back to fp32 and its add to the stream's gradient (plus a cast of the
update's gradient to bf16), each a full pass over the largest tensor of the trunk (profiles:
benchmarks/NOTES-train_step.md). Here each direction is one kernel:
- forward: new = z + update in fp32, written once in fp32 and once in bf16;
- backward: d_z = d_new + d_low (fp32) and d_update = d_z in the update's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from featurecache.kernels import runtime
from featurecache.kernels.primitives import cast

_BLOCK = 2048

# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _residual_fwd_kernel(Z, U, NEW, LOW, n, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offsets < n
    new = tl.load(Z + offsets, mask=m, other=0.0).to(tl.float32) + tl.load(U + offsets, mask=m, other=0.0).to(tl.float32)
    tl.store(NEW + offsets, new.to(NEW.dtype.element_ty), mask=m)
    tl.store(LOW + offsets, cast(new, LOW.dtype.element_ty, PRECISION), mask=m)


@triton.jit
def _residual_bwd_kernel(D_NEW, D_LOW, D_Z, D_U, n, HAS_D_NEW: tl.constexpr, HAS_D_LOW: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offsets < n
    grad = tl.zeros([BLOCK], tl.float32)
    if HAS_D_NEW:
        grad += tl.load(D_NEW + offsets, mask=m, other=0.0).to(tl.float32)
    if HAS_D_LOW:
        grad += tl.load(D_LOW + offsets, mask=m, other=0.0).to(tl.float32)
    tl.store(D_Z + offsets, grad.to(D_Z.dtype.element_ty), mask=m)
    tl.store(D_U + offsets, cast(grad, D_U.dtype.element_ty, PRECISION), mask=m)


# --------------------------------------------------------------------------------------------
# Autograd (the launches are one line each) and the entry points
# --------------------------------------------------------------------------------------------


class _ResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, update, low_dtype):
        new = torch.empty_like(z)
        low = torch.empty_like(z, dtype=low_dtype)
        n = z.numel()
        _residual_fwd_kernel[(triton.cdiv(n, _BLOCK),)](z, update, new, low, n, PRECISION=runtime.dot_precision(low_dtype),
                                                       BLOCK=_BLOCK)
        ctx.update_dtype = update.dtype
        return new, low

    @staticmethod
    def backward(ctx, d_new, d_low):
        present = d_new if d_new is not None else d_low
        if present is None:
            return None, None, None
        d_new = d_new.contiguous() if d_new is not None else None
        d_low = d_low.contiguous() if d_low is not None else None
        d_z = torch.empty(present.shape, device=present.device, dtype=torch.float32)
        d_update = torch.empty(present.shape, device=present.device, dtype=ctx.update_dtype)
        n = d_z.numel()
        _residual_bwd_kernel[(triton.cdiv(n, _BLOCK),)](
            d_new if d_new is not None else d_z, d_low if d_low is not None else d_z, d_z, d_update, n,
            HAS_D_NEW=d_new is not None, HAS_D_LOW=d_low is not None,
            PRECISION=runtime.dot_precision(ctx.update_dtype), BLOCK=_BLOCK)
        return d_z, d_update, None


def residual_add_reference(z: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z + update, the same in autocast's dtype): PyTorch ops. Without autocast, or for a
    stream that is not fp32, both are the same tensor."""
    new = z + update
    if new.dtype == torch.float32 and torch.is_autocast_enabled(new.device.type):
        return new, new.to(torch.get_autocast_dtype(new.device.type))
    return new, new


def residual_add(z: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_add_reference in one Triton kernel each way, where it matters: an fp32 stream
    under autocast, on CUDA (or the interpreter), outside torch.compile (which fuses the
    composition itself)."""
    if (z.dtype != torch.float32 or not torch.is_autocast_enabled(z.device.type)
            or z.shape != update.shape or not z.is_contiguous() or not update.is_contiguous()
            or torch.compiler.is_compiling() or not runtime.runs_triton(z.device)):
        return residual_add_reference(z, update)
    return _ResidualAdd.apply(z, update, torch.get_autocast_dtype(z.device.type))
