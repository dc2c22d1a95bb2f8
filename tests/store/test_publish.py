"""publish / resolve_generation / gc: immutable generations that readers can rely on."""

import multiprocessing
import os
import random
import stat
import time

import numpy as np
import pytest

from featurecache.config import StoreConfig, file_sha256
from featurecache.store.layout import shard_name
from featurecache.store.locks import ShardLock, StoreLockedError
from featurecache.store.manifest import MANIFEST_NAME, CacheNotFinishedError, read_manifest
from featurecache.store.publish import GENERATION_NAME, LATEST_NAME, gc, publish, resolve_generation
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._cache import assert_record_matches, build_cache, random_seed, sample_arrays, sample_blob


def _generations(dest) -> list[str]:
    return sorted(entry.name for entry in (dest / "generations").iterdir())


def test_publish_seals_a_read_only_generation_and_points_latest_at_it(tmp_path):
    seed, keys = random_seed(), [f"t{i}" for i in range(15)]
    cache, dest = tmp_path / "cache", tmp_path / "shared"
    source = build_cache(cache, keys, seed)
    generation = publish(cache, dest)
    assert generation.parent == dest / "generations" and GENERATION_NAME.match(generation.name)
    assert (dest / LATEST_NAME).read_text() == generation.name + "\n"
    assert resolve_generation(dest) == generation
    assert resolve_generation(generation) == generation and resolve_generation(cache) == cache
    assert sorted(entry.name for entry in generation.iterdir()) == [MANIFEST_NAME, *(shard_name(i) for i in range(3))]
    assert stat.S_IMODE(generation.stat().st_mode) == 0o555
    assert all(stat.S_IMODE(entry.stat().st_mode) == 0o444 for entry in generation.iterdir())
    sealed = read_manifest(generation)
    assert sealed.generation == generation.name
    assert (sealed.counts, sealed.index, sealed.fingerprints, sealed.created) == (
        source.counts,
        source.index,
        source.fingerprints,
        source.created,
    )
    for shard in sealed.shards:
        assert shard.sha256 == file_sha256(generation / shard.file)
    assert verify_cache(generation).ok
    with StoreReader(generation) as reader:
        for key in keys:
            assert_record_matches(reader.get_record("features", key), key, seed)


def test_published_shards_are_compacted(tmp_path):
    seed, keys = random_seed(), [f"t{i}" for i in range(30)]
    cache = tmp_path / "cache"
    build_cache(cache, keys, seed, num_shards=2)
    # rewriting every record leaves the old pages free inside the source files
    with StoreWriter(cache, StoreConfig(num_shards=2)) as writer:
        for key in keys:
            blob, index = sample_blob(key, seed + 1)
            writer.put("features", key, blob, index=index)
        writer.finish()
    generation = publish(cache, tmp_path / "shared")
    source_size = sum((cache / shard_name(i)).stat().st_size for i in range(2))
    sealed_size = sum((generation / shard_name(i)).stat().st_size for i in range(2))
    assert sealed_size < source_size
    with StoreReader(generation) as reader:
        for key in keys:
            assert_record_matches(reader.get_record("features", key), key, seed + 1)


