"""Host-side helpers shared by every op: the kernel switch, where Triton can run, tuned block
configurations, launch checks and tile sizes.

The @triton.jit building blocks that the kernels share live in `primitives`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
from collections.abc import Container, Iterator
from typing import Any

import torch
import triton
import triton.runtime.errors

from featurecache.kernels.weight_casts import cast_weight

# The kernel switch, one name everywhere (modules, ModelConfig, the CLI's --kernels):
# "triton" runs the kernels of this package, "torch" the pure-PyTorch references.
KERNEL_CHOICES = ("triton", "torch")

CONFIG_DIR = pathlib.Path(__file__).resolve().parent / "configs"

# TRITON_INTERPRET values that mean "run the kernels on the CPU interpreter": the ones Triton
# itself reads as true (case-insensitive), so this package and Triton always agree.
_INTERPRET_VALUES = frozenset({"1", "true", "yes", "on", "y"})


def check_kernels(kernels: str) -> str:
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
    return kernels


def interpreted() -> bool:
    """True when TRITON_INTERPRET is 1, true, yes, on or y (any case): kernels run on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _INTERPRET_VALUES


def runs_triton(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of this device (CUDA, or the interpreter)."""
    return device.type == "cuda" or interpreted()


def check_triton_inputs(op: str, *tensors: torch.Tensor) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors under the interpreter."""
    for tensor in tensors:
        if not runs_triton(tensor.device):
            raise RuntimeError(
                f"{op} with kernels='triton' needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); "
                f"got a tensor on {tensor.device}. Use kernels='torch' for the PyTorch path."
            )
        if tensor.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{op}: unsupported dtype {tensor.dtype}; use float32 or bfloat16")


def dot_precision(dtype: torch.dtype) -> str:
    """The PRECISION argument of primitives.mma and primitives.cast for inputs of this dtype."""
    if interpreted():
        return "interpret"
    # fp32 inputs get exact fp32 products (tf32 would miss the fp32 reference by ~1e-3).
    return "ieee" if dtype == torch.float32 else "tf32"


# --------------------------------------------------------------------------------------------
# Tuned block configurations (configs/*.json), keyed by GPU name
# --------------------------------------------------------------------------------------------


def read_config_file(name: str) -> dict[str, Any]:
    with open(CONFIG_DIR / name) as handle:
        return json.load(handle)


# A GPU without tuned entries of its own runs those measured on the GPU named here for its SM
# architecture: the tiles depend on the SM (registers, shared memory, tensor cores), which the
# H100, H200 and GH200 share. Before 2026-12-06 an H100 fell back to the untuned defaults, whose
# Transition weight gradient ran ~8x under a GEMM's rate (benchmarks/NOTES.md section 11).
TUNED_FOR_ARCHITECTURE = {"sm_90": "NVIDIA H200"}


@functools.cache
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.cache
def _cuda_architecture(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _cuda_index(device: torch.device | None) -> int | None:
    """The CUDA device's index (None: the current one); None under the interpreter or off CUDA."""
    if interpreted() or (device is not None and device.type != "cuda"):
        return None
    return device.index if device is not None and device.index is not None else torch.cuda.current_device()


def gpu_name(device: torch.device | None = None) -> str | None:
    """The GPU's name (torch.cuda.get_device_name); None under the interpreter or off CUDA.

    device None means the current CUDA device."""
    index = _cuda_index(device)
    return None if index is None else _cuda_device_name(index)


def gpu_architecture(device: torch.device | None = None) -> str | None:
    """The GPU's SM architecture, e.g. "sm_90"; None under the interpreter or off CUDA."""
    index = _cuda_index(device)
    return None if index is None else _cuda_architecture(index)


def tuned_gpus(tuned: Container[str], device: torch.device | None = None) -> tuple[str, ...]:
    """The GPU names whose entries of a tuned-config table apply to this device, most specific
    first: its own, then the GPU measured for its architecture (TUNED_FOR_ARCHITECTURE), those
    that `tuned` has; () under the interpreter, off CUDA, or with neither in the table."""
    name = gpu_name(device)
    if name is None:
        return ()
    candidates = (name, TUNED_FOR_ARCHITECTURE.get(gpu_architecture(device)))
    return tuple(dict.fromkeys(gpu for gpu in candidates if gpu is not None and gpu in tuned))


def tuned_gpu(tuned: Container[str], device: torch.device | None = None) -> str | None:
    """The most specific of tuned_gpus, else the GPU's own name (no entry: the table's defaults);
    None under the interpreter or off CUDA."""
    return next(iter(tuned_gpus(tuned, device)), gpu_name(device))


@functools.lru_cache(maxsize=1)
def _fused_config_table() -> dict[str, Any]:
    return read_config_file("fused_ops.json")


_overrides: dict[tuple[str, str], dict[str, Any]] = {}


def kernel_config(op: str, kernel: str) -> dict[str, Any]:
    """Block sizes and launch options of one fused-op kernel, for the current GPU.

    configs/fused_ops.json in layers, each filling what the next leaves out: "default", the GPU
    measured for this one's architecture, this GPU's own entry (tuned_gpus; "interpreter" under
    the interpreter), then override_config's values. Values are block sizes and launch options,
    and for some kernels a strategy name (e.g. WEIGHT_GRADS).
    """
    table = _fused_config_table()
    layers = tuned_gpus(table)
    if not layers and gpu_name() is None:  # the interpreter (only then is the name asked twice)
        layers = ("interpreter",)
    config = dict(table["default"][op][kernel])
    for name in reversed(layers):
        config.update(table[name].get(op, {}).get(kernel, {}))
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


def tile_config(op: str, kernel: str, row_width: int, budget: int = 16384) -> tuple[dict[str, Any], int]:
    """kernel_config, and its BLOCK_M shrunk so that a [BLOCK_M, row_width] tile fits the budget."""
    config = kernel_config(op, kernel)
    return config, fit_block_m(config["BLOCK_M"], row_width, budget)


def weight_grads_by_matmul(op: str) -> bool:
    """The weight-gradient strategy of an op's bwd_dw: "matmul" (the dx kernel writes the operands,
    cuBLAS multiplies) rather than "recompute" (a Triton kernel recomputes them)."""
    return kernel_config(op, "bwd_dw").get("WEIGHT_GRADS", "recompute") == "matmul"


def launch_options(config: dict[str, Any]) -> dict[str, int]:
    """The keyword arguments of a kernel launch that a config entry holds besides block sizes."""
    return {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}


# (kernel, its arguments' sizes and launch options) -> the options that fit the GPU's shared memory
_FITTED_OPTIONS: dict[tuple, dict[str, Any]] = {}


def launch_fitting(kernel, grid: tuple, args: tuple, options: dict[str, Any], shrinkable: tuple[str, ...] = ()) -> None:
    """Launch `kernel[grid](*args, **options)`; when its compiled form needs more shared memory
    than the GPU has, retry with one pipeline stage, then with each block in `shrinkable` halved
    (never below 16; only blocks the grid and the outputs do not depend on), and remember what fit.

    The tuned configs bound tiles by element counts, which cannot foresee every width (a
    c = 256 transition needed 264 KiB of an H200's 227 KiB): this makes any width run. Triton
    raises before launching, so a retry repeats no work and writes nothing twice."""
    sizes = tuple(arg.shape if isinstance(arg, torch.Tensor) else arg for arg in args)
    key = (kernel, sizes, tuple(sorted(options.items())))
    fitted = _FITTED_OPTIONS.get(key, options)
    while True:
        try:
            kernel[grid](*args, **fitted)
        except triton.runtime.errors.OutOfResources:
            smaller = _smaller_options(fitted, shrinkable)
            if smaller is None:
                raise
            fitted = smaller
            continue
        _FITTED_OPTIONS[key] = fitted
        return


def _smaller_options(options: dict[str, Any], shrinkable: tuple[str, ...]) -> dict[str, Any] | None:
    if options.get("num_stages", 1) > 1:
        return {**options, "num_stages": 1}
    for name in shrinkable:
        if options[name] > 16:
            return {**options, name: options[name] // 2}
    return None


# --------------------------------------------------------------------------------------------
# Tile sizes and input preparation
# --------------------------------------------------------------------------------------------


def block_for(n: int) -> int:
    """Power-of-two tile covering n columns; tl.dot needs at least 16."""
    return max(16, triton.next_power_of_2(n))


def fit_block_m(block_m: int, block_c: int, budget: int = 16384) -> int:
    """Shrink the row tile so that a [BLOCK_M, BLOCK_C] tile stays within a register budget."""
    return max(16, min(block_m, budget // block_c))


def max_channels_check(op: str, name: str, value: int, limit: int = 1024) -> None:
    # Kernels keep whole rows of this width in registers.
    if value > limit:
        raise ValueError(f"{op}: {name}={value} exceeds {limit}, the widest row the kernels hold")


def readable_row_width(rows: torch.Tensor) -> int:
    """Columns a kernel may read in every row of a 2-D tensor with contiguous columns: its row
    stride when the gap between rows lies inside its storage (a view of a wider, aligned buffer),
    else its width. Kernels load up to it and zero the gap, so that their masks are multiples of
    16 and their loads stay vectors."""
    n_rows, width = rows.shape
    stride = rows.stride(0)
    if n_rows == 0 or stride <= width:
        return width
    end = (rows.storage_offset() + n_rows * stride) * rows.element_size()
    return stride if end <= rows.untyped_storage().nbytes() else width


def row_splits(n_row_blocks: int, n_col_blocks: int, device: torch.device) -> int:
    """Programs along rows for a weight-gradient kernel: enough to fill the GPU about twice."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 3  # interpreter: several splits so the strided row loop is exercised
    return max(1, min(n_row_blocks, math.ceil(target / n_col_blocks)))


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
    Gradients still reach the parameters in their own dtype through the cast. Within
    weight_casts.cached_weight_casts (a sampler's steps, no gradient) each is cast once."""
    return tuple(cast_weight(w, x.dtype) for w in weights)


def unaliased(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The tensors, each later one that shares memory with an earlier one cloned.

    A torch.library custom op may not return outputs that alias each other (Inductor would
    treat them as independent buffers); launchers return slices of one partial-sum buffer for
    small weight gradients."""
    seen: set[int] = set()
    result = []
    for tensor in tensors:
        storage = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if storage is not None and storage in seen:
            tensor = tensor.clone()
        elif storage is not None:
            seen.add(storage)
        result.append(tensor)
    return tuple(result)
