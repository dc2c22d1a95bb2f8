"""Header entries: each feature record's header kept apart, so a rerun decides whether a record is
current without reading it (py-lmdb touches every page of a value it gets).

The entries follow their records (put, re-put, delete, queued writes); a cache without them (written
before they existed) or with a damaged one is read from its records; verify names an entry that no
longer stands for its record. Pages touched are measured as this process's resident pages of the
shard files (tests/store/_pages.py), with a check that the measurement sees a full read.
"""

from __future__ import annotations

import os

import lmdb
import numpy as np
import pytest

from featurecache.config import StoreConfig
from featurecache.schema import FEATURES_TABLE
from featurecache.store.codec import CorruptRecordError, encode_record, header_entry
from featurecache.store.layout import MAX_DBS, header_table, shard_name
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._pages import mapped_bytes, needs_smaps

RECORDS = 32
MiB = 1 << 20


def _record(key: str, fingerprint: str = "fp-1", rows: int = 1024) -> bytes:
    """A feature-like record of `rows` KiB of incompressible arrays, with chain metadata."""
    arrays = {"msa": np.random.default_rng(len(key)).integers(0, 255, size=(rows, 1024), dtype=np.uint8)}
    meta = {"chain_ids": ["A"], "sequences": [key.upper()], "resolution": float("nan")}
    return encode_record(key, arrays, meta, fingerprint, f"input-of-{key}", 1, zstd_level=0)


def _build(folder, keys, rows: int = 1024) -> None:
    with StoreWriter(folder, StoreConfig(num_shards=1, batch_records=4)) as writer:
        for key in keys:
            writer.put(FEATURES_TABLE, key, _record(key, rows=rows), index={"num_tokens": 1})
        writer.finish()


def _raw_table(folder, table: str):
    """The shard's LMDB environment and one of its tables, opened directly (to damage or drop entries)."""
    env = lmdb.open(str(folder / shard_name(0)), subdir=False, max_dbs=MAX_DBS)
    return env, env.open_db(table.encode())


@needs_smaps
def test_headers_are_read_without_touching_the_records(tmp_path):
    keys = [f"t{number:02d}" for number in range(RECORDS)]
    _build(tmp_path / "cache", keys)
    with StoreWriter(tmp_path / "cache", StoreConfig(num_shards=1)) as writer:  # as a rerun opens it
        before = mapped_bytes(tmp_path)
        headers = [writer.header(FEATURES_TABLE, key) for key in keys]
        touched_by_writer = mapped_bytes(tmp_path) - before
        for key in keys:
            writer.get(FEATURES_TABLE, key)
        read_all = mapped_bytes(tmp_path) - before
    with StoreReader(tmp_path / "cache") as reader:
        reader.count(FEATURES_TABLE)  # opens the shard
        before = mapped_bytes(tmp_path)
        assert [reader.header(FEATURES_TABLE, key).fingerprint for key in keys] == ["fp-1"] * RECORDS
        touched_by_reader = mapped_bytes(tmp_path) - before
    assert [(header.key, header.input_hash, header.meta["sequences"]) for header in headers] == [
        (key, f"input-of-{key}", [key.upper()]) for key in keys
    ]
    assert read_all > RECORDS * MiB // 2, "the measurement does not see records read"
    # a quarter of the records: the kernel may map a whole large page-cache folio around a touched page
    for who, touched in (("writer", touched_by_writer), ("reader", touched_by_reader)):
        assert touched < RECORDS * MiB // 4, f"{RECORDS} headers touched {touched / MiB:.1f} MiB ({who})"


def _disk_read_bytes() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("read_bytes:"))


def _evict_page_cache(folder) -> None:
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="reads /proc/self/io (Linux)")
def test_a_writer_reads_headers_of_a_cold_cache_without_reading_ahead(tmp_path):
    """A rerun on another day: the shard files are not in the page cache. Each page fault of a
    map opened with readahead reads the device's read_ahead_kb around it (MiBs on some disks)."""
    keys = [f"t{number:02d}" for number in range(RECORDS)]
    _build(tmp_path / "cache", keys)
    _evict_page_cache(tmp_path / "cache")
    with StoreWriter(tmp_path / "cache", StoreConfig(num_shards=1)) as writer:
        before = _disk_read_bytes()
        assert all(writer.header(FEATURES_TABLE, key).key == key for key in keys)
        read = _disk_read_bytes() - before
    assert read < 2 * MiB, f"{RECORDS} header lookups read {read / MiB:.1f} MiB from disk"


