"""Helpers shared by the fused small-op kernels (layernorm_linear, transition, triangle_mult).

Triton side: row-wise LayerNorm forward and backward on a [BLOCK_M, BLOCK_C] register tile whose
padded columns hold zeros. Python side: block configurations read per GPU name from
configs/fused_ops.json, launch checks, and the row-split count of the weight-gradient kernels.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

_CONFIG_FILE = pathlib.Path(__file__).resolve().parent / "configs" / "fused_ops.json"
IMPLS = ("triton", "torch")


@triton.jit
def _layernorm_rows(x, col_mask, n_cols, eps):
    """x [BLOCK_M, BLOCK_C] fp32 with zeros in padded columns -> (xhat, mean, rstd), fp32."""
    mean = tl.sum(x, axis=1) / n_cols
    centered = tl.where(col_mask[None, :], x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / n_cols
    rstd = tl.rsqrt(var + eps)
    return centered * rstd[:, None], mean, rstd


@triton.jit
def _normalize_saved(x, mean, rstd, col_mask):
    """xhat from saved statistics; bitwise the same formula as _layernorm_rows."""
    return tl.where(col_mask[None, :], x - mean[:, None], 0.0) * rstd[:, None]


@triton.jit
def _layernorm_rows_bwd(d_out, xhat, weight, rstd, n_cols):
    """Gradient wrt the LayerNorm input given d_out wrt its (affine) output. All fp32.

    Padded columns must have weight == 0 and xhat == 0; their result is garbage and not stored.
    """
    d_xhat = d_out * weight[None, :]
    proj = tl.sum(d_xhat * xhat, axis=1) / n_cols
    mean_d = tl.sum(d_xhat, axis=1) / n_cols
    return (d_xhat - xhat * proj[:, None] - mean_d[:, None]) * rstd[:, None]


@triton.jit
def _mma(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b with fp32 accumulation.

    Under the interpreter (triton 3.9 on CPU) a bf16 tl.dot returns garbage (values ~1e10 on
    N(0, 1) inputs), so operands are widened there first: products of bf16 values are exact in
    fp32, so the result matches the GPU's bf16 tensor-core math up to summation order.
    """
    if PRECISION == "interpret":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _cast(x, dtype: tl.constexpr, PRECISION: tl.constexpr):
    """x.to(dtype) with round-to-nearest-even, as the GPU does.

    The interpreter truncates fp32 -> bf16 (twice the error, and biased), which would make the
    CPU tests measure the interpreter rather than the kernel; there the rounding is done on the
    bits first, so the truncating cast that follows is exact.
    """
    out = x.to(dtype)
    if PRECISION == "interpret":
        if dtype == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
            out = bits.to(tl.float32, bitcast=True).to(dtype)
    return out


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def check_triton_inputs(op: str, *tensors: torch.Tensor) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    for tensor in tensors:
        if tensor.device.type != "cuda" and not interpreted():
            raise RuntimeError(
                f"{op} with impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); "
                f"got a tensor on {tensor.device}. Use impl='torch' for the PyTorch path."
            )
        if tensor.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{op}: unsupported dtype {tensor.dtype}; use float32 or bfloat16")


@functools.lru_cache(maxsize=1)
def _config_table() -> dict[str, Any]:
    with open(_CONFIG_FILE) as handle:
        return json.load(handle)


_overrides: dict[tuple[str, str], dict[str, Any]] = {}


def _device_key() -> str:
    if interpreted():
        return "interpreter"
    return torch.cuda.get_device_name()


def kernel_config(op: str, kernel: str) -> dict[str, Any]:
    """Block sizes and launch options for one kernel, for the current GPU.

    Looks up configs/fused_ops.json under the device name, then "default". Values are block
    sizes and launch options, and for some kernels a strategy name (e.g. WEIGHT_GRADS).
    """
    table = _config_table()
    entry = table.get(_device_key(), table["default"])
    config = dict(table["default"][op][kernel])
    config.update(entry.get(op, {}).get(kernel, {}))
    config.update(_overrides.get((op, kernel), {}))
    return config


@contextlib.contextmanager
def override_config(op: str, kernel: str, **values: Any) -> Iterator[None]:
    """Temporarily replace block sizes of one kernel (used by the tuning sweep in benchmarks)."""
    previous = _overrides.get((op, kernel))
    _overrides[(op, kernel)] = {**(previous or {}), **values}
    try:
        yield
    finally:
        if previous is None:
            del _overrides[(op, kernel)]
        else:
            _overrides[(op, kernel)] = previous


def block_for(n: int) -> int:
    """Power-of-two tile covering n columns; tl.dot needs at least 16."""
    return max(16, triton.next_power_of_2(n))


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x in autocast's dtype when autocast is on for x's device and x is fp32, else x.

    Autocast does not reach inside a custom kernel, so without this an fp32 residual stream (the
    pair z, the single s) would send the kernels down their exact fp32 path, whose products skip
    the tensor cores; the torch path's nn.Linear would meanwhile compute in bf16. The cast is
    where autocast would put it: at the matrix product's input (normalization statistics are
    still accumulated in fp32 inside the kernels).
    """
    device_type = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        return x.to(torch.get_autocast_dtype(device_type))
    return x


def weights_like(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The matmul operands in x's dtype, as autocast does for nn.Linear: fp32 master weights
    beside bf16 activations would double the weight tiles (430 KB of shared memory at dim 384).
    Gradients still reach the parameters in their own dtype through the cast."""
    return tuple(w.to(x.dtype) for w in weights)


def fit_block_m(block_m: int, block_c: int, budget: int = 16384) -> int:
    """Shrink the row tile so that a [BLOCK_M, BLOCK_C] tile stays within a register budget."""
    return max(16, min(block_m, budget // block_c))


def max_channels_check(op: str, name: str, value: int, limit: int = 1024) -> None:
    # Kernels keep whole rows of this width in registers.
    if value > limit:
        raise ValueError(f"{op}: {name}={value} exceeds {limit}, the widest row the kernels hold")


def row_splits(n_row_blocks: int, n_col_blocks: int, device: torch.device) -> int:
    """Programs along rows for a weight-gradient kernel: enough to fill the GPU about twice."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 3  # interpreter: several splits so the strided row loop is exercised
    return max(1, min(n_row_blocks, math.ceil(target / n_col_blocks)))


def dot_precision(dtype: torch.dtype) -> str:
    if interpreted():
        return "interpret"
    # fp32 inputs get exact fp32 products (tf32 would miss the fp32 reference by ~1e-3).
    return "ieee" if dtype == torch.float32 else "tf32"
