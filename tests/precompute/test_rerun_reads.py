"""A rerun decides which feature records are current from their header entries, not the records.

py-lmdb touches every page of a value it gets, so reading each record's header from the record
mapped the whole cache into the driver on every rerun (and read it from disk: 56 GiB at PDB
scale). The rerun now reads each record's small header entry (store/layout.HEADER_TABLES);
tests/store/test_record_headers.py measures the pages that touches. Here every byte the rerun
decodes is counted where each decode starts, at the record checksum (codec.verify_checksum):
deterministic, unlike resident pages, whose granularity is the kernel's page-cache folios. Stale
records are still recomputed (test_pipeline.py's rerun test), and so is a damaged one that has
no header entry to stand for it.
"""

from __future__ import annotations

import lmdb
import pytest

from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.schema import FEATURES_TABLE
from featurecache.store import codec
from featurecache.store.layout import MAX_DBS, header_table, shard_name, shard_of
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from tests.conftest import copy_sample_structures

# Ras (721p) and its AlphaFold model: ~1.2 MB feature records (deep MSAs); 2q2k: a small one.
STRUCTURES = ("721p-assembly1.cif", "AF-P01112-F1-model_v4.cif.gz", "2q2k.cif")


@pytest.fixture
def finished_cache(tmp_path, shared_data):
    inputs = copy_sample_structures(STRUCTURES, tmp_path / "inputs")
    options = PrecomputeOptions(
        inputs=[inputs],
        cache_dir=tmp_path / "cache",
        alignments_dir=shared_data / "alignments",
        executor="inline",
        progress=False,
    )
    assert precompute(options).stages["featurize"].done == len(STRUCTURES)
    return options


def test_a_rerun_of_a_finished_cache_decodes_no_feature_record(finished_cache, monkeypatch):
    with StoreReader(finished_cache.cache_dir) as reader:
        record_bytes = sum(len(blob) for _, blob in reader.items(FEATURES_TABLE))
    decoded = []
    verify_checksum = codec.verify_checksum

    def counting_verify_checksum(blob, *args, **kwargs):
        decoded.append(memoryview(blob).nbytes)
        return verify_checksum(blob, *args, **kwargs)

    monkeypatch.setattr(codec, "verify_checksum", counting_verify_checksum)
    again = precompute(finished_cache)
    assert again.stages["featurize"].skipped == len(STRUCTURES) and again.stages["featurize"].done == 0
    assert 0 < sum(decoded) < record_bytes // 100, (
        f"the rerun decoded {sum(decoded)} bytes in {len(decoded)} decodes; the feature records hold {record_bytes}"
    )


def _damage(cache_dir, key: str, header: bool, record: bool) -> None:
    """Flip a byte of a feature record's header entry, or drop the entry and flip a byte of the
    record (a cache written before header entries, damaged since), through LMDB directly."""
    path = cache_dir / shard_name(shard_of(key, read_manifest(cache_dir).num_shards))
    env = lmdb.open(str(path), subdir=False, max_dbs=MAX_DBS)
    records, headers = env.open_db(FEATURES_TABLE.encode()), env.open_db(header_table(FEATURES_TABLE).encode())
    with env.begin(write=True) as txn:
        if header:
            entry = bytearray(txn.get(key.encode(), db=headers))
            entry[len(entry) // 2] ^= 0x55
            txn.put(key.encode(), bytes(entry), db=headers)
        if record:
            txn.delete(key.encode(), db=headers)
            blob = bytearray(txn.get(key.encode(), db=records))
            blob[len(blob) // 2] ^= 0x55
            txn.put(key.encode(), bytes(blob), db=records)
    env.close()


def test_a_rerun_recomputes_a_damaged_record_and_restores_a_damaged_header_entry(finished_cache):
    cache_dir = finished_cache.cache_dir
    _damage(cache_dir, "721p-assembly1", header=True, record=False)  # the record is intact: current
    _damage(cache_dir, "2q2k", header=False, record=True)
    assert not verify_cache(cache_dir).ok
    again = precompute(finished_cache)
    assert again.stages["featurize"].done == 1 and again.stages["featurize"].skipped == len(STRUCTURES) - 1
    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    with StoreReader(cache_dir) as reader:
        assert all(reader.header_entry(FEATURES_TABLE, key) is not None for key in reader.keys(FEATURES_TABLE))
