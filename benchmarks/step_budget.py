"""The time budget of a benchmarks/train_step.py run: each section runs only with enough time
left, a SIGALRM stops one that overruns, and a watchdog thread ends the process (with the table
of what was measured) where the alarm cannot interrupt the main thread."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Callable

import torch
from step_timing import free_memory


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()


class OutOfTime(Exception):
    pass


def _out_of_time(signum, frame):
    raise OutOfTime()


def run_section(results: dict, key: str, budget: Budget, reserve_s: float, function, *args) -> None:
    """Run one measurement; record its result, OOM, error, or the time budget that stopped it.

    A SIGALRM at the end of the budget interrupts a section that overruns (torch.compile can take
    minutes), so the run always ends with its table written.
    """
    if budget.left() < reserve_s:
        results[key] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
        print(f"[skip] {key}: time budget", flush=True)
        return
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, budget.left()))
    try:
        results[key] = function(*args)
    except OutOfTime:
        results[key] = {"skipped": f"stopped by the time budget after {time.perf_counter() - start:.0f} s"}
    except torch.cuda.OutOfMemoryError:
        results[key] = {"oom": True}
    except Exception as error:  # noqa: BLE001  (one broken variant must not lose the others' numbers)
        if budget.left() <= 1.0:  # the alarm, wrapped by the code it interrupted (dynamo does)
            results[key] = {"skipped": f"stopped by the time budget after {time.perf_counter() - start:.0f} s"}
        else:
            results[key] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    free_memory()
    print(f"[{time.perf_counter() - start:6.1f} s] {key}: {results[key]}", flush=True)


def start_watchdog(budget: Budget, on_expiry: Callable[[], None]) -> threading.Timer:
    """Call `on_expiry` from a daemon thread 20 s after the budget ends. SIGALRM cannot interrupt
    a main thread blocked in C (seen: torch.compile on the H200, run 1): `on_expiry` writes the
    table of what was measured and ends the process."""
    watchdog = threading.Timer(max(1.0, budget.left()) + 20.0, on_expiry)
    watchdog.daemon = True
    watchdog.start()
    return watchdog
