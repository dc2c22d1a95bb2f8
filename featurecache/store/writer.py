"""Writing a cache: ShardWriter (one shard file) and StoreWriter (all shards of a cache folder).

Writers batch puts into transactions of StoreConfig.batch_records, grow the map when it is full
and commit durably (fsync per commit). Each shard writer holds the shard's lock (locks.py), so
a second writer fails at once with StoreLockedError. A record is visible only after its
transaction commits, so a writer killed mid-batch leaves whole records or nothing.

A new cache gets its manifest.json from `StoreWriter.finish`, last: until then it is not a
finished cache. A finished cache keeps its manifest while a writer updates it, so readers keep
reading (update_marker.py says what that manifest still means); `finish` replaces it atomically.

Typical use::

    with StoreWriter(cache_dir, StoreConfig(num_shards=4)) as writer:
        if writer.header(FEATURES_TABLE, target_id) is None:    # resume: skip finished work
            blob = encode_record(target_id, arrays, meta, fingerprint, input_hash, SCHEMA_VERSION)
            writer.put(FEATURES_TABLE, target_id, blob,
                       index={"num_tokens": n, "msa_depth": m, "weight": w})
        writer.finish(fingerprints={"features": fingerprint})  # manifest.json, last
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import lmdb

from featurecache.config import StoreConfig
from featurecache.schema import TABLES
from featurecache.store.codec import (
    Record,
    RecordHeader,
    decode_record,
    encode_header,
    header_entry,
    pack_plain,
    read_header,
    unpack_plain,
)
from featurecache.store.layout import (
    HEADER_TABLES,
    META_TABLE,
    SHARD_DATABASES,
    SHARD_META_KEY,
    STORE_FORMAT,
    check_index_entry,
    check_shard_meta,
    check_table,
    find_shards,
    header_table,
    index_table,
    key_bytes,
    open_shard,
    read_shard_meta,
    shard_name,
    shard_of,
    table_keys,
)
from featurecache.store.locks import ShardLock
from featurecache.store.manifest import Manifest, check_shard_file, read_manifest, utc_now, write_manifest
from featurecache.store.reader import is_sealed, read_header_entry, read_record_header, readonly_environment
from featurecache.store.rewrite import rewrite_shard
from featurecache.store.update_marker import (
    begin_update,
    end_update,
    mark_interrupted,
    read_update_marker,
    record_deleted,
)

# Map growth doubles; stop at 16 TiB so a runaway record fails instead of eating the disk.
_MAX_MAP_SIZE = 1 << 44


class StoreWriteError(OSError):
    """A shard could not be written (disk full, file size limit, permissions); names the shard."""


def declared_shard_count(cache_dir: Path) -> int | None:
    """The shard count the existing shard files were created for (from their meta entry).

    A run killed while creating its shards leaves only the first few files; they still say how
    many there should be. Files too new to hold a meta entry are skipped; None if none has one.
    """
    for path in find_shards(cache_dir):
        try:
            with readonly_environment(path) as env:
                meta = read_shard_meta(env, env.open_db(META_TABLE.encode(), create=False), path)
        except lmdb.Error:
            continue  # created but never committed to (killed before LMDB wrote its header)
        except RuntimeError:
            continue  # open for writing in this process: taking its writer lock fails and says so
        if isinstance(meta, dict) and isinstance(meta.get("num_shards"), int):
            return meta["num_shards"]
    return None


class ShardWriter:
    """The one writer of one shard file; holds an exclusive flock while open."""

    def __init__(self, path: str | os.PathLike, shard_index: int, num_shards: int, config: StoreConfig):
        if config.batch_records < 1:
            raise ValueError(f"StoreConfig.batch_records must be >= 1, got {config.batch_records}")
        self.path = Path(path)
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.batch_records = config.batch_records
        if self.path.exists() and is_sealed(self.path):
            # Readers read sealed files without LMDB's reader table: they must never change.
            raise ValueError(
                f"{self.path} is read-only (a published generation?): generations are never "
                f"written; precompute into a cache folder, then publish it"
            )
        self._lock = ShardLock(self.path)
        self._env = None
        try:
            # sync + metasync: a commit returns only once it is on disk. readahead=False: the
            # writer's reads are point reads (header entries, MSA records), and each page fault
            # would read the device's read_ahead_kb around it (8 MiB here: a rerun of a 400-target
            # cache read all 116 MiB from disk to check 400 header entries; 1.3 MiB without).
            self._env = open_shard(
                self.path,
                "is open for reading in this process; close its StoreReader (and anything holding one) before writing",
                map_size=config.map_size_bytes,
                writemap=False,
                sync=True,
                metasync=True,
                readahead=False,
            )
            # Free the reader-table slots of killed readers: a stale slot pins old pages, and
            # the file would grow for as long as it stays.
            self._env.reader_check()
            self._dbs = {name: self._env.open_db(name.encode(), create=True) for name in SHARD_DATABASES}
            self._check_shard_meta()
        except BaseException:
            if self._env is not None:
                self._env.close()
            self._lock.release()
            raise
        # (table, key, blob or None for a delete, index entry, header entry)
        self._pending: list[tuple[str, str, bytes | None, dict | None, bytes | None]] = []
        self._restored_headers: list[tuple[str, str, bytes]] = []  # (table, key, header entry) read from records

    def _check_shard_meta(self) -> None:
        """A new shard gets its meta entry; an existing one must be this shard of this many."""
        meta = read_shard_meta(self._env, self._dbs[META_TABLE], self.path)
        if meta is not None:
            check_shard_meta(meta, self.path, self.shard_index, self.num_shards)
            return
        meta = {
            "format": STORE_FORMAT,
            "shard_index": self.shard_index,
            "num_shards": self.num_shards,
            "created": utc_now(),
        }
        with self._env.begin(write=True, db=self._dbs[META_TABLE]) as txn:
            txn.put(SHARD_META_KEY, pack_plain(meta))

    @property
    def created(self) -> str:
        return read_shard_meta(self._env, self._dbs[META_TABLE], self.path)["created"]

    def put(self, table: str, key: str, blob: bytes, index: Mapping[str, Any] | None = None) -> None:
        """Queue a record; it is committed with its batch (or on flush/close)."""
        check_table(table)
        key_bytes(key)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"{table}/{key}: blob must be bytes, got {type(blob).__name__}")
        entry = None if index is None else check_index_entry(table, key, index)
        header = header_entry(blob) if table in HEADER_TABLES else None
        self._pending.append((table, key, bytes(blob), entry, header))
        if len(self._pending) >= self.batch_records:
            self.flush()

    def delete(self, table: str, key: str) -> None:
        check_table(table)
        key_bytes(key)
        self._pending.append((table, key, None, None, None))
        if len(self._pending) >= self.batch_records:
            self.flush()

    def get(self, table: str, key: str) -> bytes | None:
        """The record as the writer will leave it, queued writes included."""
        check_table(table)
        for pending_table, pending_key, blob, _, _ in reversed(self._pending):
            if pending_table == table and pending_key == key:
                return blob
        with self._env.begin(db=self._dbs[table]) as txn:
            return txn.get(key_bytes(key))

    def header(self, table: str, key: str) -> RecordHeader | None:
        """The record's header as the writer will leave it, without reading a committed record
        that has an intact header entry (reader.read_header_entry); None if there is no record.

        A record read whole for want of an entry (a cache written before header entries, or a
        damaged entry) gets its entry written back with the next batch, so the next run reads
        the entry. CorruptRecordError / RecordFormatError for a damaged record."""
        check_table(table)
        where = f"{self.path}/{table}"
        for pending_table, pending_key, blob, _, _ in reversed(self._pending):
            if pending_table == table and pending_key == key:
                return None if blob is None else read_header(blob, where=where, key=key)
        with self._env.begin() as txn:
            header = read_header_entry(txn, self._dbs, table, key, where)
            if header is not None:
                return header
            header = read_record_header(txn, self._dbs[table], key, where)
        if header is not None and table in HEADER_TABLES:
            self._restored_headers.append((table, key, encode_header(header)))
            if len(self._pending) + len(self._restored_headers) >= self.batch_records:
                self.flush()
        return header

    def keys(self, table: str) -> list[str]:
        """The table's keys, without reading its records where its index names them all (layout.table_keys)."""
        check_table(table)
        self.flush()
        with self._env.begin() as txn:
            return [key.decode("utf-8") for key in table_keys(txn, self._dbs[table], self._dbs[index_table(table)])]

    def flush(self) -> None:
        """Commit queued writes in one durable transaction, growing the map when it is full."""
        if not self._pending and not self._restored_headers:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    # first: a put or delete of the same key queued later overrides its entry
                    for table, key, header in self._restored_headers:
                        txn.put(key_bytes(key), header, db=self._dbs[header_table(table)])
                    for table, key, blob, entry, header in self._pending:
                        self._write(txn, table, key_bytes(key), blob, entry, header)
                break
            except lmdb.MapFullError:
                # The transaction was aborted as a whole; grow and replay it.
                map_size = self._env.info()["map_size"] * 2
                if map_size > _MAX_MAP_SIZE:
                    raise RuntimeError(f"{self.path}: LMDB map would exceed {_MAX_MAP_SIZE} bytes") from None
                self._env.set_mapsize(map_size)
            except (lmdb.Error, OSError) as error:
                # The batch is lost (its records are recomputed by the next run); dropping it
                # keeps close() from failing the same way again.
                lost = len(self._pending)
                self._pending.clear()
                self._restored_headers.clear()
                raise StoreWriteError(
                    f"cannot write to shard {self.path}: {error} (disk full or not writable?); "
                    f"{lost} queued record(s) not written, committed records are intact"
                ) from None
        self._pending.clear()
        self._restored_headers.clear()

    def _write(
        self,
        txn: lmdb.Transaction,
        table: str,
        key: bytes,
        blob: bytes | None,
        entry: dict | None,
        header: bytes | None,
    ) -> None:
        """One queued put (blob) or delete (None), with the record's index and header entries."""
        side_tables = [(self._dbs[index_table(table)], None if entry is None else pack_plain(entry))]
        if table in HEADER_TABLES:
            side_tables.append((self._dbs[header_table(table)], header))
        if blob is None:
            txn.delete(key, db=self._dbs[table])
        else:
            txn.put(key, blob, db=self._dbs[table])
        for db, value in side_tables:
            if value is None or blob is None:
                txn.delete(key, db=db)  # a stale entry would outlive the record
            else:
                txn.put(key, value, db=db)

    def summary(self) -> dict:
        """Counts and index entries of every table, and LMDB's last transaction, for the manifest."""
        self.flush()
        counts, index = {}, {}
        with self._env.begin() as txn:
            for table in TABLES:
                counts[table] = txn.stat(self._dbs[table])["entries"]
                cursor = txn.cursor(db=self._dbs[index_table(table)])
                index[table] = {
                    key.decode("utf-8"): unpack_plain(value, f"{self.path}/{index_table(table)}")
                    for key, value in cursor.iternext()
                }
            txnid = self._env.info()["last_txnid"]  # the file's state: no commit follows before close
        return {"counts": counts, "index": index, "txnid": txnid}

    def close_env(self) -> None:
        """Commit what is queued and close the environment; the writer lock stays held."""
        if self._env is None:
            return
        try:
            self.flush()
        finally:
            self._env.close()
            self._env = None

    def close(self) -> None:
        try:
            self.close_env()
        finally:
            self._lock.release()


