"""One writer per shard: an exclusive flock on `<shard>.lock`, failing at once when taken.

A shard writer (and publish, while it copies the shard) holds the lock, so a second writer
gets StoreLockedError naming the holder's pid instead of interleaving its batches with the
first's. The kernel drops a flock when its holder dies, so a killed writer leaves no stale lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_SUFFIX = ".lock"


class StoreLockedError(RuntimeError):
    """Another process holds the writer lock of a shard."""


class ShardLock:
    """Exclusive, non-blocking flock on `<shard>.lock`; the kernel drops it if the holder dies."""

    def __init__(self, shard_path: str | os.PathLike):
        self.shard_path = Path(shard_path)
        self.path = self.shard_path.with_name(self.shard_path.name + LOCK_SUFFIX)
        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise StoreLockedError(
                    f"{self.shard_path} is being written by another writer ({holder}); "
                    f"one writer per shard at a time (lock {self.path})"
                ) from None
            raise
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")  # named in the error a second writer gets
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
