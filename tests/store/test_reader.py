"""StoreReader: fork and spawn workers, shared environments, pickling, errors naming the folder, LMDB's
reader table for local caches (snapshots that a writer cannot overwrite), sealed generations."""

import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data

from featurecache.config import StoreConfig
from featurecache.store.layout import shard_name, shard_of
from featurecache.store.publish import publish
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.store._cache import (
    assert_record_matches,
    build_cache,
    child_env,
    init_reader_worker,
    random_seed,
    read_in_worker,
    sample_arrays,
    sample_blob,
)


class _FeatureDataset(torch.utils.data.Dataset):
    def __init__(self, reader: StoreReader, keys: list[str], seed: int):
        self.reader, self.keys, self.seed = reader, keys, seed

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int):
        key = self.keys[index]
        record = self.reader.get_record("features", key)
        assert_record_matches(record, key, self.seed)
        return index, os.getpid(), int(record.arrays["msa"].astype(np.int64).sum())


def test_dataloader_fork_workers_reopen_the_parents_reader(tmp_path):
    seed = random_seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    assert_record_matches(reader.get_record("features", keys[0]), keys[0], seed)  # parent opened it
    loader = torch.utils.data.DataLoader(
        _FeatureDataset(reader, keys, seed), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    seen = {}
    for index, pid, msa_sum in loader:
        seen[int(index)] = int(msa_sum)
        assert int(pid) != os.getpid()
    assert seen == {i: int(sample_arrays(key, seed)["msa"].astype(np.int64).sum()) for i, key in enumerate(keys)}
    # the parent's own handles still work after its children used theirs
    assert_record_matches(reader.get_record("features", keys[-1]), keys[-1], seed)


def test_spawned_workers_read_through_a_pickled_reader(tmp_path):
    # What a spawn DataLoader does with the dataset's reader, without importing torch in the
    # workers (that alone takes seconds per worker on a busy CI machine).
    seed = random_seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    reader.get_record("features", keys[0])
    context = multiprocessing.get_context("spawn")
    with context.Pool(2, initializer=init_reader_worker, initargs=(reader,)) as pool:
        results = pool.map(read_in_worker, [(key, seed) for key in keys])
    assert all(pid != os.getpid() for pid, _ in results)
    assert [msa_sum for _, msa_sum in results] == [
        int(sample_arrays(key, seed)["msa"].astype(np.int64).sum()) for key in keys
    ]


def test_readers_in_one_process_share_environments(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a", "b"], seed)
    first, second = StoreReader(tmp_path), StoreReader(tmp_path)
    assert_record_matches(first.get_record("features", "a"), "a", seed)
    assert_record_matches(second.get_record("features", "a"), "a", seed)
    first.close()  # the second reader keeps its environments
    assert_record_matches(second.get_record("features", "b"), "b", seed)
    with pytest.raises(RuntimeError, match="open for reading in this process"):
        StoreWriter(tmp_path, StoreConfig(num_shards=3))
    second.close()
    with StoreWriter(tmp_path, StoreConfig(num_shards=3)) as writer:
        with pytest.raises(RuntimeError, match="open for writing in this process"):
            StoreReader(tmp_path).get("features", "a")
        assert writer.get("features", "a") is not None


def test_reader_pickles_without_handles_and_reopens_after_fork(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a", "b", "c"], seed)
    reader = StoreReader(tmp_path)
    reader.get_record("features", "a")
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._envs == {} and clone.num_shards == reader.num_shards
    assert_record_matches(clone.get_record("features", "b"), "b", seed)
    pid = os.fork()
    if pid == 0:  # child: must not use the parent's handles, and must read correctly
        try:
            record = reader.get_record("features", "c")
            os._exit(0 if record.key == "c" and reader._pid == os.getpid() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reader._pid == os.getpid()


_FORK_WHILE_OPEN = r"""
import os, sys
from featurecache.store.reader import StoreReader
cache, first, second = sys.argv[1:]
parent = StoreReader(cache)
assert parent.get_record("features", first).key == first
pid = os.fork()
if pid == 0:
    try:
        fresh = StoreReader(cache).get_record("features", second)
        inherited = parent.get_record("features", second)
        os._exit(0 if fresh.key == inherited.key == second else 1)
    except BaseException as error:
        print(error, file=sys.stderr, flush=True)
        os._exit(2)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "the child could not read the cache"
assert parent.get_record("features", second).key == second  # the parent's environment is intact
"""


def test_forked_child_opens_its_own_while_the_parent_holds_the_cache_open(tmp_path):
    # A training run validates in the parent (its reader stays open), then forks DataLoader
    # workers that build readers of their own: py-lmdb refuses a second Environment of a file in
    # one process, so the child must first discard the environments it inherited. A fresh
    # interpreter, as a user's process is: under pytest's own process the refusal did not show.
    seed = random_seed()
    build_cache(tmp_path, ["a", "b"], seed, num_shards=1)  # one file: the child meets the parent's
    result = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_OPEN, str(tmp_path), "a", "b"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:  # nothing was left holding it
        assert writer.get("features", "b") is not None


def test_reader_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        StoreReader(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no shard-\\*.lmdb files"):
        StoreReader(tmp_path)
    build_cache(tmp_path / "c", ["a"], random_seed(), num_shards=2)
    (tmp_path / "c" / shard_name(0)).rename(tmp_path / "c" / shard_name(5))
    with pytest.raises(ValueError, match="not numbered 0..1"):
        StoreReader(tmp_path / "c")


_HOLD_A_SNAPSHOT = r"""
import json, sys
from featurecache.store.codec import decode_record
from featurecache.store.reader import StoreReader

reader = StoreReader(sys.argv[1])
items = reader.items("features")  # one read transaction over the whole iteration
first = [next(items) for _ in range(5)]
print("holding", flush=True)
sys.stdin.readline()  # meanwhile a writer rewrites and deletes every record, many commits
seeds, problems = {}, []
for key, blob in [*first, *items]:
    try:
        seeds[key] = decode_record(blob, key=key).meta["seed"]
    except Exception as error:
        problems.append(f"{key}: {type(error).__name__}: {error}")
print(json.dumps({"seeds": seeds, "problems": problems}), flush=True)
"""


def test_a_local_readers_snapshot_survives_a_writer_rewriting_every_page(tmp_path):
    """LMDB's reader table: a writer must not reuse pages an open read transaction still sees.
    A reader opened without it (lock=False) reads whatever the writer put in the freed pages."""
    old_seed, new_seed = random_seed(), random_seed() + (1 << 30)
    keys = [f"t{i:03d}" for i in range(120)]
    build_cache(tmp_path, keys, old_seed, num_shards=1)
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_SNAPSHOT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout.readline().strip() == "holding"
        config = StoreConfig(num_shards=1, batch_records=8)
        with StoreWriter(tmp_path, config) as writer:
            for round_seed in (new_seed, new_seed + 1, new_seed + 2):
                for key in keys:
                    writer.delete("features", key)
                writer.flush()
                for key in keys:  # new sizes: freed pages are taken for other records
                    writer.put("features", key, *sample_blob(key, round_seed))
                writer.flush()
            writer.finish()
        child.stdin.write("go\n")
        child.stdin.flush()
        seen = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait(timeout=30)
    assert seen["problems"] == []
    assert seen["seeds"] == {key: old_seed for key in keys}  # the whole snapshot, as it was


_BIG_RECORDS = r"""
import sys
import numpy as np
from featurecache.config import StoreConfig
from featurecache.store.codec import encode_record
from featurecache.store.writer import StoreWriter

with StoreWriter(sys.argv[1], StoreConfig(num_shards=1)) as writer:
    for index in range(8):  # 32 MB: beyond the map a reader opened the 1 MiB shard with
        values = np.random.default_rng(index).normal(size=(500_000,))
        writer.put("features", f"big{index}", encode_record(f"big{index}", {"x": values}, {}, "fp", "ih", 1, 0))
    writer.finish()
"""


def test_readers_follow_a_map_a_writer_grew(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a"], seed, num_shards=1, map_size_bytes=1 << 20)
    with StoreReader(tmp_path) as reader:
        assert_record_matches(reader.get_record("features", "a"), "a", seed)
        result = subprocess.run(
            [sys.executable, "-c", _BIG_RECORDS, str(tmp_path)],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        for index in range(8):
            values = reader.get_record("features", f"big{index}").arrays["x"]
            np.testing.assert_array_equal(values, np.random.default_rng(index).normal(size=(500_000,)))


def test_sealed_shards_are_read_without_a_reader_table_and_never_written(tmp_path):
    seed = random_seed()
    cache = tmp_path / "cache"
    build_cache(cache, ["a", "b"], seed, num_shards=2)
    for lock_file in cache.glob("*.lmdb-lock"):
        lock_file.unlink()
    with StoreReader(cache) as reader:  # a local cache: its readers join the reader table
        assert_record_matches(reader.get_record("features", "a"), "a", seed)
        assert (cache / (shard_name(shard_of("a", 2)) + "-lock")).is_file()
    generation = publish(cache, tmp_path / "shared")
    with StoreReader(generation) as reader:  # sealed: read as is, nothing created beside it
        assert_record_matches(reader.get_record("features", "b"), "b", seed)
        assert_record_matches(reader.get_record("features", "a"), "a", seed)
    assert not list(generation.glob("*-lock"))
    with pytest.raises(ValueError, match="shard-00000.lmdb is read-only .*generations are never written"):
        StoreWriter(generation, StoreConfig(num_shards=2))


_READ_AS_NOBODY = r"""
import os, sys, tempfile
import lmdb
from featurecache.store.reader import StoreReader
# Load everything first: user nobody may not read this Python's files.
with tempfile.TemporaryDirectory() as warm_up:
    lmdb.open(warm_up).close()
os.setgid(65534)
os.setuid(65534)
with StoreReader(sys.argv[1]) as reader:
    print(reader.get_record("features", "a").key)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another user")
def test_a_reader_that_may_not_join_the_reader_table_warns_and_reads(tmp_path):
    cache = Path(tempfile.mkdtemp(prefix="fc-other-user-"))  # pytest's tmp_path is private to its owner
    try:
        os.chmod(cache, 0o755)
        build_cache(cache, ["a"], random_seed(), num_shards=1)
        result = subprocess.run(
            [sys.executable, "-c", _READ_AS_NOBODY, str(cache)],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=120,
        )
    finally:
        shutil.rmtree(cache)
    assert result.returncode == 0 and result.stdout.strip() == "a", result.stderr
    assert "cannot join LMDB's reader table" in result.stderr and "read a published generation" in result.stderr
