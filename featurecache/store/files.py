"""Durable file writes: when a call returns, the change is on disk.

Manifests, LATEST, published shard copies and training checkpoints go through here, so a crash
at any moment leaves the old state or the new one, never a partial file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_file(path: Path) -> None:
    """Flush a file's contents to disk (e.g. a copy made by another library)."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never a partial one, even across a crash."""
    write_atomic(path, lambda handle: handle.write(text))


def write_atomic(path: Path, write: Callable[[IO], object], binary: bool = False) -> None:
    """write_text_atomic for what `write(handle)` writes in pieces: a large JSON document streamed
    by json.dump (never held whole in memory), or with `binary` bytes (a torch.save checkpoint)."""
    path = Path(path)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, 0o644)  # mkstemp creates 0600; a cache is shared with trainers
        os.replace(temp_name, path)
    except BaseException:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: Path):
    """A temporary name beside `path`, with its suffix (matplotlib picks the format by it), for
    the block to write; renamed to `path` when the block ends, removed if it raises. An output
    is then either whole or absent, never a half-written file that looks finished."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.partial{path.suffix}")
    try:
        yield temp
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
