"""What a cache folder holds on disk: shard file names, which shard a key lives in, the tables
inside a shard, and the checks on table names, keys, index entries and a shard's meta entry.

Layout of a cache folder::

    shard-00000.lmdb        LMDB data file (subdir=False: one file per shard, so copying,
    shard-00000.lmdb-lock   checksumming and publishing handle plain files); the -lock file is
    shard-00000.lmdb.lock   LMDB's reader table, the .lock file is our one-writer flock (locks.py)
    ...
    manifest.json           written last by StoreWriter.finish; its presence marks a finished cache

A key's shard is blake2b(key) mod N, so any process finds a record without an index. Every
shard holds the tables in featurecache.schema.TABLES, one index table per table (small plain
entries the loader needs, such as num_tokens, written in the same transaction as the record),
one header table per table of HEADER_TABLES (each record's header without its arrays, a small
checksummed record of its own, also written with the record: a rerun reads it to decide whether
the record is current without reading the record; shards written before header tables existed
lack their entries, and readers then read the record) and a "meta" table whose one entry
records the shard's number, the shard count and STORE_FORMAT. open_shard and read_shard_meta
are the two steps writer and reader share.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lmdb

from featurecache.schema import FEATURES_TABLE, TABLES
from featurecache.store.codec import unpack_plain

STORE_FORMAT = 1  # layout of the shard files (tables, meta entry); the manifest names it
SHARD_PATTERN = re.compile(r"^shard-(\d{5})\.lmdb$")

META_TABLE = "meta"
SHARD_META_KEY = b"shard"  # the meta table's one entry
MAX_DBS = 16  # 4 tables (schema.TABLES) + 4 index + 1 header table + meta, with room for new tables
_MAX_KEY_BYTES = 511  # LMDB's compiled-in key size limit


def shard_name(shard_index: int) -> str:
    return f"shard-{shard_index:05d}.lmdb"


def shard_of(key: str, num_shards: int) -> int:
    """Stable shard of a key: the same in every process and Python version (unlike hash())."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def has_shard_files(folder: Path) -> bool:
    return any(SHARD_PATTERN.match(entry.name) for entry in folder.iterdir())


def refuse_output_in_cache(option: str, output: str | Path, cache: str | Path | None = None) -> None:
    """ValueError naming `option` and the cache when a command's output (a file or folder, existing
    or not) is, or lies inside, the cache `cache` (as given: a cache folder, generation or publish
    root) or any cache folder (one holding shard 0): outputs written there would mix with the
    cache's own files, or overwrite them."""
    target = Path(output).resolve()
    caches = [Path(cache)] if cache is not None else []
    caches += [folder for folder in (target, *target.parents) if (folder / shard_name(0)).exists()]
    for found in caches:
        if target == found.resolve() or found.resolve() in target.parents:
            raise ValueError(f"{option} {output}: inside the cache {found}; write outputs outside it")


def find_shards(cache_dir: Path) -> list[Path]:
    """Shard files of a cache folder, in shard order; checks they are numbered 0..N-1."""
    found = sorted(path for path in cache_dir.iterdir() if SHARD_PATTERN.match(path.name))
    numbers = [int(SHARD_PATTERN.match(path.name).group(1)) for path in found]
    if numbers != list(range(len(found))):
        raise ValueError(f"{cache_dir}: shard files are not numbered 0..{len(found) - 1}: {numbers}")
    return found


def index_table(table: str) -> str:
    """Name of the table that holds `table`'s index entries."""
    return f"index.{table}"


def header_table(table: str) -> str:
    """Name of the table that holds the headers of `table`'s records (for tables in HEADER_TABLES)."""
    return f"header.{table}"


# Tables whose record headers are also kept apart: a feature record is ~0.3 MiB, its header
# (fingerprint, input hash, meta) 1-3 KiB. MSA records are left out: their meta is most of them.
HEADER_TABLES = (FEATURES_TABLE,)

# Every named database of a shard, in the order they are opened.
SHARD_DATABASES = (*TABLES, *map(index_table, TABLES), *map(header_table, HEADER_TABLES), META_TABLE)


def check_table(table: str) -> None:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}, expected one of {TABLES}")


