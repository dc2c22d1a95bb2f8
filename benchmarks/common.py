"""Shared timing and memory harness for the benchmark scripts.

Times are CUDA-event medians after warm-up (triton.testing.do_bench); memory is the peak the
call allocates above what was allocated before it (inputs excluded). Tables print as markdown
so that a run's output can be pasted into benchmarks/RESULTS.md unchanged.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch
import triton.testing

MIB = 1024 * 1024


def time_ms(
    fn: Callable[[], object],
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    grad_to_none: Optional[Sequence[torch.Tensor]] = None,
) -> float:
    """Median time of fn in milliseconds: CUDA events on a GPU, the host clock without one."""
    if torch.cuda.is_available():
        return float(
            triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median")
        )
    # Host fallback, used to smoke-test benchmark scripts on CPU machines: a few calls, median.
    samples = []
    for _ in range(3):
        for tensor in grad_to_none or ():
            tensor.grad = None
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def extra_peak_mib(fn: Callable[[], object]) -> float:
    """Peak memory fn allocates above what is already allocated, in MiB (one call, after a sync).

    NaN without a GPU: the host allocator keeps no peak statistics.
    """
    if not torch.cuda.is_available():
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak / MIB


def relative_error(value: torch.Tensor, truth: torch.Tensor) -> float:
    """||value - truth|| / ||truth|| in float64; NaN anywhere gives NaN."""
    value64 = value.detach().double()
    truth64 = truth.detach().double()
    return float((value64 - truth64).norm() / truth64.norm().clamp_min(1e-30))


def poison_allocator(mib: int = 1024) -> None:
    """Leave NaN in the caching allocator's free blocks so an unwritten output shows up as NaN."""
    if not torch.cuda.is_available():
        return
    block = torch.full((mib * MIB // 4,), float("nan"), device="cuda")
    del block


def git_commit() -> str:
    # The device machine gets a copy of the tree whose .git may lag behind: the caller names it.
    if os.environ.get("FC_COMMIT"):
        return os.environ["FC_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_header() -> str:
    """One line naming date, device, software versions and commit, for the top of a table."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    import triton

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{now}, {device}, torch {torch.__version__}, triton {triton.__version__}, commit {git_commit()}"


@dataclass
class Table:
    """A markdown table built row by row; cells are formatted when printed."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, cells: Iterable[object]) -> None:
        row = [format_cell(cell) for cell in cells]
        if len(row) != len(self.columns):
            raise ValueError(f"row has {len(row)} cells, table has {len(self.columns)} columns: {row}")
        self.rows.append(row)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def format_cell(cell: object) -> str:
    if cell is None:
        return "–"
    if isinstance(cell, float):
        if math.isnan(cell):
            return "nan"
        if cell == 0 or 1e-2 <= abs(cell) < 1e5:
            return f"{cell:.3g}" if abs(cell) < 100 else f"{cell:.0f}"
        return f"{cell:.2e}"
    return str(cell)
