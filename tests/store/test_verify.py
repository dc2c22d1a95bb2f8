"""verify_cache names every damaged record and shard, and raises only for an unreadable cache."""

import json
import random

import pytest

from featurecache.config import StoreConfig
from featurecache.store.codec import CorruptRecordError, pack_plain
from featurecache.store.layout import shard_name, shard_of
from featurecache.store.manifest import CacheNotFinishedError
from featurecache.store.update_marker import MARKER_NAME
from featurecache.store.reader import StoreReader
from featurecache.store.verify import DamagedRecord, verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._cache import sample_blob

NUM_SHARDS = 3


def _build(cache_dir, count: int, seed: int) -> list[str]:
    keys = [f"t{i:03d}" for i in range(count)]
    with StoreWriter(cache_dir, StoreConfig(num_shards=NUM_SHARDS, batch_records=16)) as writer:
        for key in keys:
            # 300 tokens: records of several kB live in LMDB overflow pages
            blob, index = sample_blob(key, seed, num_tokens=300)
            writer.put("features", key, blob, index=index)
        writer.put("msa", "seq:MKV", sample_blob("seq:MKV", seed)[0])
        writer.finish(fingerprints={"seed": str(seed)})
    return keys


def _flip_bytes_inside(cache_dir, key: str, rng: random.Random) -> None:
    """Flip one random byte of a stored record, wherever LMDB keeps a copy of it."""
    with StoreReader(cache_dir) as reader:
        blob = reader.get("features", key)
    path = cache_dir / shard_name(shard_of(key, NUM_SHARDS))
    data = bytearray(path.read_bytes())
    offset, flip = rng.randrange(len(blob)), rng.randrange(1, 256)
    position = data.find(blob)
    assert position >= 0
    while position >= 0:
        data[position + offset] ^= flip
        position = data.find(blob, position + 1)
    path.write_bytes(bytes(data))


def test_clean_cache_verifies(tmp_path):
    keys = _build(tmp_path, 20, random.randrange(1 << 30))
    report = verify_cache(tmp_path)
    assert report.ok, report.format()
    assert report.records_checked == {"msa": 1, "features": len(keys), "errors": 0, "conformers": 0}
    assert report.format().endswith("OK")
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True


def test_random_byte_flips_are_named_by_key_and_shard(tmp_path):
    rng = random.Random()
    keys = _build(tmp_path, 30, rng.randrange(1 << 30))
    damaged = sorted(rng.sample(keys, 4))
    for key in damaged:
        _flip_bytes_inside(tmp_path, key, rng)
    report = verify_cache(tmp_path)
    assert not report.ok
    assert report.records_checked["features"] == len(keys)
    assert sorted(record.key for record in report.damaged) == damaged
    for record in report.damaged:
        assert record == DamagedRecord(
            "features", record.key, shard_name(shard_of(record.key, NUM_SHARDS)), "checksum mismatch"
        )
    damaged_shards = {shard_name(shard_of(key, NUM_SHARDS)) for key in damaged}
    assert {problem.shard for problem in report.shard_problems} == damaged_shards
    assert all("sha256 is" in problem.reason for problem in report.shard_problems)
    text = report.format()
    assert all(f"features/{key} in {shard_name(shard_of(key, NUM_SHARDS))}" in text for key in damaged)
    # a reader refuses the same records, naming key and shard
    with StoreReader(tmp_path) as reader:
        with pytest.raises(
            CorruptRecordError,
            match=f"{shard_name(shard_of(damaged[0], NUM_SHARDS))}/features: record '{damaged[0]}' is damaged",
        ):
            reader.get_record("features", damaged[0])


def test_changed_missing_and_resized_shard_files_are_reported(tmp_path):
    keys = _build(tmp_path, 12, random.randrange(1 << 30))
    with open(tmp_path / shard_name(1), "ab") as handle:
        handle.write(b"\0" * 4096)
    (tmp_path / shard_name(2)).unlink()
    report = verify_cache(tmp_path)
    problems = {problem.shard: problem.reason for problem in report.shard_problems}
    assert problems[shard_name(2)] == "file is missing"
    assert problems[shard_name(1)].startswith("size is ")
    assert report.records_checked["features"] == sum(shard_of(key, NUM_SHARDS) in (0, 1) for key in keys)
    assert report.damaged == []


def test_records_removed_behind_the_manifests_back_are_reported(tmp_path):
    keys = _build(tmp_path, 12, random.randrange(1 << 30))
    removed = keys[5]
    with StoreWriter(tmp_path, StoreConfig(num_shards=NUM_SHARDS)) as writer:
        writer.delete("features", removed)
    (tmp_path / MARKER_NAME).unlink()  # no trace of the update that deleted it
    report = verify_cache(tmp_path)
    shard = shard_name(shard_of(removed, NUM_SHARDS))
    assert report.damaged == [DamagedRecord("features", removed, shard, "listed in the manifest but missing")]
    reasons = [problem.reason for problem in report.shard_problems if problem.shard == shard]
    assert any("table features has" in reason and "manifest says" in reason for reason in reasons)


def test_unreadable_caches_raise(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify_cache(tmp_path / "missing")
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        writer.put("errors", "x", b"unfinished")
    with pytest.raises(CacheNotFinishedError, match="not finished"):
        verify_cache(tmp_path)


def test_damaged_index_entries_are_reported(tmp_path):
    seed = random.randrange(1 << 30)
    keys = _build(tmp_path, 10, seed)
    # Damage an entry no other key shares byte for byte (two keys with the same MSA depth have
    # identical index entries, and the byte search below would damage both).
    entries = {key: pack_plain(sample_blob(key, seed, num_tokens=300)[1]) for key in keys}
    unique = [key for key, packed in entries.items() if list(entries.values()).count(packed) == 1]
    assert unique, f"seed {seed}: every index entry is shared"
    key = random.choice(unique)
    packed = entries[key]
    path = tmp_path / shard_name(shard_of(key, NUM_SHARDS))
    data = bytearray(path.read_bytes())
    position = data.find(packed)
    assert position >= 0
    while position >= 0:  # every copy LMDB keeps; the last byte belongs to the float weight
        data[position + len(packed) - 1] ^= 0x5A
        position = data.find(packed, position + 1)
    path.write_bytes(bytes(data))
    report = verify_cache(tmp_path)
    assert [(record.table, record.key) for record in report.damaged] == [("index.features", key)]
    assert "differs from the manifest's" in report.damaged[0].reason
