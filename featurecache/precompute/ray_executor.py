"""Running the units of work of `tasks`: as Ray tasks (a local Ray, or a cluster), or inline.

`TaskRunner` bounds the work in flight, so the driver's memory stays flat however many inputs
there are, and hands every finished result to a callback in the driver, the only process that
writes LMDB. A `TaskError` raised by a task is returned as its result (the driver records it);
a worker that dies is retried by Ray and, past the retries, reported to the crash callback.
"""

from __future__ import annotations

import logging

from featurecache.precompute.tasks import TaskError

RAY_TASK_RETRIES = 2  # for crashed workers only: a TaskError is a returned value, never retried


def start_ray(address: str | None, num_workers: int | None, verbose: bool = False):
    """The ray module, initialised: joining `address`, or a local Ray with `num_workers` CPUs.

    Quiet unless `verbose`: Ray's start-up banners and warnings, and what its workers print,
    stay out of the terminal (a task's failure still reaches the driver as its TaskError, a
    crashed worker through the crash callback). Ray's own errors (ConnectionError, ValueError,
    RuntimeError) propagate to the caller.
    """
    import ray

    if ray.is_initialized():
        return ray
    # ERROR also hides the warning a new local Ray gives on every start that it turned token
    # authentication on (it stays on: only the message goes).
    settings = {"logging_level": logging.INFO if verbose else logging.ERROR, "log_to_driver": verbose}
    if address:
        ray.init(address=address, **settings)
    else:
        ray.init(num_cpus=num_workers, include_dashboard=False, **settings)
    return ray


def returning_task_error(function, *args):
    """Task body: `function(*args)`, with a TaskError returned as the result instead of raised."""
    try:
        return function(*args)
    except TaskError as error:
        return error


class TaskRunner:
    """Submits tasks with a bound on work in flight; each finished one goes to a callback.

    `on_result(stage, key, result)` gets the function's return value or its TaskError;
    `on_crash(stage, key, error)` a worker that died even after Ray's retries. Each finished
    task advances `bar` by one. With `ray=None` tasks run inline, one after another.
    """

    def __init__(self, ray, max_in_flight: int, on_result, on_crash, bar) -> None:
        self.ray = ray
        self.max_in_flight = max_in_flight
        self.on_result = on_result
        self.on_crash = on_crash
        self.bar = bar
        self.pending: dict = {}  # ObjectRef -> (stage, key)
        self._remote = None

    def submit(self, stage: str, key: str, function, *args, num_cpus: int = 1) -> None:
        if self.ray is None:
            self._finished(stage, key, returning_task_error(function, *args))
            return
        if self._remote is None:
            self._remote = self.ray.remote(max_retries=RAY_TASK_RETRIES)(returning_task_error)
        while len(self.pending) >= self.max_in_flight:
            self._collect_one()
        self.pending[self._remote.options(num_cpus=num_cpus).remote(function, *args)] = (stage, key)

    def drain(self) -> None:
        """Wait for every submitted task, hand over its result, and close the bar."""
        while self.pending:
            self._collect_one()
        self.bar.close()

    def _collect_one(self) -> None:
        ready, _ = self.ray.wait(list(self.pending), num_returns=1)
        stage, key = self.pending.pop(ready[0])
        try:
            result = self.ray.get(ready[0])
        except Exception as error:  # the task's worker died even after its retries
            self.bar.update(1)
            self.on_crash(stage, key, error)
            return
        self._finished(stage, key, result)

    def _finished(self, stage: str, key: str, result) -> None:
        self.bar.update(1)
        self.on_result(stage, key, result)
