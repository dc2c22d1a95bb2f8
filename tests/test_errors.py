"""The CLI's error boundary (errors.py) on exceptions raised inside DataLoader worker processes.

torch re-raises a worker's exception in the trainer as a RuntimeError whose message is the
worker's whole traceback; the boundary must still print the original one line (exit 2), and keep
the --debug hint only for what is a bug. A worker that died of a signal (a crash in native code,
the out-of-memory killer, /dev/shm running out) is one line too, with what to try.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import time

import click
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader, Dataset

from featurecache.errors import EXIT_SETUP, BoundaryCommand, missing_ccd, worker_death
from featurecache.store.layout import ShardTruncatedError


class _Failing(Dataset):
    def __init__(self, error: Exception):
        self.error = error

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        raise self.error


def _command(error: Exception) -> click.Command:
    @click.command(cls=BoundaryCommand)
    def load():
        next(iter(DataLoader(_Failing(error), num_workers=1)))

    return load


@pytest.mark.parametrize(
    "error, line",
    [
        (
            ShardTruncatedError(pathlib.Path("/caches/c/shard-00001.lmdb"), 4096, 8192),
            "Error: /caches/c/shard-00001.lmdb: truncated to 4096 bytes, its pages reach byte 8192; "
            "`featurecache verify --repair /caches/c` sets it aside and says what to rerun",
        ),
        (
            FileNotFoundError(2, "No such file or directory", "/caches/c/manifest.json"),
            "Error: [Errno 2] No such file or directory: '/caches/c/manifest.json'",
        ),
        (
            ZeroDivisionError("division by zero"),
            "Error: unexpected ZeroDivisionError: division by zero (run again with --debug for the traceback)",
        ),
    ],
)
def test_a_worker_error_is_its_own_one_line(error, line):
    result = CliRunner().invoke(_command(error), [])
    assert result.exit_code == EXIT_SETUP, result.output
    assert result.output.strip() == line
    assert "Traceback" not in result.output


def test_debug_shows_the_workers_traceback():
    result = CliRunner().invoke(_command(ValueError("bad record")), ["--debug"])
    assert result.exit_code != 0 and "Original Traceback" in str(result.exception)


class _Dying(Dataset):
    """A worker that dies of `signum` (sent to itself) when it loads a sample, as a crash in native
    code (SIGSEGV), shared memory running out (SIGBUS) or the out-of-memory killer (SIGKILL) end one."""

    def __init__(self, signum: int):
        self.signum = signum

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        os.kill(os.getpid(), self.signum)
        time.sleep(30)  # the signal ends the process before this returns


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGKILL], ids=lambda signum: signum.name)
def test_a_worker_killed_by_a_signal_is_one_line_with_what_to_do(signum):
    """torch reports the death from its SIGCHLD handler (naming the signal) or from the batch wait
    ("exited unexpectedly"), whichever comes first: either is the one line."""

    @click.command(cls=BoundaryCommand)
    def load():
        next(iter(DataLoader(_Dying(signum), num_workers=1)))

    result = CliRunner().invoke(load, [])
    assert result.exit_code == EXIT_SETUP, result.output
    line = result.output.strip().splitlines()[-1]  # torch's own worker may print its "ERROR: ..." first
    assert re.fullmatch(r"Error: a data-loading worker process \(pid \d+\) died, .+; .+", line), line
    assert "Traceback" not in result.output and "--debug" not in line


@pytest.mark.parametrize(
    "message, line",
    [
        (  # torch's SIGCHLD handler, shared memory running out
            "DataLoader worker (pid 758) is killed by signal: Bus error. It is possible that dataloader's "
            "workers are out of shared memory. Please try to raise your shared memory limit.",
            "a data-loading worker process (pid 758) died, killed by signal: Bus error; its shared memory "
            "(/dev/shm) ran out: raise that limit (docker run --shm-size) or lower --num-workers or --prefetch-factor",
        ),
        (
            "DataLoader worker (pid 758) is killed by signal: Killed. ",
            "a data-loading worker process (pid 758) died, killed by signal: Killed; most likely the system's "
            "out-of-memory killer: lower --num-workers or --prefetch-factor",
        ),
        (
            "DataLoader worker (pid 758) is killed by signal: Segmentation fault. ",
            "a data-loading worker process (pid 758) died, killed by signal: Segmentation fault; --num-workers 0 "
            "loads in the main process, which shows whether loading alone fails",
        ),
        (  # torch's batch wait
            "DataLoader worker (pid(s) 758, 759) exited unexpectedly",
            "a data-loading worker process (pid 758, 759) died, exited unexpectedly; --num-workers 0 loads in "
            "the main process, which shows whether loading alone fails",
        ),
        ("Caught ValueError in DataLoader worker process 0.", None),
    ],
)
def test_each_way_torch_reports_a_dead_worker_has_its_line(message, line):
    assert worker_death(RuntimeError(message)) == line


def test_biotite_without_its_ccd_is_one_line_with_what_to_do():
    # biotite's own message when components.bcif is absent (seen with a repacked wheel on a GPU machine)
    error = RuntimeError("Internal CCD not found. Please run 'python -m biotite.setup_ccd'.")

    @click.command(cls=BoundaryCommand)
    def write():
        raise error

    result = CliRunner().invoke(write, [])
    assert result.exit_code == EXIT_SETUP, result.output
    assert result.output.strip() == f"Error: {missing_ccd(error)}"
    assert "components.bcif" in result.output and "unexpected" not in result.output
    assert missing_ccd(RuntimeError("CUDA out of memory")) is None
