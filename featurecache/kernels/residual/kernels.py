"""The residual add's Triton kernels: the sum in the stream's dtype (and, for an fp32 stream, in
the low dtype too), and its gradient, with the update's shared dropout (kernels/reference.py,
shared_dropout_reference) drawn in the same pass."""

from __future__ import annotations

import triton
import triton.language as tl

from featurecache.kernels.primitives import cast, tile_range


@triton.jit
def _hash32(value):
    """kernels/reference.py's hash32 on uint32 values: a uint32 product wraps modulo 2**32, which
    is the reference's int64 product masked to 32 bits; shifts of unsigned values are logical."""
    value = ((value >> 16) ^ value) * 0x45D9F3B
    value = ((value >> 16) ^ value) * 0x45D9F3B
    return (value >> 16) ^ value


@triton.jit
def _tile(pid_rows, pid_cols, n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, WIDE: tl.constexpr):
    """A [BLOCK_ROWS, BLOCK_COLS] tile of the [rows, channels] view: its row indices (int64 when
    WIDE), channel indices, flat offsets and mask. Rows of channels, not flat offsets, so that
    the dropout's per-row indices are divided out once a row, not once an element."""
    rows = tile_range(pid_rows * BLOCK_ROWS, BLOCK_ROWS, WIDE)
    cols = pid_cols * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    offsets = rows[:, None] * n_cols + cols[None, :]
    return rows, cols, offsets, (rows < n_rows)[:, None] & (cols < n_cols)[None, :]


@triton.jit
def _dropout_multiplier(rows, cols, SEED, site_mix, threshold, scale, size_x, size_y, SHARED_DIM: tl.constexpr):
    """The factor (scale or 0) of each element of a [rows, channels] tile of a contiguous
    [B, X, Y, C] update: the hash of the seed and site, then of the indices b, x, y, c in order,
    the shared one left out (1: x, rowwise; 2: y, columnwise), as shared_dropout_reference folds
    them. Everything up to c is a row's: hashed once per row, then once per element with c."""
    y = rows % size_y
    rest = rows // size_y
    x = rest % size_x
    b = rest // size_x
    seed = tl.load(SEED).to(tl.int64)
    mixed = _hash32(((seed ^ site_mix) & 0xFFFFFFFF).to(tl.uint32))
    mixed = _hash32(mixed ^ b.to(tl.uint32))
    if SHARED_DIM != 1:
        mixed = _hash32(mixed ^ x.to(tl.uint32))
    if SHARED_DIM != 2:
        mixed = _hash32(mixed ^ y.to(tl.uint32))
    mixed = _hash32(mixed[:, None] ^ cols.to(tl.uint32)[None, :])
    return tl.where(mixed.to(tl.int64) >= threshold, scale, 0.0)


@triton.jit
def _residual_fwd_kernel(
    Z,
    U,
    NEW,
    LOW,
    n_rows,
    n_cols,
    SEED,
    site_mix,
    threshold,
    scale,
    size_x,
    size_y,
    HAS_DROPOUT: tl.constexpr,
    SHARED_DIM: tl.constexpr,
    HAS_LOW: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    WIDE: tl.constexpr,
):
    rows, cols, offsets, m = _tile(tl.program_id(0), tl.program_id(1), n_rows, n_cols, BLOCK_ROWS, BLOCK_COLS, WIDE)
    update = tl.load(U + offsets, mask=m, other=0.0).to(tl.float32)
    if HAS_DROPOUT:  # update * factor in the update's dtype, as the reference multiplies
        factor = _dropout_multiplier(rows, cols, SEED, site_mix, threshold, scale, size_x, size_y, SHARED_DIM)
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
    n_rows,
    n_cols,
    SEED,
    site_mix,
    threshold,
    scale,
    size_x,
    size_y,
    HAS_D_NEW: tl.constexpr,
    HAS_D_LOW: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    SHARED_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    WIDE: tl.constexpr,
):
    rows, cols, offsets, m = _tile(tl.program_id(0), tl.program_id(1), n_rows, n_cols, BLOCK_ROWS, BLOCK_COLS, WIDE)
    grad = tl.zeros([BLOCK_ROWS, BLOCK_COLS], tl.float32)
    if HAS_D_NEW:
        grad += tl.load(D_NEW + offsets, mask=m, other=0.0).to(tl.float32)
    if HAS_D_LOW:
        grad += tl.load(D_LOW + offsets, mask=m, other=0.0).to(tl.float32)
    # the two gradients' sum rounded once to the stream's dtype, as autograd's add of them would
    tl.store(D_Z + offsets, cast(grad, D_Z.dtype.element_ty, PRECISION), mask=m)
    grad_update = cast(grad, D_U.dtype.element_ty, PRECISION)
    if HAS_DROPOUT:  # the dropped update's gradient (in the update's dtype) times the same factor
        factor = _dropout_multiplier(rows, cols, SEED, site_mix, threshold, scale, size_x, size_y, SHARED_DIM)
        grad_update = cast(grad_update.to(tl.float32) * factor, D_U.dtype.element_ty, PRECISION)
    tl.store(D_U + offsets, grad_update, mask=m)
