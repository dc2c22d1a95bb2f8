"""One writer per shard: a second writer fails at once, in this process or another."""

import os
import subprocess
import sys

import pytest

from featurecache.config import StoreConfig
from featurecache.store.locks import StoreLockedError
from featurecache.store.writer import StoreWriter
from tests.store._cache import child_env


def test_second_writer_fails_clearly_in_process_and_across_processes(tmp_path):
    config = StoreConfig(num_shards=2)
    with StoreWriter(tmp_path, config):
        with pytest.raises(StoreLockedError, match=f"being written by another writer \\(pid {os.getpid()}\\)"):
            StoreWriter(tmp_path, config)
        code = (
            "import sys\nfrom featurecache.config import StoreConfig\n"
            "from featurecache.store.writer import StoreWriter\n"
            "StoreWriter(sys.argv[1], StoreConfig(num_shards=2))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=child_env(), timeout=60
        )
        assert result.returncode != 0
        assert "StoreLockedError" in result.stderr and "one writer per shard" in result.stderr
        assert f"pid {os.getpid()}" in result.stderr
    # released on close: a new writer opens, and finds the records of the first
    with StoreWriter(tmp_path, config) as writer:
        writer.finish()
