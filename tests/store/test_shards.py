"""Sharded LMDB store: routing, batching, map growth, locking, crash safety, fork/spawn readers."""

import multiprocessing
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data

from featurecache.config import StoreConfig
from featurecache.store.codec import decode_record, encode_record
from featurecache.store.manifest import read_manifest
from featurecache.store.shards import (
    StoreLockedError,
    StoreReader,
    StoreWriter,
    shard_name,
    shard_of,
)
from tests.store._cache import (
    assert_record_matches,
    build_cache,
    init_reader_worker,
    read_in_worker,
    sample_arrays,
    sample_blob,
)

REPO = Path(__file__).resolve().parents[2]


def _seed() -> int:
    return random.randrange(1 << 30)


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_shard_of_is_stable_and_spreads_keys():
    # Pinned values: a change here would orphan every record of every existing cache.
    assert [shard_of(key, 7) for key in ("7a4d", "721p", "209d", "seq:ACDE")] == [2, 2, 0, 1]
    assert [shard_of(key, 1000) for key in ("7a4d", "721p")] == [833, 624]
    assert shard_of("7a4d", 1) == 0
    counts = np.bincount([shard_of(f"target-{i}", 4) for i in range(4000)], minlength=4)
    assert counts.min() > 850, counts


def test_put_get_keys_delete_round_trip(tmp_path):
    seed = _seed()
    keys = [f"t{i}" for i in range(40)]
    config = StoreConfig(num_shards=3, map_size_bytes=1 << 20, batch_records=7)
    with StoreWriter(tmp_path, config) as writer:
        for key in keys:
            blob, index = sample_blob(key, seed)
            writer.put("features", key, blob, index=index)
        writer.put("msa", "seq:AAA", b"msa bytes")
        # queued records are visible to the writer itself before they are committed
        assert_record_matches(writer.get_record("features", "t39"), "t39", seed)
        writer.delete("features", "t0")
        assert ("features", "t0") not in writer and ("features", "t1") in writer
        assert sorted(writer.keys("features")) == sorted(keys[1:])
        writer.put("features", "t1", sample_blob("t1", seed + 1)[0])  # rewrite without index
        writer.finish()
    reader = StoreReader(tmp_path)
    assert reader.num_shards == 3 and reader.count("features") == 39
    assert sorted(reader.keys("features")) == sorted(keys[1:])
    for key in keys[2:]:
        assert_record_matches(reader.get_record("features", key), key, seed)
        assert reader.where("features", key).startswith(str(tmp_path / shard_name(shard_of(key, 3))))
    assert_record_matches(reader.get_record("features", "t1"), "t1", seed + 1)
    assert reader.get("features", "t0") is None and reader.get_record("features", "t0") is None
    assert reader.get("msa", "seq:AAA") == b"msa bytes" and reader.get("errors", "t5") is None
    blobs = dict(reader.items("features"))
    assert set(blobs) == set(keys[1:]) and decode_record(blobs["t7"]).key == "t7"
    targets = read_manifest(tmp_path).targets
    assert "t0" not in targets and "t1" not in targets  # the stale index entry went with the rewrite
    assert targets["t5"]["shard"] == shard_of("t5", 3)
    assert targets["t5"]["num_tokens"] == sample_arrays("t5", seed)["msa"].shape[1]


def test_queued_records_are_committed_when_the_writer_exits(tmp_path):
    seed = _seed()
    config = StoreConfig(num_shards=2, batch_records=1000)  # nothing reaches a full batch
    with pytest.raises(KeyboardInterrupt):
        with StoreWriter(tmp_path, config) as writer:
            for key in ("a", "b", "c"):
                writer.put("features", key, sample_blob(key, seed)[0])
            raise KeyboardInterrupt  # an interrupted precompute keeps what it finished
    with StoreReader(tmp_path) as reader:
        assert sorted(reader.keys("features")) == ["a", "b", "c"]
        assert_record_matches(reader.get_record("features", "b"), "b", seed)
    with pytest.raises(ValueError, match="not finished"):
        read_manifest(tmp_path)


def test_bad_keys_tables_and_index_entries_are_refused(tmp_path):
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        with pytest.raises(ValueError, match="unknown table 'feature'"):
            writer.put("feature", "k", b"x")
        with pytest.raises(ValueError, match="non-empty str"):
            writer.put("features", "", b"x")
        with pytest.raises(ValueError, match="LMDB keys are at most 511"):
            writer.put("features", "k" * 600, b"x")
        with pytest.raises(ValueError, match="features/k: index entry .* is not plain JSON"):
            writer.put("features", "k", b"x", index={"num_tokens": float("nan")})
        with pytest.raises(ValueError, match="'shard' is reserved"):
            writer.put("features", "k", b"x", index={"shard": 3})


