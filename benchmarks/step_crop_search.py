"""The largest crop that trains without running out of memory, per variant, for
benchmarks/train_step.py: where the search starts (--crop-start), then doubling and bisection in
multiples of --crop-step, bounded by time (a crop predicted to overrun is not tried)."""

from __future__ import annotations

import time

from step_budget import OutOfTime
from step_timing import total_memory_gb
from step_variants import TrunkRunner


def max_crop(
    runner: TrunkRunner, start: int, limit: int, msa_rows: int, templates: int, budget_s: float, step: int = 64
) -> dict:
    """Largest multiple of `step` in [start, limit] that trains: doubling, then bisection; when
    `start` itself runs out of memory, one step down at a time (a start is a guess near the
    limit). A trial the time budget stops (SIGALRM) ends the search with what it found."""
    deadline = time.perf_counter() + budget_s
    capacity_gb = total_memory_gb(runner.device)
    tried: list = []
    good = bad = stopped = None
    last_time = last_peak = 0.0

    def affordable(length: int) -> bool:
        if good is None:  # nothing fitted yet: the last trial's time is the estimate
            return time.perf_counter() + last_time < deadline
        # Peak memory grows at least as L² (the pair): past the device's memory the trial is a
        # sure OOM, and an OOM fails within the first oversized block, long before a full step.
        if last_peak * (length / good) ** 2 > capacity_gb:
            return True
        # compute is cubic in L (triangle updates)
        predicted = last_time * (length / good) ** 3
        return time.perf_counter() + predicted < deadline

    def trial(candidate: int) -> bool:
        """Train one iteration at `candidate` if time allows; False when it does not."""
        nonlocal good, bad, last_time, last_peak, stopped
        if stopped is not None or (tried and not affordable(candidate)):
            return False
        try:
            ok, last_time, peak = runner.fits(candidate, msa_rows, templates)
        except OutOfTime:
            stopped = candidate
            return False
        tried.append((candidate, ok))
        if ok:
            good, last_peak = candidate, peak
        else:
            bad = candidate
        return True

    trial(start)
    while good is None and bad is not None and bad - step >= step and trial(bad - step):
        pass
    while good is not None and bad is None and good < limit and trial(min(limit, good * 2)):
        pass
    while good is not None and bad is not None and bad - good > step and trial((good + bad) // 2 // step * step):
        pass
    exact = good is not None and bad is not None and bad - good <= step
    found = {"max_crop": good, "bound": "exact" if exact else ">=", "first_oom": bad, "tried": tried}
    if good is None:
        found["bound"] = "none fits"
    if stopped is not None:
        found["stopped_at"] = stopped  # the time budget ended this trial
    return found


def crop_start(args, variant: str) -> int:
    """Where `variant`'s crop search starts: its VARIANT=CROP item of --crop-start, else a plain
    CROP item, else the first --crop."""
    starts = dict(item.rpartition("=")[::2] for item in args.crop_start)
    return int(starts.get(variant, starts.get("", args.crop[0])))
