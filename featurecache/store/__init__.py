"""The feature store: record codec, sharded LMDB files, manifest, verification, publishing.

    codec     encode_record / decode_record (msgpack + numpy + zstd, CRC-32 checksum)
    shards    StoreWriter / StoreReader over N LMDB files (one writer per shard, lazy readers)
    manifest  manifest.json, written last and atomically; read_manifest validates it
    verify    verify_cache: every record decoded and checksummed, every shard file compared
    publish   publish / resolve_generation / gc: immutable generations on shared storage
"""

from featurecache.store.codec import CorruptRecordError, Record, decode_record, encode_record
from featurecache.store.manifest import CacheNotFinishedError, Manifest, read_manifest
from featurecache.store.publish import gc, publish, resolve_generation
from featurecache.store.shards import TABLES, StoreLockedError, StoreReader, StoreWriter
from featurecache.store.verify import VerifyReport, verify_cache

__all__ = [
    "TABLES",
    "CacheNotFinishedError",
    "CorruptRecordError",
    "Manifest",
    "Record",
    "StoreLockedError",
    "StoreReader",
    "StoreWriter",
    "VerifyReport",
    "decode_record",
    "encode_record",
    "gc",
    "publish",
    "read_manifest",
    "resolve_generation",
    "verify_cache",
]
