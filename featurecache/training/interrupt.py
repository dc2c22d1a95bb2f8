"""Stopping a run gracefully on SIGINT (Ctrl-C) and SIGTERM (batch schedulers, torchrun's agent).

While a `StopRequest` is entered, the first of these signals only sets `requested`: the loop
(training/loop.py) finishes the step in flight, agrees with every rank on stopping there (the flag
rides on the step's all-reduce of its loss terms), writes a checkpoint and the weights file at
that step and raises `TrainingInterrupted`. The first signal also puts the previous handlers back,
so a second one acts as it did before: KeyboardInterrupt for SIGINT, termination for SIGTERM.
Leaving the context restores them as well. A time budget (--max-minutes) stops a run the same way,
but as a run that finished: no exception, exit 0. A signal the process ignores (SIG_IGN: a job started
in the background by a shell without job control) stays ignored, and outside the main thread,
where Python cannot set handlers, nothing is installed.

DataLoader workers ignore both signals (`ignore_stop_signals`, their worker_init_fn): a
terminal's Ctrl-C or a scheduler's kill reaches the whole process group, and a worker that died of
it would break the main process's next batch; the main process alone decides when to stop, and
its workers end with it (a SIGTERM from the main process itself, the DataLoader's terminate(),
still ends a worker).
"""

from __future__ import annotations

import math
import os
import signal
import threading
from time import monotonic
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context manager: handlers for `signals` that ask the run to stop (`requested`)."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS, max_minutes: float | None = None) -> None:
        self.signals = signals
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        # --max-minutes: the run's time budget, counted from entering (the loop's start)
        self.max_minutes = max_minutes
        self._deadline = math.inf

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def out_of_time(self) -> bool:
        return monotonic() >= self._deadline

    def flags(self) -> list[float]:
        """[a signal came, the time budget is spent], as numbers the ranks reduce."""
        return [float(self.requested), float(self.out_of_time)]

    def __enter__(self) -> StopRequest:
        if self.max_minutes is not None:
            self._deadline = monotonic() + 60.0 * self.max_minutes
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.signals:
            previous = signal.getsignal(signum)
            # SIG_IGN: ignored on purpose; None: a handler set outside Python, which could not be put back
            if previous not in (signal.SIG_IGN, None):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)
        self._restore()  # a second signal acts as it did before: stop now

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


class TrainingInterrupted(KeyboardInterrupt):
    """train() stopped on a signal after writing a checkpoint at `step`.

    A KeyboardInterrupt, as an interrupt was before (code that catches Exception lets it pass),
    with what the command line reports: `str()` is the line to print, `report` says whether this
    rank prints it (the main one), `exit_code` is 128 + the signal's number, as shells report a
    process a signal ended (130 for SIGINT, 143 for SIGTERM). `records`: the steps this rank took,
    what train() would have returned."""

    def __init__(
        self, received: signal.Signals | None, step: int, checkpoint: str, records: list[dict], report: bool
    ) -> None:
        # a rank the signal did not reach stops with the ranks it reached (a Ctrl-C, as it were)
        self.signal = received or signal.SIGINT
        cause = received.name if received is not None else "a signal to another rank"
        super().__init__(
            f"interrupted at step {step} ({cause}); checkpoint written to {checkpoint}; resume with --resume {checkpoint}"
        )
        self.step = step
        self.checkpoint = checkpoint
        self.records = records
        self.report = report

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signal)


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """A DataLoader worker_init_fn: the worker ignores SIGINT, and SIGTERM from anyone but its
    parent (see the module's note). A SIGTERM from the parent is the DataLoader's terminate() of a
    worker that did not finish its shutdown in time: the worker exits then, as PyTorch's own
    handler has it do (ignoring that one too would leave the parent's exit waiting on the worker
    for ever). SIGTERM is blocked in the worker's threads and taken by a watcher thread, the one
    place the sender's pid can be read."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it
    threading.Thread(target=_exit_on_terminate_from_parent, name="sigterm-watcher", daemon=True).start()


def _exit_on_terminate_from_parent() -> None:
    while True:
        received = signal.sigwaitinfo({signal.SIGTERM})
        if received.si_pid == os.getppid():
            os._exit(0)
