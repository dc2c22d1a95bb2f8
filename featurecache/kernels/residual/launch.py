"""The residual add's launchers: allocate, launch one kernel over the flat tensors."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.residual.kernels import _residual_bwd_kernel, _residual_fwd_kernel

# One element per lane, 2048 a program: a memory-bound pass, the block only amortizes the launch.
BLOCK = 2048


def residual_add_fwd(
    z: torch.Tensor, update: torch.Tensor, low_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """z (fp32) + update, both contiguous and of one shape -> (the sum in fp32, the same in low_dtype)."""
    new = torch.empty_like(z)
    low = torch.empty_like(z, dtype=low_dtype)
    n = z.numel()
    _residual_fwd_kernel[(triton.cdiv(n, BLOCK),)](
        z, update, new, low, n, PRECISION=runtime.dot_precision(low_dtype), BLOCK=BLOCK
    )
    return new, low


def residual_add_bwd(
    d_new: torch.Tensor | None, d_low: torch.Tensor | None, update_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of the two sums (either may be None, not both) -> (d_z in fp32, d_update
    in update_dtype): both are d_new + d_low."""
    present = d_new if d_new is not None else d_low
    d_new = d_new.contiguous() if d_new is not None else None
    d_low = d_low.contiguous() if d_low is not None else None
    d_z = torch.empty(present.shape, device=present.device, dtype=torch.float32)
    d_update = torch.empty(present.shape, device=present.device, dtype=update_dtype)
    n = d_z.numel()
    _residual_bwd_kernel[(triton.cdiv(n, BLOCK),)](
        d_new if d_new is not None else d_z,
        d_low if d_low is not None else d_z,
        d_z,
        d_update,
        n,
        HAS_D_NEW=d_new is not None,
        HAS_D_LOW=d_low is not None,
        PRECISION=runtime.dot_precision(update_dtype),
        BLOCK=BLOCK,
    )
    return d_z, d_update