def key_bytes(key: str) -> bytes:
    """The LMDB key of a store key; ValueError for keys LMDB cannot hold."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"store keys are non-empty str, got {key!r}")
    encoded = key.encode("utf-8")
    if len(encoded) > _MAX_KEY_BYTES:
        raise ValueError(f"key {key[:60]!r}... is {len(encoded)} bytes; LMDB keys are at most {_MAX_KEY_BYTES}")
    return encoded


def check_index_entry(table: str, key: str, index: Mapping[str, Any]) -> dict:
    """`index` as a plain dict; ValueError if it is not plain JSON or uses the reserved 'shard'."""
    # Index entries end up in manifest.json, so they must be JSON as well as msgpack.
    try:
        entry = dict(index)
        if not all(isinstance(name, str) for name in entry):
            raise TypeError("field names must be str")
        json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{table}/{key}: index entry {index!r:.200} is not plain JSON: {error}") from None
    if "shard" in entry:
        raise ValueError(f"{table}/{key}: index entry field 'shard' is reserved (the store fills it in)")
    return entry


def open_shard(path: Path, in_use: str, **options) -> lmdb.Environment:
    """lmdb.open of one shard file, with room for SHARD_DATABASES.

    py-lmdb allows one Environment per file per process, so a second open in this process
    fails; it becomes a RuntimeError "<path> <in_use>", where `in_use` says who holds the first.
    """
    try:
        env = lmdb.open(str(path), subdir=False, max_dbs=MAX_DBS, **options)
    except lmdb.Error as error:
        if "already open" in str(error):
            raise RuntimeError(f"{path} {in_use}") from None
        raise
    try:
        check_not_truncated(path, env)
    except ShardTruncatedError:
        env.close()
        raise
    return env


class ShardTruncatedError(ValueError):
    """A shard file ends before its last used page; `what` says by how much."""

    def __init__(self, path: Path, size: int, needed: int):
        self.what = f"truncated to {size} bytes, its pages reach byte {needed}"
        super().__init__(
            f"{path}: {self.what}; `featurecache verify --repair {path.parent}` sets it aside and says what to rerun"
        )


def check_not_truncated(path: Path, env: lmdb.Environment) -> None:
    """ShardTruncatedError if the file at `path` is shorter than the pages LMDB's last commit uses.

    Reading a page past the end of a memory-mapped file kills the process with SIGBUS, so every
    open checks this before any table is read: the reader, the writer and verify alike."""
    needed = used_bytes(env)  # from the meta pages only, which a file LMDB could open still has
    size = path.stat().st_size if path.exists() else needed
    if size < needed:
        raise ShardTruncatedError(path, size, needed)


def used_bytes(env: lmdb.Environment) -> int:
    """Bytes of the shard file that LMDB's last commit uses: its pages 0..last_pgno. A file may be
    longer (nothing reads past them) but never shorter."""
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def table_keys(txn: lmdb.Transaction, records_db, index_db) -> Iterator[bytes]:
    """A table's keys in key order, from its index table when the index names every record.

    py-lmdb's cursor touches every page of each value it passes (it preloads values, even with
    values=False), so listing a table of large records reads the whole table into the process;
    index entries are small. A put keeps or drops a key's entry and a delete removes both, so the
    index keys are a subset of the record keys: equal counts mean equal sets. A table whose
    records lack index entries (msa records written before precompute gave them one) is listed
    itself, touching its values.
    """
    listed = records_db
    if index_db is not None and txn.stat(index_db)["entries"] == txn.stat(records_db)["entries"]:
        listed = index_db
    return txn.cursor(db=listed).iternext(keys=True, values=False)


def begin_read(env: lmdb.Environment, **options) -> lmdb.Transaction:
    """A read transaction, adopting the map size if a writer in another process has grown it.

    LMDB refuses a transaction once the file has outgrown the map this process opened it with
    (MDB_MAP_RESIZED); the reader then takes the size the writer committed and begins again.
    """
    try:
        return env.begin(**options)
    except lmdb.MapResizedError:
        env.set_mapsize(0)  # 0: the size in the file; fails only while this process has a transaction open
        return env.begin(**options)


def read_shard_meta(env: lmdb.Environment, meta_db, path: Path) -> Any:
    """The shard's meta entry as stored (check it with check_shard_meta), or None if it has none."""
    with begin_read(env, db=meta_db) as txn:
        stored = txn.get(SHARD_META_KEY)
    return None if stored is None else unpack_plain(stored, str(path))


def check_shard_meta(meta: Any, path: Path, shard_index: int, num_shards: int) -> None:
    """ValueError unless `meta` (a shard's meta entry) says STORE_FORMAT, shard_index of num_shards."""
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"shard {path} has format {found}, expected {STORE_FORMAT}")
    if meta.get("shard_index") != shard_index or meta.get("num_shards") != num_shards:
        raise ValueError(
            f"shard {path} says it is shard {meta.get('shard_index')} of {meta.get('num_shards')}, "
            f"expected shard {shard_index} of {num_shards}"
        )