def test_map_grows_from_a_tiny_initial_size(tmp_path):
    seed = _seed()
    rng = np.random.default_rng(seed)
    # 1.5 MB records into a 64 KiB map: every batch needs the map to grow, some several times.
    big = {f"big{i}": rng.normal(size=(192_000,)).astype(np.float64) for i in range(6)}
    config = StoreConfig(num_shards=2, map_size_bytes=1 << 16, batch_records=2)
    with StoreWriter(tmp_path, config) as writer:
        for key, value in big.items():
            writer.put("features", key, encode_record(key, {"x": value}, {}, "fp", "ih", 1, zstd_level=0))
        writer.finish()
    reader = StoreReader(tmp_path)
    for key, value in big.items():
        np.testing.assert_array_equal(reader.get_record("features", key).arrays["x"], value)
    assert sum((tmp_path / shard_name(i)).stat().st_size for i in range(2)) > 6 * value.nbytes


def test_shard_count_must_match_existing_cache(tmp_path):
    build_cache(tmp_path, ["a", "b"], _seed(), num_shards=3)
    with pytest.raises(ValueError, match="created with 3 shards but StoreConfig.num_shards is 2"):
        StoreWriter(tmp_path, StoreConfig(num_shards=2))


def test_second_writer_fails_clearly_in_process_and_across_processes(tmp_path):
    config = StoreConfig(num_shards=2)
    with StoreWriter(tmp_path, config):
        with pytest.raises(StoreLockedError, match=f"being written by another writer \\(pid {os.getpid()}\\)"):
            StoreWriter(tmp_path, config)
        code = ("import sys\nfrom featurecache.config import StoreConfig\n"
                "from featurecache.store.shards import StoreWriter\n"
                "StoreWriter(sys.argv[1], StoreConfig(num_shards=2))\n")
        result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                                text=True, env=_child_env(), timeout=60)
        assert result.returncode != 0
        assert "StoreLockedError" in result.stderr and "one writer per shard" in result.stderr
        assert f"pid {os.getpid()}" in result.stderr
    # released on close: a new writer opens, and finds the records of the first
    with StoreWriter(tmp_path, config) as writer:
        writer.finish()


_KILLED_WRITER = r"""
import sys
from featurecache.config import StoreConfig
from featurecache.store.shards import StoreWriter
from tests.store._cache import sample_blob

cache_dir, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = StoreConfig(num_shards=2, map_size_bytes=1 << 16, batch_records=4)
with StoreWriter(cache_dir, config) as writer:
    for i in range(count):
        key = f"t{i:06d}"
        if writer.get("features", key) is None:  # resume: skip what a previous run committed
            blob, index = sample_blob(key, seed, num_tokens=300)
            writer.put("features", key, blob, index=index)
        if i == 12:
            print("writing", flush=True)
    writer.finish()
print("done", flush=True)
"""


def test_writer_killed_mid_write_leaves_whole_records_and_rerun_completes(tmp_path):
    seed = _seed()
    # far more records than it can write before the kill lands
    command = [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), str(seed), "1000000"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_child_env())
    assert child.stdout.readline().strip() == "writing"
    time.sleep(random.uniform(0.05, 0.4))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    with pytest.raises(ValueError, match="not finished"):
        read_manifest(tmp_path)
    with StoreReader(tmp_path) as reader:
        present = set(reader.keys("features"))
        count = max(int(key[1:]) for key in present) + 41
        keys = [f"t{i:06d}" for i in range(count)]
        for shard_index in range(2):
            in_order = [key for key in keys if shard_of(key, 2) == shard_index]
            committed = [key for key in in_order if key in present]
            # whole batches of whole records, in write order
            assert committed == in_order[: len(committed)] and len(committed) % 4 == 0
        for key in present:
            assert_record_matches(reader.get_record("features", key), key, seed, num_tokens=300)
    command[-1] = str(count)
    rerun = subprocess.run(command, capture_output=True, text=True, env=_child_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    manifest = read_manifest(tmp_path)
    assert manifest.counts["features"] == count and set(manifest.targets) == set(keys)
    with StoreReader(tmp_path) as reader:
        for key in keys:
            assert_record_matches(reader.get_record("features", key), key, seed, num_tokens=300)


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
    seed = _seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    assert_record_matches(reader.get_record("features", keys[0]), keys[0], seed)  # parent opened it
    loader = torch.utils.data.DataLoader(_FeatureDataset(reader, keys, seed), batch_size=None,
                                         num_workers=2, multiprocessing_context="fork")
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
    seed = _seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    reader.get_record("features", keys[0])
    context = multiprocessing.get_context("spawn")
    with context.Pool(2, initializer=init_reader_worker, initargs=(reader,)) as pool:
        results = pool.map(read_in_worker, [(key, seed) for key in keys])
    assert all(pid != os.getpid() for pid, _ in results)
    assert [msa_sum for _, msa_sum in results] == [
        int(sample_arrays(key, seed)["msa"].astype(np.int64).sum()) for key in keys]


def test_readers_in_one_process_share_environments(tmp_path):
    seed = _seed()
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
    seed = _seed()
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


def test_reader_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        StoreReader(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no shard-\\*.lmdb files"):
        StoreReader(tmp_path)
    build_cache(tmp_path / "c", ["a"], _seed(), num_shards=2)
    (tmp_path / "c" / shard_name(0)).rename(tmp_path / "c" / shard_name(5))
    with pytest.raises(ValueError, match="not numbered 0..1"):
        StoreReader(tmp_path / "c")