class StoreWriter:
    """Writes records into the shards of one cache folder (all shard locks held while open).

    A new cache has no manifest until `finish`, so it is never mistaken for a finished one. A
    finished cache keeps its last manifest while it is updated: opening it writes the update
    marker (update_marker.py), a deletion of a record that manifest lists is noted in the marker
    before it commits, and `finish` replaces the manifest atomically, then removes the marker.
    Closing without `finish` leaves the last manifest and marks the update interrupted.
    """

    def __init__(self, cache_dir: str | os.PathLike, config: StoreConfig = StoreConfig()):
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        existing = find_shards(self.cache_dir)
        declared = declared_shard_count(self.cache_dir) if existing else None
        if declared is not None and declared != config.num_shards:
            raise ValueError(
                f"{self.cache_dir} was created with {declared} shards but StoreConfig.num_shards is "
                f"{config.num_shards}; use num_shards={declared} or a new cache folder"
            )
        if declared is None and len(existing) > config.num_shards:
            raise ValueError(
                f"{self.cache_dir} has {len(existing)} shard files but StoreConfig.num_shards is "
                f"{config.num_shards}; use num_shards={len(existing)} or a new cache folder"
            )
        if config.num_shards < 1:
            raise ValueError(f"StoreConfig.num_shards must be >= 1, got {config.num_shards}")
        self.num_shards = config.num_shards
        self._shards: list[ShardWriter] = []
        try:
            for shard_index in range(self.num_shards):
                path = self.cache_dir / shard_name(shard_index)
                self._shards.append(ShardWriter(path, shard_index, self.num_shards, config))
            interrupted = read_update_marker(self.cache_dir)  # its shard entries no longer describe the files
            self._update = begin_update(self.cache_dir)
        except BaseException:
            self._close_all()
            raise
        # The last finished manifest: deleting a record it lists is noted first, and finish keeps
        # the digests of the shards left unchanged.
        self._last = self._last_finished_manifest() if self._update is not None else None
        self._listed = {} if self._last is None else self._last.index  # table -> key -> entry
        self._last_describes_files = self._last is not None and interrupted is None

    def _last_finished_manifest(self) -> Manifest | None:
        try:
            return read_manifest(self.cache_dir, expected_schema=None)
        except ValueError:  # damaged or foreign: readers refuse it anyway, and finish replaces it
            return None

    def _shard(self, key: str) -> ShardWriter:
        if not self._shards:
            raise RuntimeError(f"writer of {self.cache_dir} is closed")
        return self._shards[shard_of(key, self.num_shards)]

    def put(self, table: str, key: str, blob: bytes, index: Mapping[str, Any] | None = None) -> None:
        """Store `blob` under (table, key); `index` is a small plain dict copied into the manifest.

        For feature records the loader expects index fields num_tokens, msa_depth and weight.
        A put without `index` drops the key's previous index entry.
        """
        self._shard(key).put(table, key, blob, index)

    def delete(self, table: str, key: str) -> None:
        shard = self._shard(key)
        if key in self._listed.get(table, ()):
            self._update = record_deleted(self._update, table, key)  # durable before the delete commits
        shard.delete(table, key)

    def get(self, table: str, key: str) -> bytes | None:
        return self._shard(key).get(table, key)

    def header(self, table: str, key: str) -> RecordHeader | None:
        """The record's header, read without the record where it has a header entry (ShardWriter.header)."""
        return self._shard(key).header(table, key)

    def get_record(self, table: str, key: str) -> Record | None:
        blob = self.get(table, key)
        where = f"{self.cache_dir / shard_name(shard_of(key, self.num_shards))}/{table}"
        return None if blob is None else decode_record(blob, where=where, key=key)

    def __contains__(self, item: tuple[str, str]) -> bool:
        table, key = item
        return self.get(table, key) is not None

    def keys(self, table: str) -> list[str]:
        return [key for shard in self._shards for key in shard.keys(table)]

    def flush(self) -> None:
        for shard in self._shards:
            shard.flush()

    def shards_changed_outside(self) -> list[int]:
        """Shards whose file no longer matches the last finished manifest (size or sha256) though
        no writer changed it: damage outside LMDB, perhaps where no record lies. Reads every shard
        file whole; call before writing anything (precompute --recheck does, reading the whole
        cache anyway). Empty when the last manifest does not describe the files (a new cache, an
        interrupted update)."""
        if not self._last_describes_files or self._last.num_shards != self.num_shards:
            return []
        self.flush()
        return [
            shard.shard_index
            for shard, info in zip(self._shards, self._last.shards)
            if check_shard_file(shard.path, info) is not None
        ]

    def finish(
        self,
        fingerprints: Mapping[str, str] | None = None,
        schema_version: int | None = None,
        derived_index: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
        rewrite_shards: Collection[int] = (),
    ) -> Manifest:
        """Commit everything, close the shards and write manifest.json last; returns the Manifest.

        `derived_index`: index tables computed over the whole cache (manifest.write_manifest).
        `rewrite_shards`: shards copied entry by entry into fresh files first (rewrite.py), which
        leaves behind damage where no record lies (shards_changed_outside)."""
        try:
            summaries = [shard.summary() for shard in self._shards]
            created = self._shards[0].created
            for shard in self._shards:
                shard.close_env()
            for shard_index in sorted(set(rewrite_shards)):
                summaries[shard_index]["txnid"] = rewrite_shard(self._shards[shard_index].path)["txnid"]
            # Still holding the shard locks: no writer can change a shard under the checksums.
            same_cache = self._last is not None and self._last.created == created  # not one made anew
            manifest = write_manifest(
                self.cache_dir,
                summaries,
                fingerprints=fingerprints or {},
                schema_version=schema_version,
                created=created,
                derived_index=derived_index,
                previous=self._last if same_cache else None,
            )
            end_update(self.cache_dir)  # after the manifest: a kill in between leaves a stale marker
            self._update = None
            return manifest
        finally:
            self._close_all()

    def _close_all(self) -> None:
        errors = []
        for shard in self._shards:
            try:
                shard.close()
            except Exception as error:  # close every shard even if one fails
                errors.append(error)
        self._shards = []
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Commit queued writes and release the shards without finishing: a new cache stays
        unfinished, an updated one keeps its last manifest and its update is marked interrupted."""
        try:
            self._close_all()
        finally:
            if self._update is not None:
                marker, self._update = self._update, None
                mark_interrupted(marker)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
