"""The CLI's error boundary (errors.py) on exceptions raised inside DataLoader worker processes.

torch re-raises a worker's exception in the trainer as a RuntimeError whose message is the
worker's whole traceback; the boundary must still print the original one line (exit 2), and keep
the --debug hint only for what is a bug.
"""

from __future__ import annotations

import pathlib

import click
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader, Dataset

from featurecache.errors import EXIT_SETUP, BoundaryCommand
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
