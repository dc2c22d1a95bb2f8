"""What every benchmark script shares: the run's stamp, timing, memory, tables, the command line.

Times are CUDA-event medians after warm-up (triton.testing.do_bench) on a GPU, host-clock
medians without one (enough to check a script on the CPU, not to quote); memory is the peak a
call allocates above what was allocated before it (inputs excluded). Tables print as markdown,
so a run's output reads the same on the terminal and in benchmarks/RESULTS.md. Recording a run
(RESULTS.md and results.csv) is benchmarks/records.py.

Importing this module puts the repository root first on sys.path, so the scripts run from a
checkout (the GPU machine gets one) without installing the package, and measure that checkout's
package; FC_PACKAGE_ROOT names another checkout whose package to put there instead (tiny_step.py
--variant runs itself that way on an earlier checkout).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_ROOT = os.environ.get("FC_PACKAGE_ROOT") or str(REPO)
if sys.path[:1] != [PACKAGE_ROOT]:
    sys.path.insert(0, PACKAGE_ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

MIB = 1024 * 1024


# --- the run's stamp ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStamp:
    """When, where and on which code a run happened: the first columns of every recorded row."""

    date: str  # "2026-12-02 13:36 UTC"
    device: str  # the GPU's name, or "cpu (x86_64, 2 cores)"
    commit: str
    torch: str
    triton: str

    def header(self) -> str:
        """One line for the top of a table."""
        return f"{self.date}, {self.device}, torch {self.torch}, triton {self.triton}, commit {self.commit}"


def git_commit() -> str:
    # The GPU machine gets a copy of the tree whose .git may lag behind: the caller names it.
    if os.environ.get("FC_COMMIT"):
        return os.environ["FC_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def run_stamp() -> RunStamp:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return RunStamp(now, device_name(), git_commit(), torch.__version__, triton.__version__)


def train_command(args, out: pathlib.Path, *more: str) -> list[str]:
    """`featurecache train` as the benchmarks run it, the user's path: args.cache, .preset, .crop,
    .steps and .num_workers at N_cycle 1, a checkpoint only at the end, then `more` arguments."""
    return [
        sys.executable,
        "-m",
        "featurecache.cli",
        "train",
        "--cache",
        str(args.cache),
        "--out",
        str(out),
        "--preset",
        args.preset,
        "--crop-size",
        str(args.crop),
        "--steps",
        str(args.steps),
        "--max-recycling-cycles",
        "1",
        "--checkpoint-every",
        str(10**9),
        "--num-workers",
        str(args.num_workers),
        *more,
    ]


def training_loader(config, world):
    """The batches `featurecache train` feeds its step under this TrainConfig and world: the
    training set of config.cache, its sampler and, with fixed shapes, its padding buckets (one
    process, config.num_workers workers)."""
    from featurecache.training.buckets import padding_buckets
    from featurecache.training.data import build_datasets, make_batch_sampler, make_loader

    dataset, _ = build_datasets(config)
    sampler = make_batch_sampler(dataset, config, world)
    return make_loader(dataset, sampler, config, world.device, padding_buckets(config, dataset))


def train_steps(log: pathlib.Path) -> list[dict]:
    """The training-step lines of a run's log.jsonl, in step order."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return sorted((line for line in lines if line.get("kind") == "train"), key=lambda line: line["step"])


# How long a budgeted `featurecache train` may run past its --max-minutes before it is signalled:
# the step in flight, a validation due at it and the checkpoint (minutes at the af3 preset)
TRAIN_BUDGET_GRACE_S = 600.0


def run_budgeted_train(command: list[str], minutes: float, env: dict | None = None) -> tuple[float, bool]:
    """`featurecache train` COMMAND with `--max-minutes minutes` (it stops itself after the step that
    spends them, with a checkpoint there); SIGINT, then SIGKILL, only if it overruns by
    TRAIN_BUDGET_GRACE_S. Returns the seconds it took and whether the budget (not --steps) ended it;
    a failed run is a SystemExit."""
    start = time.monotonic()
    process = subprocess.Popen([*command, "--max-minutes", f"{minutes:g}"], start_new_session=True, env=env)
    try:
        process.wait(timeout=minutes * 60 + TRAIN_BUDGET_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return time.monotonic() - start, True
    seconds = time.monotonic() - start
    if process.returncode != 0:
        raise SystemExit(f"featurecache train failed with exit code {process.returncode}")
    return seconds, seconds >= minutes * 60


# --- the command line --------------------------------------------------------------------------


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, with the --record option every script has."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--record",
        action="store_true",
        help="append the run to benchmarks/RESULTS.md and its rows to benchmarks/results.csv, "
        "and refresh RESULTS.md's headline table",
    )
    return parser


# --- timing and memory -------------------------------------------------------------------------


def time_ms(
    fn: Callable[[], object],
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> float:
    """Median time of fn in milliseconds: CUDA events on a GPU, the host clock without one."""
    if torch.cuda.is_available():
        return float(
            triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median")
        )

    # Host fallback, used to smoke-test benchmark scripts on CPU machines: a few calls, median.
    def call():
        for tensor in grad_to_none or ():
            tensor.grad = None
        return fn()

    return host_median_ms(call, rounds=3)


def host_median_ms(fn: Callable[[], object], rounds: int) -> float:
    """Median host time of fn over `rounds` calls after one warm-up call (imports, page cache)."""
    fn()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def graph_ms(step: Callable[[], object], tensors: list[torch.Tensor]) -> float:
    """Median time of one CUDA-graph replay of step: GPU time without host launch overhead.

    `tensors` have their .grad cleared before each warm-up call and the capture. NaN without a
    GPU, or where step cannot be captured (the reason is printed).
    """
    if not torch.cuda.is_available():
        return float("nan")
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for tensor in tensors:
                    tensor.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for tensor in tensors:
            tensor.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return time_ms(graph.replay)
    except Exception as error:  # a peer that cannot be captured is reported, not fatal
        print(f"  graph capture failed: {type(error).__name__}: {str(error)[:160]}")
        return float("nan")


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


def poison_allocator(mib: int = 1024) -> None:
    """Leave NaN in the caching allocator's free blocks so an unwritten output shows up as NaN."""
    if not torch.cuda.is_available():
        return
    block = torch.full((mib * MIB // 4,), float("nan"), device="cuda")
    del block


# --- tables ------------------------------------------------------------------------------------


@dataclass
class Table:
    """A markdown table built row by row; cells are formatted when added."""

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
