"""Windowed attention's launch configuration: how many diffusion samples one program walks, the
backward's key block, and warps (a forward program holds a whole window). Nothing autotunes at
run time; benchmarks/window_attention.py times the alternatives."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton

from featurecache.kernels import runtime

# Programs per SM that keep an H200 busy with these small tiles (about 16 KB of registers each).
_PROGRAMS_PER_SM = 4
# The widest window a program holds in registers: [queries, keys] fp32 logits and their gradients.
MAX_WINDOW = 256


@dataclass(frozen=True)
class WindowConfig:
    """Samples per program (the bias tile is read once per program) and launch options."""

    samples_per_program: int
    num_warps: int = 4
    # The backward forms dQ, dK, dV and dS of a window in one program (and keeps dBias's
    # accumulator): at 4 warps ptxas spills ~2.4 KB per thread for 32 x 128 x 32 windows, at 8
    # ~1.1 KB (sm_90a, compiled on the CPU; the forward does not spill at 4).
    bwd_num_warps: int = 8
    num_stages: int = 1
    # 0: the one-pass backward (dQ, dK, dV, dS of a window in one program), which spills; else
    # the two-pass backward over key blocks of this many keys (a power of two, at least 16),
    # which does not at 64 (sm_90a, 8 warps). benchmarks/window_attention.py times both.
    key_block: int = 64


def block_sizes(queries: int, keys: int, head_dim: int) -> tuple[int, int, int]:
    """BLOCK_Q, BLOCK_K, BLOCK_D: powers of two, at least 16 (tl.dot's smallest operand)."""
    return runtime.block_for(queries), runtime.block_for(keys), runtime.block_for(head_dim)


_overrides: dict[str, int] = {}


@contextlib.contextmanager
def override_config(**fields: int) -> Iterator[None]:
    """Temporarily replace fields of every WindowConfig that select_config returns (benchmarks)."""
    previous = dict(_overrides)
    _overrides.update(fields)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(previous)


def select_config(windows_times_heads: int, samples: int, device: torch.device) -> WindowConfig:
    config = _heuristic_config(windows_times_heads, samples, device)
    return dataclasses.replace(config, **_overrides) if _overrides else config


def _heuristic_config(windows_times_heads: int, samples: int, device: torch.device) -> WindowConfig:
    """As many samples per program as keeps the GPU busy: fewer when there are few windows.

    Every program re-reads its bias tile, so fewer programs read less; but each SM needs a few
    programs in flight. Under the interpreter, 2 samples per program and key blocks of 16, so that
    tests with three or more samples and more than 16 keys cover several of each."""
    if runtime.gpu_name(device) is None:  # the interpreter, or not a CUDA device
        # Small groups and key blocks: test sizes then cover several of each.
        return WindowConfig(samples_per_program=2, key_block=16)
    sms = _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    groups = max(1, min(samples, triton.cdiv(_PROGRAMS_PER_SM * sms, max(1, windows_times_heads))))
    return WindowConfig(samples_per_program=triton.cdiv(samples, groups))


@functools.cache
def _multiprocessors(index: int) -> int:
    # Asked once per device: a property query on every launch would add host time to each call.
    return torch.cuda.get_device_properties(index).multi_processor_count
