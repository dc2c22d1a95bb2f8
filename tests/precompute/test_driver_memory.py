"""The precompute driver's last steps, clustering and the manifest, must not grow its memory
with the cache beyond the manifest's own index.

Clustering lists the cache's feature keys (sampling_index.py). py-lmdb's cursor touches every
page of each value it passes, so listing the features table itself mapped every record into the
driver: its RSS grew by the cache's size (1.8 -> 3.8 GiB from 5k to 20k targets in
benchmarks/precompute_scale.py). The writer lists keys from the table's index instead. These
tests measure the shard file's resident pages in this process (/proc/self/smaps), and check that
the measurement sees a full read, so they can fail. Writing the manifest is measured with
tracemalloc.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

from featurecache.config import StoreConfig
from featurecache.schema import FEATURES_TABLE
from featurecache.store.layout import shard_name
from featurecache.store.manifest import MANIFEST_NAME, read_manifest, write_manifest
from featurecache.store.writer import StoreWriter
from tests.store._pages import mapped_bytes, needs_smaps

RECORDS = 24
RECORD_BYTES = 1 << 20  # large records: LMDB keeps each on its own overflow pages
MiB = 1 << 20

pytestmark = needs_smaps


def _write_cache(folder: Path, with_index: bool = True) -> StoreWriter:
    writer = StoreWriter(folder, StoreConfig(num_shards=1, batch_records=4))
    for number in range(RECORDS):
        index = {"num_tokens": number} if with_index or number else None  # record 0 lacks its entry
        writer.put(FEATURES_TABLE, f"target{number:03d}", os.urandom(RECORD_BYTES), index=index)
    writer.flush()
    return writer


def test_listing_feature_keys_reads_no_records(tmp_path):
    writer = _write_cache(tmp_path / "cache")
    try:
        before = mapped_bytes(tmp_path)
        keys = writer.keys(FEATURES_TABLE)
        listed = mapped_bytes(tmp_path) - before
        for key in keys:  # what listing the records table did: every record's pages
            writer.get(FEATURES_TABLE, key)
        read_all = mapped_bytes(tmp_path) - before
    finally:
        writer.close()
    assert keys == [f"target{number:03d}" for number in range(RECORDS)]
    assert read_all > RECORDS * RECORD_BYTES // 2, "the measurement does not see records read"
    assert listed < 4 * MiB, f"listing {RECORDS} keys mapped {listed / MiB:.1f} MiB of records"


def test_keys_of_records_without_index_entries_are_all_listed(tmp_path):
    """A record put without an index entry: the index does not name every key, so the table
    itself is listed (correct, just slower)."""
    writer = _write_cache(tmp_path / "cache", with_index=False)
    try:
        keys = writer.keys(FEATURES_TABLE)
        writer.delete(FEATURES_TABLE, "target005")
        after_delete = writer.keys(FEATURES_TABLE)
    finally:
        writer.close()
    assert keys == [f"target{number:03d}" for number in range(RECORDS)]
    assert after_delete == [key for key in keys if key != "target005"]


def _index_entries(count: int) -> tuple[list[dict], dict]:
    """Shard summaries and a sampling table shaped like a precompute run's (benchmarks/precompute_scale.py)."""
    summaries = [{"counts": {FEATURES_TABLE: 0}, "index": {FEATURES_TABLE: {}}} for _ in range(4)]
    sampling = {}
    for number in range(count):
        key, cluster = f"scale{number:06d}", f"protein:{number:012x}"
        summaries[number % 4]["index"][FEATURES_TABLE][key] = {
            "num_tokens": 150 + number % 11,
            "num_atoms": 1200,
            "msa_depth": 2048,
            "num_templates": 0,
            "num_chains": 1,
            "warnings": 0,
            "template_hits_without_coordinates": 0,
            "curation": {},
            "fingerprint": "b42c750962a716bb",
            "input_hash": f"{number:064x}",
        }
        sampling[key] = {
            "weight": 1.5,
            "interfaces": [],
            "chains": [{"chain_id": "A", "asym_id": 1, "molecule_type": "protein", "cluster": cluster, "weight": 1.5}],
        }
    return summaries, sampling


def test_writing_the_manifest_streams_it(tmp_path):
    """The manifest of N targets is written without holding copies of its index or its whole
    text: json.dumps of the dataclasses.asdict copy peaked at 6.8 KiB of Python heap per target
    (0.7 KiB of JSON each), streaming at 0.75."""
    count = 3000
    for shard_index in range(4):
        (tmp_path / shard_name(shard_index)).write_bytes(b"shard")
    summaries, sampling = _index_entries(count)
    tracemalloc.start()
    try:
        manifest = write_manifest(tmp_path, summaries, {"features": "f"}, derived_index={"sampling": sampling})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = (tmp_path / MANIFEST_NAME).read_text()
    assert text == json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n"  # the format is unchanged
    assert read_manifest(tmp_path).targets["scale000007"]["weight"] == 1.5
    assert peak / count < 2048, f"writing the manifest peaked at {peak / count:.0f} bytes of heap per target"
