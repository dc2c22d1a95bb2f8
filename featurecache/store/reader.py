"""Reading a cache: StoreReader, and the process-wide registry of read-only LMDB environments.

Readers open each shard lazily and read-only, once per process: a reader object that crossed a
fork or a pickle (DataLoader workers, spawn or fork) opens its own environments.

A local cache may be updated while it is read, so its readers register in LMDB's reader table
(the shard's -lock file, lock=True): a writer then never reuses a page a reader's transaction
still sees. A reader without that table (lock=False) could read pages a concurrent commit has
just reused. Published generations are sealed (no write permission on their shard files, and no
writer ever opens them) and are read with lock=False, needing no -lock file on shared storage.
A reader that may not write a local cache's -lock file (another user's cache) falls back to
lock=False with a warning: safe only while nobody updates that cache; publish it instead.

Typical use::

    reader = StoreReader(resolve_generation(path))             # in the loader
    record = reader.get_record(FEATURES_TABLE, target_id)      # Record or None
    header = reader.header(FEATURES_TABLE, target_id)          # RecordHeader or None, record unread
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from featurecache.store.codec import (
    CorruptRecordError,
    Record,
    RecordFormatError,
    RecordHeader,
    decode_record,
    read_header,
    unpack_plain,
)
from featurecache.store.layout import (
    META_TABLE,
    SHARD_DATABASES,
    begin_read,
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


log = logging.getLogger(__name__)

_OPEN_FOR_WRITING = "is open for writing in this process; read it through the StoreWriter"


def is_sealed(path: Path) -> bool:
    """True for a shard file nobody may write (publish seals generations so): it never changes."""
    return stat.S_IMODE(path.stat().st_mode) & 0o222 == 0


def _open_env(path: Path, readahead: bool) -> lmdb.Environment:
    if is_sealed(path):
        return open_shard(path, _OPEN_FOR_WRITING, readonly=True, lock=False, readahead=readahead)
    try:
        return open_shard(path, _OPEN_FOR_WRITING, readonly=True, lock=True, readahead=readahead)
    except lmdb.ReadonlyError as error:  # may not write the -lock file (another user's cache)
        log.warning(
            "%s: cannot join LMDB's reader table (%s); reading without it, which is safe only "
            "while no writer updates this cache (read a published generation instead)",
            path,
            error,
        )
        return open_shard(path, _OPEN_FOR_WRITING, readonly=True, lock=False, readahead=readahead)


def _open_readonly(path: Path, readahead: bool) -> tuple[lmdb.Environment, dict]:
    env = _open_env(path, readahead)
    dbs = {}
    for name in SHARD_DATABASES:
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            dbs[name] = None  # a table nothing was ever written to
    return env, dbs


def read_header_entry(txn: lmdb.Transaction, dbs: dict, table: str, key: str, where: str) -> RecordHeader | None:
    """A record's header from its header entry (layout.HEADER_TABLES); None if it has no intact one.

    py-lmdb touches every page of a value it gets, so reading the header entry instead of the
    record is what keeps a rerun from reading the whole cache. An entry is written and deleted in
    the same transaction as its record, so it stands for the record. A damaged entry counts as
    none: the record decides (verify names the entry). Shards written before header tables
    existed have no entries.
    """
    header_db = dbs.get(header_table(table))
    entry = None if header_db is None else txn.get(key_bytes(key), db=header_db)
    if entry is None:
        return None
    try:
        return read_header(entry, where=f"{where} header", key=key)
    except (CorruptRecordError, RecordFormatError):
        return None


def read_record_header(txn: lmdb.Transaction, db, key: str, where: str) -> RecordHeader | None:
    """A record's header read from the whole record (its CRC checked); None if there is no record.
    CorruptRecordError / RecordFormatError for a damaged record or one of another format."""
    blob = None if db is None else txn.get(key_bytes(key), db=db)
    return None if blob is None else read_header(blob, where=where, key=key)


class _SharedEnvironments:
    """Read-only environments shared by all readers of this process.

    py-lmdb allows one Environment per file per process, so two readers of one cache (a
    dataset and a stats call, say) share it; it closes when its last reader closes. A forked
    child discards the environments it inherited and opens its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}  # real path -> [env, dbs, number of users]
        os.register_at_fork(after_in_child=self._discard_inherited)

    def _discard_inherited(self) -> None:
        """In a forked child: close the environments inherited from the parent, so that py-lmdb,
        which refuses a second open of a file while an Environment of it exists in the process,
        lets the child open its own (its docs: inherited environments must be discarded and
        re-opened). Closing in the child is safe for the parent: LMDB clears only the reader
        slots of the closing process's pid (the child holds none), and fcntl locks are not
        inherited, so closing the child's copies of the descriptors releases none of the parent's.
        """
        inherited = [entry[0] for entry in self._entries.values()]
        self._lock = threading.Lock()
        self._entries = {}
        for env in inherited:
            try:
                env.close()
            except lmdb.Error as error:  # the child then fails to open it, naming the file
                log.warning("could not discard an LMDB environment inherited through fork: %s", error)

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
            if dbs[META_TABLE] is None:
                raise ValueError(f"shard {path} has no meta table: not a featurecache shard")
            meta = read_shard_meta(env, dbs[META_TABLE], path)
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
        check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        if dbs[table] is None:
            return None
        with begin_read(env, db=dbs[table]) as txn:
            return txn.get(key_bytes(key))

    def get_record(self, table: str, key: str, lazy_rows: bool = False) -> Record | None:
        """Decode a record straight from the memory map (no intermediate copy of the blob)."""
        check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        if dbs[table] is None:
            return None
        with begin_read(env, db=dbs[table], buffers=True) as txn:
            view = txn.get(key_bytes(key))
            # decode_record copies what it keeps, so nothing points into the map after the txn.
            return (
                None
                if view is None
                else decode_record(view, where=self.where(table, key), key=key, lazy_rows=lazy_rows)
            )

    def header(self, table: str, key: str) -> RecordHeader | None:
        """The record's header, without reading the record where it has an intact header entry
        (read_header_entry; its array_names are then empty); None if there is no record."""
        check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        where = self.where(table, key)
        with begin_read(env) as txn:
            return read_header_entry(txn, dbs, table, key, where) or read_record_header(txn, dbs[table], key, where)

    def header_entry(self, table: str, key: str) -> bytes | None:
        """The stored header entry of a record (codec.header_entry), or None (verify checks them)."""
        check_table(table)
        env, dbs = self._open(shard_of(key, self.num_shards))
        header_db = dbs.get(header_table(table))
        if header_db is None:
            return None
        with begin_read(env, db=header_db) as txn:
            return txn.get(key_bytes(key))

    def header_keys(self, table: str, shard_index: int) -> Iterator[str]:
        """Keys of the header entries of one shard's table (none for tables outside HEADER_TABLES)."""
        check_table(table)
        if header_table(table) in self._open(shard_index)[1]:
            for key, _ in self._cursor_items(shard_index, header_table(table)):
                yield key.decode("utf-8", "surrogateescape")

    def __contains__(self, item: tuple[str, str]) -> bool:
        table, key = item
        return self.get(table, key) is not None

    def _cursor_items(self, shard_index: int, db_name: str) -> Iterator[tuple[bytes, bytes]]:
        env, dbs = self._open(shard_index)
        if dbs[db_name] is None:
            return
        with begin_read(env, db=dbs[db_name]) as txn:
            yield from txn.cursor().iternext(keys=True, values=True)

    def keys(self, table: str) -> Iterator[str]:
        """Keys of a table, shard by shard (sorted within a shard); read from the table's index
        where it names every record, so listing does not read the records (layout.table_keys)."""
        check_table(table)
        for shard_index in range(self.num_shards):
            env, dbs = self._open(shard_index)
            if dbs[table] is None:
                continue
            with begin_read(env) as txn:
                for key in table_keys(txn, dbs[table], dbs[index_table(table)]):
                    yield key.decode("utf-8", "surrogateescape")

    def items(self, table: str, shard_index: int | None = None) -> Iterator[tuple[str, bytes]]:
        """(key, blob) pairs of a table, of one shard or all."""
        check_table(table)
        shards = range(self.num_shards) if shard_index is None else [shard_index]
        for index in shards:
            for key, blob in self._cursor_items(index, table):
                yield key.decode("utf-8", "surrogateescape"), blob

    def index_blobs(self, table: str, shard_index: int) -> Iterator[tuple[str, bytes]]:
        """(key, packed index entry) pairs stored beside a table's records in one shard."""
        check_table(table)
        for key, value in self._cursor_items(shard_index, index_table(table)):
            yield key.decode("utf-8", "surrogateescape"), value

    def index_entries(self, table: str, shard_index: int) -> Iterator[tuple[str, Any]]:
        """(key, index entry) pairs of one shard, decoded; ValueError names a damaged entry."""
        where = f"{self.shard_paths[shard_index]}/{index_table(table)}"
        for key, value in self.index_blobs(table, shard_index):
            yield key, unpack_plain(value, f"{where}/{key}")

    def count(self, table: str) -> int:
        check_table(table)
        total = 0
        for shard_index in range(self.num_shards):
            env, dbs = self._open(shard_index)
            if dbs[table] is not None:
                with begin_read(env) as txn:
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
