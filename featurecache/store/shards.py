"""Sharded LMDB store: N single-file LMDB environments, each with the same named tables.

Layout of a cache folder::

    shard-00000.lmdb        LMDB data file (subdir=False: one file per shard, so copying,
    shard-00000.lmdb-lock   checksumming and publishing handle plain files); the -lock file is
    shard-00000.lmdb.lock   LMDB's reader table, the .lock file is our one-writer flock
    ...
    manifest.json           written last by StoreWriter.finish; its presence marks a finished cache

A key's shard is blake2b(key) mod N, so any process finds a record without an index. Every
shard holds the tables in TABLES, per-table index tables (small plain entries the loader needs,
such as num_tokens, written in the same transaction as the record) and a "meta" table that
records the shard's number and the shard count.

Writers batch puts into transactions of StoreConfig.batch_records, grow the map when it is full
and commit durably (fsync per commit). A second writer on a shard fails at once with
StoreLockedError instead of interleaving with the first. A record is visible only after its
transaction commits, so a writer killed mid-batch leaves whole records or nothing.

Typical use::

    with StoreWriter(cache_dir, StoreConfig(num_shards=4)) as writer:
        if writer.get("features", target_id) is None:          # resume: skip finished work
            blob = encode_record(target_id, arrays, meta, fingerprint, input_hash, SCHEMA_VERSION)
            writer.put("features", target_id, blob,
                       index={"num_tokens": n, "msa_depth": m, "weight": w})
        writer.finish(fingerprints={"features": fingerprint})  # manifest.json, last

    reader = StoreReader(resolve_generation(path))             # in the loader
    record = reader.get_record("features", target_id)          # Record or None

Readers open each shard lazily, read-only and without LMDB's lock file (lock=False), once per
process: a reader object that crossed a fork or a pickle (DataLoader workers, spawn or fork)
opens its own environments. lock=False means readers do not register with writers, so read
finished caches or published generations, never a cache a writer is still changing.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lmdb

from featurecache.config import StoreConfig
from featurecache.store.codec import Record, decode_record, pack_plain, unpack_plain
from featurecache.store.manifest import STORE_FORMAT, Manifest, remove_manifest, write_manifest

TABLES = ("msa", "features", "errors")
SHARD_PATTERN = re.compile(r"^shard-(\d{5})\.lmdb$")
LOCK_SUFFIX = ".lock"

_META_TABLE = "meta"
_SHARD_META_KEY = b"shard"
_MAX_DBS = 16  # 3 tables + 3 index tables + meta, with room for new tables
_MAX_KEY_BYTES = 511  # LMDB's compiled-in key size limit
# Map growth doubles; stop at 16 TiB so a runaway record fails instead of eating the disk.
_MAX_MAP_SIZE = 1 << 44


class StoreWriteError(OSError):
    """A shard could not be written (disk full, file size limit, permissions); names the shard."""


class StoreLockedError(RuntimeError):
    """Another process holds the writer lock of a shard."""


def shard_name(shard_index: int) -> str:
    return f"shard-{shard_index:05d}.lmdb"


def shard_of(key: str, num_shards: int) -> int:
    """Stable shard of a key: the same in every process and Python version (unlike hash())."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def find_shards(cache_dir: Path) -> list[Path]:
    """Shard files of a cache folder, in shard order; checks they are numbered 0..N-1."""
    found = sorted(path for path in cache_dir.iterdir() if SHARD_PATTERN.match(path.name))
    numbers = [int(SHARD_PATTERN.match(path.name).group(1)) for path in found]
    if numbers != list(range(len(found))):
        raise ValueError(f"{cache_dir}: shard files are not numbered 0..{len(found) - 1}: {numbers}")
    return found


def declared_shard_count(cache_dir: Path) -> int | None:
    """The shard count the existing shard files were created for (from their meta entry).

    A run killed while creating its shards leaves only the first few files; they still say how
    many there should be. Files too new to hold a meta entry are skipped; None if none has one.
    """
    for path in find_shards(cache_dir):
        try:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_MAX_DBS)
        except lmdb.Error:
            continue  # created but never committed to (killed before LMDB wrote its header)
        try:
            meta_db = env.open_db(_META_TABLE.encode(), create=False)
            with env.begin(db=meta_db) as txn:
                stored = txn.get(_SHARD_META_KEY)
        except lmdb.Error:
            continue
        finally:
            env.close()
        if stored is not None:
            meta = unpack_plain(stored, str(path))
            if isinstance(meta, dict) and isinstance(meta.get("num_shards"), int):
                return meta["num_shards"]
    return None


def _index_table(table: str) -> str:
    return f"index.{table}"


def _check_table(table: str) -> None:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}, expected one of {TABLES}")


