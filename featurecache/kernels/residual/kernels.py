"""The residual add's Triton kernels: the sum in the stream's dtype (and, for an fp32 stream, in
the low dtype too), and its gradient, with the update's shared dropout (kernels/reference.py,
shared_dropout_reference) drawn in the same pass."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import cast


@triton.jit
def _hash32(value):
    """kernels/reference.py's hash32 on uint32 values: a uint32 product wraps modulo 2**32, which
    is the reference's int64 product masked to 32 bits; shifts of unsigned values are logical."""
    value = ((value >> 16) ^ value) * 0x45D9F3B
    value = ((value >> 16) ^ value) * 0x45D9F3B
    return (value >> 16) ^ value


@triton.jit
def _dropout_multiplier(offsets, SEED, site_mix, threshold, scale, size_x, size_y, size_c, SHARED_DIM: tl.constexpr):
    """The factor (scale or 0) of each element at `offsets` of a contiguous [B, X, Y, C] update:
    the hash of the seed and site, then of the indices b, x, y, c in order, the shared one left
    out (1: x, rowwise; 2: y, columnwise), as shared_dropout_reference folds them."""
    c = offsets % size_c
    rest = offsets // size_c
    y = rest % size_y
    rest = rest // size_y
    x = rest % size_x
    b = rest // size_x
    seed = tl.load(SEED).to(tl.int64)
    mixed = _hash32(((seed ^ site_mix) & 0xFFFFFFFF).to(tl.uint32))
    mixed = _hash32(mixed ^ b.to(tl.uint32))
    if SHARED_DIM != 1:
        mixed = _hash32(mixed ^ x.to(tl.uint32))
    if SHARED_DIM != 2:
        mixed = _hash32(mixed ^ y.to(tl.uint32))
    mixed = _hash32(mixed ^ c.to(tl.uint32))
    return tl.where(mixed.to(tl.int64) >= threshold, scale, 0.0)


@triton.jit
def _residual_fwd_kernel(
    Z,
    U,
    NEW,
    LOW,
    n,
    SEED,
    site_mix,
    threshold,
    scale,
    size_x,
    size_y,
    size_c,
    HAS_DROPOUT: tl.constexpr,
    SHARED_DIM: tl.constexpr,
    HAS_LOW: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offsets < n
    update = tl.load(U + offsets, mask=m, other=0.0).to(tl.float32)
    if HAS_DROPOUT:  # update * factor in the update's dtype, as the reference multiplies
        factor = _dropout_multiplier(offsets, SEED, site_mix, threshold, scale, size_x, size_y, size_c, SHARED_DIM)
        update = cast(update * factor, U.dtype.element_ty, PRECISION).to(tl.float32)
    new = tl.load(Z + offsets, mask=m, other=0.0).to(tl.float32) + update
    # the sum rounded once to the stream's dtype (a bf16 stream: as PyTorch's bf16 add rounds it)
    tl.store(NEW + offsets, cast(new, NEW.dtype.element_ty, PRECISION), mask=m)
    if HAS_LOW:
        tl.store(LOW + offsets, cast(new, LOW.dtype.element_ty, PRECISION), mask=m)


@triton.jit
def _residual_bwd_kernel(
    D_NEW,
    D_LOW,
    D_Z,
    D_U,
    n,
    SEED,
    site_mix,
    threshold,
    scale,
    size_x,
    size_y,
    size_c,
    HAS_D_NEW: tl.constexpr,
    HAS_D_LOW: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    SHARED_DIM: tl.constexpr,
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
    grad_update = cast(grad, D_U.dtype.element_ty, PRECISION)
    if HAS_DROPOUT:  # the dropped update's gradient (in the update's dtype) times the same factor
        factor = _dropout_multiplier(offsets, SEED, site_mix, threshold, scale, size_x, size_y, size_c, SHARED_DIM)
        grad_update = cast(grad_update.to(tl.float32) * factor, D_U.dtype.element_ty, PRECISION)
    tl.store(D_U + offsets, grad_update, mask=m)