def test_header_entries_follow_their_records(tmp_path):
    with StoreWriter(tmp_path, StoreConfig(num_shards=2, batch_records=100)) as writer:
        writer.put(FEATURES_TABLE, "a", _record("a", rows=1))
        assert writer.header(FEATURES_TABLE, "a").fingerprint == "fp-1"  # queued, not yet committed
        writer.flush()
        writer.put(FEATURES_TABLE, "a", _record("a", "fp-2", rows=1))
        writer.put(FEATURES_TABLE, "b", _record("b", rows=1))
        writer.put(FEATURES_TABLE, "c", _record("c", rows=1))
        writer.flush()
        writer.put(FEATURES_TABLE, "b", b"not a record")  # its old entry must not outlive it
        writer.delete(FEATURES_TABLE, "c")
        writer.finish()
    with StoreReader(tmp_path) as reader:
        assert reader.header(FEATURES_TABLE, "a").fingerprint == "fp-2"
        assert reader.header_entry(FEATURES_TABLE, "b") is None
        with pytest.raises(CorruptRecordError):
            reader.header(FEATURES_TABLE, "b")
        assert reader.header(FEATURES_TABLE, "c") is None and reader.header_entry(FEATURES_TABLE, "c") is None
        assert reader.header(FEATURES_TABLE, "missing") is None


def test_a_cache_without_header_entries_is_read_from_its_records_and_gets_them(tmp_path):
    """A cache written before header entries existed (the table dropped here) still answers; a
    writer that read a record whole writes its entry back, so the next run reads the entry."""
    _build(tmp_path, ["a", "b"], rows=4)
    env, headers = _raw_table(tmp_path, header_table(FEATURES_TABLE))
    with env.begin(write=True) as txn:
        txn.drop(headers, delete=True)
    env.close()
    with StoreReader(tmp_path) as reader:
        assert reader.header_entry(FEATURES_TABLE, "a") is None
        assert reader.header(FEATURES_TABLE, "a").input_hash == "input-of-a"
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        assert writer.header(FEATURES_TABLE, "b").meta["sequences"] == ["B"]
        writer.finish()
    with StoreReader(tmp_path) as reader:
        assert reader.header_entry(FEATURES_TABLE, "a") is None  # not asked for
        assert reader.header_entry(FEATURES_TABLE, "b") == header_entry(reader.get(FEATURES_TABLE, "b"))
    assert verify_cache(tmp_path).ok


def test_a_damaged_or_foreign_header_entry_defers_to_the_record_and_verify_names_it(tmp_path):
    _build(tmp_path, ["a", "b", "c"], rows=4)
    env, headers = _raw_table(tmp_path, header_table(FEATURES_TABLE))
    with env.begin(write=True) as txn:
        entry = bytearray(txn.get(b"a", db=headers))
        entry[len(entry) // 2] ^= 0xFF
        txn.put(b"a", bytes(entry), db=headers)  # fails its CRC
        txn.put(b"b", header_entry(_record("b", "fp-old", rows=1)), db=headers)  # stale
        txn.put(b"d", txn.get(b"c", db=headers), db=headers)  # no record
    env.close()
    with StoreReader(tmp_path) as reader:
        assert reader.header(FEATURES_TABLE, "a").input_hash == "input-of-a"  # read from the record
    damaged = {(record.table, record.key): record.reason for record in verify_cache(tmp_path).damaged}
    assert set(damaged) == {("header.features", "a"), ("header.features", "b"), ("header.features", "d")}
    assert "checksum" in damaged["header.features", "a"]
    assert "differs" in damaged["header.features", "b"] and "without a record" in damaged["header.features", "d"]
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:  # a damaged entry is written back whole
        assert writer.header(FEATURES_TABLE, "a").input_hash == "input-of-a"
        writer.finish()
    damaged = {(record.table, record.key) for record in verify_cache(tmp_path).damaged}
    assert damaged == {("header.features", "b"), ("header.features", "d")}