def _key_bytes(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise ValueError(f"store keys are non-empty str, got {key!r}")
    encoded = key.encode("utf-8")
    if len(encoded) > _MAX_KEY_BYTES:
        raise ValueError(f"key {key[:60]!r}... is {len(encoded)} bytes; LMDB keys are at most {_MAX_KEY_BYTES}")
    return encoded


def _check_index_entry(table: str, key: str, index: Mapping[str, Any]) -> dict:
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


class ShardLock:
    """Exclusive, non-blocking flock on `<shard>.lock`; the kernel drops it if the holder dies."""

    def __init__(self, shard_path: str | os.PathLike):
        self.shard_path = Path(shard_path)
        self.path = self.shard_path.with_name(self.shard_path.name + LOCK_SUFFIX)
        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise StoreLockedError(
                    f"{self.shard_path} is being written by another writer ({holder}); "
                    f"one writer per shard at a time (lock {self.path})"
                ) from None
            raise
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")  # named in the error a second writer gets
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _open_writable(path: Path, map_size: int) -> lmdb.Environment:
    try:
        # sync + metasync: a commit returns only once it is on disk.
        return lmdb.open(str(path), subdir=False, map_size=map_size, max_dbs=_MAX_DBS,
                         writemap=False, sync=True, metasync=True)
    except lmdb.Error as error:
        if "already open" in str(error):
            raise RuntimeError(
                f"{path} is open for reading in this process; close its StoreReader "
                f"(and anything holding one) before writing"
            ) from None
        raise


class ShardWriter:
    """The one writer of one shard file; holds an exclusive flock while open."""

    def __init__(self, path: str | os.PathLike, shard_index: int, num_shards: int, config: StoreConfig):
        if config.batch_records < 1:
            raise ValueError(f"StoreConfig.batch_records must be >= 1, got {config.batch_records}")
        self.path = Path(path)
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.batch_records = config.batch_records
        self._lock = ShardLock(self.path)
        self._env = None
        try:
            self._env = _open_writable(self.path, config.map_size_bytes)
            names = [*TABLES, *map(_index_table, TABLES), _META_TABLE]
            self._dbs = {name: self._env.open_db(name.encode(), create=True) for name in names}
            self._check_shard_meta()
        except BaseException:
            if self._env is not None:
                self._env.close()
            self._lock.release()
            raise
        self._pending: list[tuple[str, str, bytes | None, dict | None]] = []

    def _check_shard_meta(self) -> None:
        with self._env.begin(write=True, db=self._dbs[_META_TABLE]) as txn:
            stored = txn.get(_SHARD_META_KEY)
            if stored is None:
                created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                meta = {"format": STORE_FORMAT, "shard_index": self.shard_index,
                        "num_shards": self.num_shards, "created": created}
                txn.put(_SHARD_META_KEY, pack_plain(meta))
                return
        check_shard_meta(unpack_plain(stored, str(self.path)), self.path, self.shard_index, self.num_shards)

    @property
    def created(self) -> str:
        with self._env.begin(db=self._dbs[_META_TABLE]) as txn:
            return unpack_plain(txn.get(_SHARD_META_KEY), str(self.path))["created"]

    def put(self, table: str, key: str, blob: bytes, index: Mapping[str, Any] | None = None) -> None:
        """Queue a record; it is committed with its batch (or on flush/close)."""
        _check_table(table)
        _key_bytes(key)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"{table}/{key}: blob must be bytes, got {type(blob).__name__}")
        entry = None if index is None else _check_index_entry(table, key, index)
        self._pending.append((table, key, bytes(blob), entry))
        if len(self._pending) >= self.batch_records:
            self.flush()

    def delete(self, table: str, key: str) -> None:
        _check_table(table)
        _key_bytes(key)
        self._pending.append((table, key, None, None))
        if len(self._pending) >= self.batch_records:
            self.flush()

    def get(self, table: str, key: str) -> bytes | None:
        """The record as the writer will leave it, queued writes included."""
        _check_table(table)
        for pending_table, pending_key, blob, _ in reversed(self._pending):
            if pending_table == table and pending_key == key:
                return blob
        with self._env.begin(db=self._dbs[table]) as txn:
            return txn.get(_key_bytes(key))

    def keys(self, table: str) -> list[str]:
        _check_table(table)
        self.flush()
        with self._env.begin(db=self._dbs[table]) as txn:
            return [key.decode("utf-8") for key in txn.cursor().iternext(keys=True, values=False)]

    def flush(self) -> None:
        """Commit queued writes in one durable transaction, growing the map when it is full."""
        if not self._pending:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for table, key, blob, entry in self._pending:
                        encoded = _key_bytes(key)
                        index_db = self._dbs[_index_table(table)]
                        if blob is None:
                            txn.delete(encoded, db=self._dbs[table])
                            txn.delete(encoded, db=index_db)
                            continue
                        txn.put(encoded, blob, db=self._dbs[table])
                        if entry is None:
                            txn.delete(encoded, db=index_db)  # a stale entry would outlive the record
                        else:
                            txn.put(encoded, pack_plain(entry), db=index_db)
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
                raise StoreWriteError(
                    f"cannot write to shard {self.path}: {error} (disk full or not writable?); "
                    f"{lost} queued record(s) not written, committed records are intact"
                ) from None
        self._pending.clear()

    def summary(self) -> dict:
        """Counts and index entries of every table, for the manifest."""
        self.flush()
        counts, index = {}, {}
        with self._env.begin() as txn:
            for table in TABLES:
                counts[table] = txn.stat(self._dbs[table])["entries"]
                cursor = txn.cursor(db=self._dbs[_index_table(table)])
                index[table] = {
                    key.decode("utf-8"): unpack_plain(value, f"{self.path}/{_index_table(table)}")
                    for key, value in cursor.iternext()
                }
        return {"counts": counts, "index": index}

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


