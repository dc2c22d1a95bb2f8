"""The feature store: records in sharded LMDB files, indexed by a manifest, published as generations.

    codec     encode_record / decode_record (msgpack + numpy + zstd, CRC-32 checksum)
    layout    shard file names, shard_of(key), the tables inside a shard, key and table checks
    locks     ShardLock: one writer per shard (StoreLockedError for a second)
    writer    StoreWriter / ShardWriter: batched, durable puts; finish() writes the manifest
    reader    StoreReader: lazy read-only shards, shared per process, safe across fork/spawn,
              registered in LMDB's reader table unless the files are sealed (published)
    manifest  manifest.json, written last and atomically; read_manifest validates it
    update_marker  update-in-progress.json: what the last finished manifest still means while an
              update runs or after one was interrupted (the manifest stays readable throughout)
    files     durable file writes (atomic text files, fsync of files and folders)
    verify    verify_cache: every record decoded and checksummed, every shard file compared
    repair    repair_cache (`verify --repair`): shard files rewritten or set aside, no record lost
    rewrite   rewrite_shard: a shard copied entry by entry into a fresh file that takes its place
    publish   publish / resolve_generation / gc: immutable generations on shared storage
    inspect   cache_stats / format_stats / format_record: the `stats` and `show` text reports
    plot      plot_stats: the `stats --plot` figure

Table names and record format versions are in featurecache.schema; this package uses that
and featurecache.config only.
"""

from featurecache.schema import TABLES
from featurecache.store.codec import CorruptRecordError, Record, decode_record, encode_record
from featurecache.store.locks import StoreLockedError
from featurecache.store.manifest import CacheNotFinishedError, Manifest, read_manifest
from featurecache.store.publish import gc, publish, resolve_generation
from featurecache.store.reader import StoreReader
from featurecache.store.verify import VerifyReport, verify_cache
from featurecache.store.writer import StoreWriter

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
