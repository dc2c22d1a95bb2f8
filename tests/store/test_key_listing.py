"""Listing a table's keys reads its index, not its records.

py-lmdb's cursor touches every page of each value it passes (it preloads values even when asked
for keys only), so `verify`-style scans are the only readers that should touch every record.
These tests build a cache of large random records (LMDB keeps each on its own overflow pages),
then measure how much of the shard file listing the keys made resident in this process, and
check that the measurement does see a full read, so they can fail. The bound is a quarter of the
records: the kernel may map a whole large page-cache folio (up to MiBs) around a touched page.
"""

from __future__ import annotations

import os
from pathlib import Path

from featurecache.config import StoreConfig
from featurecache.schema import FEATURES_TABLE, MSA_TABLE
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.store._pages import mapped_bytes, needs_smaps

RECORDS = 24
RECORD_BYTES = 1 << 20
MiB = 1 << 20

pytestmark = needs_smaps


def _build(folder: Path, indexed: bool) -> list[str]:
    keys = [f"target{number:03d}" for number in range(RECORDS)]
    with StoreWriter(folder, StoreConfig(num_shards=2, batch_records=4)) as writer:
        for number, key in enumerate(keys):
            writer.put(FEATURES_TABLE, key, os.urandom(RECORD_BYTES), index={"num_tokens": number} if indexed else None)
            writer.put(MSA_TABLE, f"msa-{key}", b"small record")
        writer.finish()
    return keys


def test_reader_lists_keys_without_reading_records(tmp_path):
    keys = _build(tmp_path / "cache", indexed=True)
    with StoreReader(tmp_path / "cache") as reader:
        assert reader.count(FEATURES_TABLE) == RECORDS  # opens every shard: their meta pages are not counted
        before = mapped_bytes(tmp_path)
        listed = sorted(reader.keys(FEATURES_TABLE))
        touched = mapped_bytes(tmp_path) - before
        for key in keys:
            reader.get(FEATURES_TABLE, key)
        read_all = mapped_bytes(tmp_path) - before
    assert listed == keys
    assert read_all > RECORDS * RECORD_BYTES // 2, "the measurement does not see records read"
    assert touched < RECORDS * RECORD_BYTES // 4, (
        f"listing {RECORDS} keys touched {touched / MiB:.1f} MiB of the shard files"
    )


def test_keys_of_a_table_without_a_full_index_are_all_listed(tmp_path):
    """Records without index entries (and a table that has none, msa): the records are listed."""
    keys = _build(tmp_path / "cache", indexed=False)
    with StoreWriter(tmp_path / "cache", StoreConfig(num_shards=2)) as writer:
        writer.put(FEATURES_TABLE, keys[0], b"re-put with an entry", index={"num_tokens": 1})
        writer.finish()
    with StoreReader(tmp_path / "cache") as reader:
        assert sorted(reader.keys(FEATURES_TABLE)) == keys
        assert sorted(reader.keys(MSA_TABLE)) == [f"msa-{key}" for key in keys]
