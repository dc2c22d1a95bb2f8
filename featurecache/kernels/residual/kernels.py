"""The residual add's Triton kernels: the sum in fp32 and in the low dtype, and its gradient."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import cast


@triton.jit
def _residual_fwd_kernel(Z, U, NEW, LOW, n, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offsets < n
    new = tl.load(Z + offsets, mask=m, other=0.0).to(tl.float32) + tl.load(U + offsets, mask=m, other=0.0).to(
        tl.float32
    )
    tl.store(NEW + offsets, new.to(NEW.dtype.element_ty), mask=m)
    tl.store(LOW + offsets, cast(new, LOW.dtype.element_ty, PRECISION), mask=m)


@triton.jit
def _residual_bwd_kernel(
    D_NEW,
    D_LOW,
    D_Z,
    D_U,
    n,
    HAS_D_NEW: tl.constexpr,
    HAS_D_LOW: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offsets < n
    grad = tl.zeros([BLOCK], tl.float32)
    if HAS_D_NEW:
        grad += tl.load(D_NEW + offsets, mask=m, other=0.0).to(tl.float32)
    if HAS_D_LOW:
        grad += tl.load(D_LOW + offsets, mask=m, other=0.0).to(tl.float32)
    tl.store(D_Z + offsets, grad.to(D_Z.dtype.element_ty), mask=m)
    tl.store(D_U + offsets, cast(grad, D_U.dtype.element_ty, PRECISION), mask=m)