def check_shard_meta(meta: Any, path: Path, shard_index: int, num_shards: int) -> None:
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"shard {path} has format {found}, expected {STORE_FORMAT}")
    if meta.get("shard_index") != shard_index or meta.get("num_shards") != num_shards:
        raise ValueError(
            f"shard {path} says it is shard {meta.get('shard_index')} of {meta.get('num_shards')}, "
            f"expected shard {shard_index} of {num_shards}"
        )


class StoreWriter:
    """Writes records into the shards of one cache folder (all shard locks held while open).

    Opening a cache for writing removes its manifest, so a cache that is being changed is never
    mistaken for a finished one; `finish` writes the manifest again.
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
        except BaseException:
            self._close_all()
            raise
        remove_manifest(self.cache_dir)

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
        self._shard(key).delete(table, key)

    def get(self, table: str, key: str) -> bytes | None:
        return self._shard(key).get(table, key)

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

    def finish(
        self, fingerprints: Mapping[str, str] | None = None, schema_version: int | None = None
    ) -> Manifest:
        """Commit everything, close the shards and write manifest.json last; returns the Manifest."""
        try:
            summaries = [shard.summary() for shard in self._shards]
            created = self._shards[0].created
            for shard in self._shards:
                shard.close_env()
            # Still holding the shard locks: no writer can change a shard under the checksums.
            return write_manifest(
                self.cache_dir, summaries, fingerprints=fingerprints or {},
                schema_version=schema_version, created=created,
            )
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
        """Commit queued writes and release the shards; no manifest (the cache stays unfinished)."""
        self._close_all()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _open_readonly(path: Path, readahead: bool) -> tuple[lmdb.Environment, dict]:
    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=_MAX_DBS,
                        readahead=readahead)
    except lmdb.Error as error:
        if "already open" in str(error):
            raise RuntimeError(
                f"{path} is open for writing in this process; read it through the StoreWriter"
            ) from None
        raise
    dbs = {}
    for name in (*TABLES, *map(_index_table, TABLES), _META_TABLE):
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            dbs[name] = None  # a table nothing was ever written to
    return env, dbs


class _SharedEnvironments:
    """Read-only environments shared by all readers of this process.

    py-lmdb allows one Environment per file per process, so two readers of one cache (a
    dataset and a stats call, say) share it; it closes when its last reader closes. The
    registry is emptied in a forked child, which must open its own.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}  # real path -> [env, dbs, number of users]

    def acquire(self, path: Path, readahead: bool) -> tuple[lmdb.Environment, dict]:
        key = os.path.realpath(path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [*_open_readonly(path, readahead), 0]
            entry[2] += 1
            return entry[0], entry[1]

    def release(self, path: Path) -> None:
        key = os.path.realpath(path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[2] -= 1
            if entry[2] == 0:
                entry[0].close()
                del self._entries[key]


_SHARED = _SharedEnvironments()


@contextlib.contextmanager
def readonly_environment(path: str | os.PathLike) -> Iterator[lmdb.Environment]:
    """A shard opened read-only through the process-wide registry (for copies and scans)."""
    path = Path(path)
    env, _ = _SHARED.acquire(path, readahead=True)
    try:
        yield env
    finally:
        _SHARED.release(path)


class StoreReader:
    """Read-only access to a finished cache folder or a published generation.

    Environments open lazily, once per process (shared with other readers of the same files in
    the process; the first opener's readahead applies); the object pickles without them, so it
    can be handed to DataLoader workers started by fork or spawn.
    """

    def __init__(self, cache_dir: str | os.PathLike, readahead: bool = False, num_shards: int | None = None):
        """`num_shards` (e.g. from the manifest) skips listing the folder; a missing shard file
        then fails when that shard is first read."""
        self.cache_dir = Path(cache_dir)
        if not self.cache_dir.is_dir():
            raise FileNotFoundError(f"cache folder {self.cache_dir} does not exist")
        if num_shards is None:
            self.shard_paths = find_shards(self.cache_dir)
            if not self.shard_paths:
                raise ValueError(f"{self.cache_dir} is not a cache: it has no shard-*.lmdb files")
        else:
            self.shard_paths = [self.cache_dir / shard_name(index) for index in range(num_shards)]
        self.num_shards = len(self.shard_paths)
        # readahead=False: training reads are random, and readahead would evict useful pages.
        self.readahead = readahead
        self._pid = os.getpid()
        self._envs: dict[int, tuple[lmdb.Environment, dict]] = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_envs"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def _open(self, shard_index: int) -> tuple[lmdb.Environment, dict]:
        if self._pid != os.getpid():
            # Inherited through fork: LMDB handles must not be used across fork; the child's
            # registry is empty and it opens its own. The parent's handles stay valid.
            self._envs = {}
            self._pid = os.getpid()
        opened = self._envs.get(shard_index)
        if opened is not None:
            return opened
        path = self.shard_paths[shard_index]
        env, dbs = _SHARED.acquire(path, self.readahead)
        try:
            if dbs[_META_TABLE] is None:
                raise ValueError(f"shard {path} has no meta table: not a featurecache shard")
            with env.begin(db=dbs[_META_TABLE]) as txn:
                meta = unpack_plain(txn.get(_SHARD_META_KEY) or b"\xc0", str(path))
            check_shard_meta(meta, path, shard_index, self.num_shards)
        except BaseException:
            _SHARED.release(path)
            raise
        self._envs[shard_index] = (env, dbs)
        return env, dbs

    def where(self, table: str, key: str) -> str:
        """'<shard path>/<table>': how errors name a record's location."""
        return f"{self.shard_paths[shard_of(key, self.num_shards)]}/{table}"

    def get(self, table: str, key: str) -> bytes | None:
        _check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        if dbs[table] is None:
            return None
        with env.begin(db=dbs[table]) as txn:
            return txn.get(_key_bytes(key))

    def get_record(self, table: str, key: str) -> Record | None:
        """Decode a record straight from the memory map (no intermediate copy of the blob)."""
        _check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        if dbs[table] is None:
            return None
        with env.begin(db=dbs[table], buffers=True) as txn:
            view = txn.get(_key_bytes(key))
            # decode_record copies what it keeps, so nothing points into the map after the txn.
            return None if view is None else decode_record(view, where=self.where(table, key), key=key)

    def __contains__(self, item: tuple[str, str]) -> bool:
        table, key = item
        return self.get(table, key) is not None

    def _cursor_items(self, shard_index: int, db_name: str, values: bool) -> Iterator:
        env, dbs = self._open(shard_index)
        if dbs[db_name] is None:
            return
        with env.begin(db=dbs[db_name]) as txn:
            yield from txn.cursor().iternext(keys=True, values=values)

    def keys(self, table: str) -> Iterator[str]:
        """Keys of a table, shard by shard (sorted within a shard)."""
        _check_table(table)
        for shard_index in range(self.num_shards):
            for key in self._cursor_items(shard_index, table, values=False):
                yield key.decode("utf-8", "surrogateescape")

    def items(self, table: str, shard_index: int | None = None) -> Iterator[tuple[str, bytes]]:
        """(key, blob) pairs of a table, of one shard or all."""
        _check_table(table)
        shards = range(self.num_shards) if shard_index is None else [shard_index]
        for index in shards:
            for key, blob in self._cursor_items(index, table, values=True):
                yield key.decode("utf-8", "surrogateescape"), blob

    def index_blobs(self, table: str, shard_index: int) -> Iterator[tuple[str, bytes]]:
        """(key, packed index entry) pairs stored beside a table's records in one shard."""
        _check_table(table)
        for key, value in self._cursor_items(shard_index, _index_table(table), values=True):
            yield key.decode("utf-8", "surrogateescape"), value

    def index_entries(self, table: str, shard_index: int) -> Iterator[tuple[str, Any]]:
        """(key, index entry) pairs of one shard, decoded; ValueError names a damaged entry."""
        where = f"{self.shard_paths[shard_index]}/{_index_table(table)}"
        for key, value in self.index_blobs(table, shard_index):
            yield key, unpack_plain(value, f"{where}/{key}")

    def count(self, table: str) -> int:
        _check_table(table)
        total = 0
        for shard_index in range(self.num_shards):
            env, dbs = self._open(shard_index)
            if dbs[table] is not None:
                with env.begin() as txn:
                    total += txn.stat(dbs[table])["entries"]
        return total

    def close(self) -> None:
        if self._pid == os.getpid():
            for shard_index in self._envs:
                _SHARED.release(self.shard_paths[shard_index])
        self._envs = {}

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
