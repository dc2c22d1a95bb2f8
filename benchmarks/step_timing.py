"""Time and memory of one training step for benchmarks/train_step.py: device synchronisation,
peak-memory counters, bf16 autocast, and the median time of a step after warm-up.

Without a GPU the times are host-clock times and peak memory is NaN (the host allocator keeps no
peak statistics): enough to check the script on the CPU, not to quote.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")


def total_memory_gb(device: torch.device) -> float:
    return torch.cuda.get_device_properties(device).total_memory / 1e9 if device.type == "cuda" else float("inf")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def autocast(device: torch.device, cache: bool = True):
    # A captured step must not use autocast's cache of cast weights (its tensors outlive the graph).
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda", cache_enabled=cache)


def timed(step, device: torch.device, warmup: int, reps: int, graphs: bool = False) -> tuple[float, float]:
    """Median milliseconds of `step` after warm-up, and the peak memory (GB) of one call.

    A captured step allocates its memory once, during capture in the first warm-up call, and
    replays reuse it: for it (`graphs`) the peak counts from before the warm-up."""
    if graphs:
        reset_peak(device)
    for _ in range(warmup):
        step()
    sync(device)
    if not graphs:
        reset_peak(device)
    step()
    sync(device)
    peak = peak_gb(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), peak