def test_publish_refuses_unfinished_locked_or_changed_caches(tmp_path):
    cache, dest = tmp_path / "cache", tmp_path / "shared"
    with StoreWriter(cache, StoreConfig(num_shards=2)) as writer:
        writer.put("errors", "x", b"record")
    with pytest.raises(CacheNotFinishedError):
        publish(cache, dest)
    build_cache(cache, ["a", "b"], random_seed(), num_shards=2)
    lock = ShardLock(cache / shard_name(1))
    with pytest.raises(StoreLockedError, match="shard-00001.lmdb is being written"):
        publish(cache, dest)
    lock.release()
    with open(cache / shard_name(0), "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ValueError, match="cannot publish .*shard-00000.lmdb size is"):
        publish(cache, dest)
    assert _generations(dest) == [] and not (dest / LATEST_NAME).exists()


def test_gc_keeps_the_newest_and_the_one_latest_names(tmp_path):
    cache, dest = tmp_path / "cache", tmp_path / "shared"
    build_cache(cache, ["a", "b"], random_seed(), num_shards=1)
    published = [publish(cache, dest) for _ in range(4)]
    assert _generations(dest) == [path.name for path in published]
    (dest / LATEST_NAME).write_text(published[0].name + "\n")  # rolled back to the oldest
    stale, fresh = dest / "generations" / ".tmp-stale", dest / "generations" / ".tmp-running"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (time.time() - 3 * 86400,) * 2)
    assert gc(dest, keep=2) == [published[1]]
    assert _generations(dest) == [".tmp-running", *(path.name for path in (published[0], *published[2:]))]
    assert resolve_generation(dest) == published[0] and verify_cache(published[0]).ok
    assert gc(dest, keep=2) == []
    with pytest.raises(ValueError, match="keep must be >= 1"):
        gc(dest, keep=0)
    with pytest.raises(ValueError, match="not a publish root"):
        gc(cache)


def test_resolve_generation_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        resolve_generation(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a cache, a generation or a publish root"):
        resolve_generation(tmp_path)
    (tmp_path / LATEST_NAME).write_text("../../etc\n")
    with pytest.raises(ValueError, match="which is not a generation name"):
        resolve_generation(tmp_path)
    (tmp_path / LATEST_NAME).write_text("20261202T110140.816556Z-60a489de\n")
    with pytest.raises(ValueError, match="has no manifest.json"):
        resolve_generation(tmp_path)
    with StoreWriter(tmp_path / "cache", StoreConfig(num_shards=1)):
        pass
    with pytest.raises(CacheNotFinishedError):
        resolve_generation(tmp_path / "cache")


def _reader_process(dest, keys, barrier, results, reads: int) -> None:
    errors, seen, expected = [], set(), {}
    rng = random.Random()
    reader, current = None, None
    for step in range(reads):
        try:
            if step % 100 == 0:  # follow LATEST now and then, as a long training job would on restart
                generation = resolve_generation(dest)
                if generation != current:
                    if reader is not None:
                        reader.close()
                    reader, current = StoreReader(generation), generation
                    seed = int(read_manifest(generation).fingerprints["seed"])
                    seen.add(generation.name)
            key = rng.choice(keys)
            record = reader.get_record("features", key)
            if (key, seed) not in expected:
                expected[key, seed] = sample_arrays(key, seed)
            assert record.key == key and record.meta["seed"] == seed
            for name, value in expected[key, seed].items():
                np.testing.assert_array_equal(record.arrays[name], value, err_msg=f"{key}/{name}")
        except Exception as error:  # counted, not raised: the parent reports all of them
            errors.append(f"{type(error).__name__}: {error}")
        if step == 0:
            barrier.wait()  # every reader holds the old generation before publishing starts
    results.put((errors, sorted(seen)))


def test_readers_of_old_generations_keep_working_while_new_ones_are_published(tmp_path):
    keys = [f"t{i}" for i in range(40)]
    dest = tmp_path / "shared"
    caches = {}
    for name in ("a", "b"):
        caches[name] = tmp_path / name
        build_cache(caches[name], keys, random_seed(), num_shards=2)
    first = publish(caches["a"], dest)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(9), context.Queue()
    readers = [context.Process(target=_reader_process, args=(dest, keys, barrier, results, 1000)) for _ in range(8)]
    for process in readers:
        process.start()
    barrier.wait(timeout=120)
    published = [publish(caches[name], dest) for name in ("b", "a", "b")]
    outcomes = [results.get(timeout=300) for _ in readers]
    for process in readers:
        process.join(timeout=60)
        assert process.exitcode == 0
    errors = [error for reader_errors, _ in outcomes for error in reader_errors]
    assert errors == []
    assert all(first.name in seen for _, seen in outcomes)
    assert resolve_generation(dest) == published[-1]
    assert gc(dest, keep=1) == [first, *published[:2]]
    assert _generations(dest) == [published[-1].name]
