"""Where benchmarks/train_step.py's steps spend device time (--profile-block, --profile-step): the
top operators of one Pairformer block, and the forward time of each part of the full model."""

from __future__ import annotations

import pathlib
import statistics
import time

import torch
from step_timing import sync
from step_variants import FullModelRunner, block_step


def profile_block(variant: str, length: int, dims: dict, device: torch.device) -> dict:
    """Where one block's fwd+bwd spends device time: the top operators by their own CUDA time,
    and device time against wall time (a gap means the host, not the GPU, sets the pace)."""
    from torch.profiler import ProfilerActivity, profile

    step = block_step(variant, length, dims, device)
    for _ in range(3):
        step()
    sync(device)
    steps = 3
    start = time.perf_counter()
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    # Host time to enqueue one step (no sync inside it): when it is close to the wall time, the
    # host sets the pace and fewer launches, not faster kernels, would help.
    host_ms = []
    for _ in range(steps):
        sync(device)
        started = time.perf_counter()
        step()
        host_ms.append((time.perf_counter() - started) * 1e3)
    sync(device)
    own = (lambda e: e.self_device_time_total) if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    events = sorted((e for e in prof.key_averages() if own(e) > 0), key=own, reverse=True)
    device_ms = sum(own(e) for e in events) / 1e3 / steps
    kernels = sum(e.count for e in events) // steps
    top = [(e.key[:90], round(own(e) / 1e3 / steps, 3), e.count // steps) for e in events[:45]]
    print(
        f"    wall {wall_ms:.2f} ms, device {device_ms:.2f} ms, host enqueue {statistics.median(host_ms):.2f} ms,"
        f" {kernels} kernels per step",
        flush=True,
    )
    for name, ms, count in top:
        print(f"    {ms:8.3f} ms  x{count:<4d} {name}", flush=True)
    return {
        "wall_ms_profiled": wall_ms,
        "device_ms": device_ms,
        "host_enqueue_ms": statistics.median(host_ms),
        "kernels_per_step": kernels,
        "top": top,
    }


def profile_full_step(runner: FullModelRunner, batch: dict, device: torch.device, out: pathlib.Path) -> dict:
    """One profiled iteration after a warm one: forward time of each top-level part (CUDA events
    around each child module's calls) and the top CUDA operators (written to OUT/profile_step.txt)."""
    runner.iteration(batch)
    sync(device)
    spans: dict = {}
    handles = []
    for name, module in runner.model.named_children():

        def before(_module, _args, name=name):
            spans.setdefault(name, []).append(
                [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
            )
            spans[name][-1][0].record()

        def after(_module, _args, _output, name=name):
            spans[name][-1][1].record()

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=activities) as profiler:
        start.record()
        runner.iteration(batch)
        stop.record()
        sync(device)
    for handle in handles:
        handle.remove()
    averages = profiler.key_averages()
    text = averages.table(sort_by="cuda_time_total", row_limit=30)
    (out / "profile_step.txt").write_text(text)
    print(text, flush=True)
    device_ms = sum(e.self_device_time_total for e in averages) / 1e3
    forward = {
        name: {"ms": sum(a.elapsed_time(b) for a, b in calls), "calls": len(calls)} for name, calls in spans.items()
    }
    return {"wall_ms_profiled": start.elapsed_time(stop), "device_ms": device_ms, "forward_ms": forward}
