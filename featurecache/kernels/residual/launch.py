"""The residual add's launchers: allocate, launch one kernel over the tensors seen as rows of their
last dimension (with the update's dropout, where given)."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.reference import DropoutSite, dropout_scale, dropout_site_mix, dropout_threshold
from featurecache.kernels.residual.kernels import _residual_bwd_kernel, _residual_fwd_kernel

# 2048 elements a program, as rows of channels: a memory-bound pass, the block only amortizes
# the launch; at most 1024 channels a tile (wider rows take several column tiles).
BLOCK = 2048
MAX_BLOCK_COLS = 1024
# Offsets past this need 64-bit indices (tile_range's WIDE): slower division of the row indices.
INT32_ELEMENTS = 2**31 - 1


def _dropout_arguments(dropout: DropoutSite | None, like: torch.Tensor, dtype: torch.dtype) -> dict:
    """The kernels' dropout arguments: the seed (a pointer, read on the device: a CUDA graph
    replays the seed drawn at each replay), the site's mix, the threshold, the scale in the
    update's dtype and the sizes X, Y of the [B, X, Y, C] update (C is the tile's channels);
    placeholders without dropout."""
    if dropout is None:
        return dict(SEED=like, site_mix=0, threshold=0, scale=0.0, size_x=1, size_y=1, HAS_DROPOUT=False, SHARED_DIM=1)
    if like.dim() != 4 or dropout.shared_dim not in (1, 2):
        raise ValueError(
            f"residual_add: dropout takes a [B, X, Y, C] update shared along 1 or 2, got {tuple(like.shape)} "
            f"shared along {dropout.shared_dim}"
        )
    _, size_x, size_y, _ = like.shape
    return dict(
        SEED=dropout.seed,
        site_mix=dropout_site_mix(dropout.site),
        threshold=dropout_threshold(dropout.rate),
        scale=dropout_scale(dropout.rate, dtype),
        size_x=size_x,
        size_y=size_y,
        HAS_DROPOUT=True,
        SHARED_DIM=dropout.shared_dim,
    )


def _tiling(like: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int], dict]:
    """(n_rows, n_cols) of a tensor seen as rows of its last dimension, the grid, and the
    kernels' tile sizes."""
    n_cols = like.shape[-1] if like.dim() else 1
    n_rows = like.numel() // max(n_cols, 1)
    block_cols = min(triton.next_power_of_2(max(n_cols, 1)), MAX_BLOCK_COLS)
    block_rows = max(1, BLOCK // block_cols)
    grid = (triton.cdiv(n_rows, block_rows), triton.cdiv(n_cols, block_cols))
    tiles = dict(BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, WIDE=like.numel() > INT32_ELEMENTS)
    return (n_rows, n_cols), grid, tiles


def residual_add_fwd(
    z: torch.Tensor, update: torch.Tensor, low_dtype: torch.dtype | None, dropout: DropoutSite | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """z + update (dropped out by `dropout` first, where given), both contiguous and of one shape
    -> (the sum in z's dtype, the same in low_dtype); low_dtype None: the sum once, returned twice."""
    new = torch.empty_like(z)
    low = new if low_dtype is None else torch.empty_like(z, dtype=low_dtype)
    if z.numel() == 0:
        return new, low
    sizes, grid, tiles = _tiling(z)
    _residual_fwd_kernel[grid](
        z,
        update,
        new,
        low,
        *sizes,
        **_dropout_arguments(dropout, z, update.dtype),
        HAS_LOW=low_dtype is not None,
        PRECISION=runtime.dot_precision(low_dtype or z.dtype),
        **tiles,
    )
    return new, low


def residual_add_bwd(
    d_new: torch.Tensor | None,
    d_low: torch.Tensor | None,
    update_dtype: torch.dtype,
    dropout: DropoutSite | None = None,
    stream_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of the two sums (either may be None, not both) -> (d_z in stream_dtype,
    d_update in update_dtype): both are d_new + d_low, d_update times the forward's dropout factor."""
    present = d_new if d_new is not None else d_low
    d_new = d_new.contiguous() if d_new is not None else None
    d_low = d_low.contiguous() if d_low is not None else None
    d_z = torch.empty(present.shape, device=present.device, dtype=stream_dtype)
    d_update = torch.empty(present.shape, device=present.device, dtype=update_dtype)
    if d_z.numel() == 0:
        return d_z, d_update
    sizes, grid, tiles = _tiling(d_z)
    _residual_bwd_kernel[grid](
        d_new if d_new is not None else d_z,
        d_low if d_low is not None else d_z,
        d_z,
        d_update,
        *sizes,
        **_dropout_arguments(dropout, d_z, update_dtype),
        HAS_D_NEW=d_new is not None,
        HAS_D_LOW=d_low is not None,
        PRECISION=runtime.dot_precision(update_dtype),
        **tiles,
    )
    return d_z, d_update
