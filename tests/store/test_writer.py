"""StoreWriter: round trips, batching, map growth, shard-count checks, crash safety."""

import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from featurecache.config import StoreConfig
from featurecache.store.codec import decode_record, encode_record
from featurecache.store.layout import shard_name, shard_of
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.store._cache import (
    assert_record_matches,
    build_cache,
    child_env,
    random_seed,
    sample_arrays,
    sample_blob,
)


def test_put_get_keys_delete_round_trip(tmp_path):
    seed = random_seed()
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
    seed = random_seed()
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


def test_map_grows_from_a_tiny_initial_size(tmp_path):
    seed = random_seed()
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
    build_cache(tmp_path, ["a", "b"], random_seed(), num_shards=3)
    with pytest.raises(ValueError, match="created with 3 shards but StoreConfig.num_shards is 2"):
        StoreWriter(tmp_path, StoreConfig(num_shards=2))


_KILLED_WRITER = r"""
import sys
from featurecache.config import StoreConfig
from featurecache.store.writer import StoreWriter
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
    seed = random_seed()
    # far more records than it can write before the kill lands
    command = [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), str(seed), "1000000"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=child_env())
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
    rerun = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    manifest = read_manifest(tmp_path)
    assert manifest.counts["features"] == count and set(manifest.targets) == set(keys)
    with StoreReader(tmp_path) as reader:
        for key in keys:
            assert_record_matches(reader.get_record("features", key), key, seed, num_tokens=300)
