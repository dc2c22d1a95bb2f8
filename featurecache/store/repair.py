"""`featurecache verify --repair`: bring shard files back in line with the manifest, losing no record.

verify compares every shard file's sha256 with the manifest's. Bytes changed where no record
lies (a free page, the unused part of a page, bytes appended to the file) leave every record
intact but the digest wrong, and a rerun that leaves the shard unchanged keeps that digest, so
verify would keep failing. `repair_cache` takes every shard lock (no writer runs meanwhile) and:

- rewrites each shard whose file differs from the manifest while all its records are intact
  (VerifyReport.shards_to_rewrite): `rewrite_shard` copies every entry of every table, through
  LMDB, into a fresh file, puts it in place of the old one and the manifest gets its new size,
  sha256 and transaction id;
- moves each shard that is missing or that LMDB cannot read aside (`<shard>.unreadable-<time>`,
  with its -lock file) and puts an empty shard in its place. Its records are lost: the manifest
  still lists them, so verify names them as missing until precompute recomputes them from the
  inputs;
- leaves shards with damaged records alone: precompute --recheck recomputes those records and,
  having written the shard, records its new checksum.

Readers keep reading throughout. A reader that opened the old file keeps its memory map of it
(a rename never changes an open file), and the old file is never written again. Readers share
LMDB's lock file (`<shard>-lock`), which holds the last transaction id and picks the meta page a
new transaction starts from (id mod 2), so the new file is committed up to the same id as the
old file; and the old file's last two commits hold the same records (a no-op commit first), so
a reader of the old file stays consistent whichever of its two meta pages a later id picks.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from featurecache.config import file_sha256
from featurecache.store.files import fsync_dir, fsync_file
from featurecache.store.layout import META_TABLE, SHARD_DATABASES, SHARD_META_KEY, STORE_FORMAT, open_shard, shard_name
from featurecache.store.codec import pack_plain
from featurecache.store.locks import ShardLock
from featurecache.store.manifest import Manifest, ShardInfo, read_manifest, save_manifest, utc_now
from featurecache.store.update_marker import read_update_marker
from featurecache.store.verify import VerifyReport, verify_cache

_IN_USE = "is open in this process; close its readers and writers before repairing it"
# Entries copied per transaction: bounds the dirty pages LMDB holds in memory at once.
_COPY_BATCH_BYTES = 64 << 20
_UNREADABLE_SUFFIX = ".unreadable-"


@dataclass
class RepairReport:
    cache_dir: Path
    rewritten: list[str] = field(default_factory=list)     # shard files rewritten from their records
    set_aside: dict[str, str] = field(default_factory=dict)  # unreadable shard file -> where it was moved
    left: list[str] = field(default_factory=list)           # shards with damaged records (precompute --recheck)
    after: VerifyReport | None = None                       # verify of the repaired cache

    def to_dict(self) -> dict:
        return {"rewritten": self.rewritten, "set_aside": self.set_aside, "left": self.left,
                "verify": None if self.after is None else self.after.to_dict()}

    def format(self) -> str:
        lines = [f"rewrote {shard} from its records" for shard in self.rewritten]
        lines += [f"moved unreadable {shard} to {aside} and put an empty shard in its place; its records "
                  f"must be recomputed from the inputs" for shard, aside in self.set_aside.items()]
        lines += [f"left {shard}: it holds damaged records" for shard in self.left]
        if not lines:
            lines.append("nothing to repair in the shard files")
        return "\n".join([*lines, self.after.format()])


def repair_cache(cache_dir: str | os.PathLike) -> RepairReport:
    """Repair the shard files of the finished cache `cache_dir` (see the module docstring).

    ValueError for a published generation (never written) or a cache whose update is in progress
    or was interrupted (its manifest no longer describes the shard files); StoreLockedError when a
    writer holds a shard."""
    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir, expected_schema=None)
    if manifest.generation is not None:
        raise ValueError(f"{cache_dir} is the published generation {manifest.generation}: generations are never "
                         f"written; repair the cache it was published from and publish it again")
    locks = []
    report = RepairReport(cache_dir)
    try:
        for shard in manifest.shards:
            locks.append(ShardLock(cache_dir / shard.file))
        update = read_update_marker(cache_dir)
        if update is not None:
            raise ValueError(f"cannot repair {cache_dir}: {update.describe()}, then verify again")
        manifest = read_manifest(cache_dir, expected_schema=None)  # as it is under the locks
        found = verify_cache(cache_dir)
        shards = list(manifest.shards)
        for shard_index, shard in enumerate(manifest.shards):
            path = cache_dir / shard.file
            if shard.file in found.unreadable_shards():
                report.set_aside[shard.file] = _set_aside(path).name
                shards[shard_index] = _empty_shard(path, shard_index, manifest)
            elif shard.file in found.shards_to_rewrite():
                shards[shard_index] = dataclasses.replace(shard, **rewrite_shard(path))
                report.rewritten.append(shard.file)
            elif any(record.shard == shard.file for record in found.damaged):
                report.left.append(shard.file)
        if report.rewritten or report.set_aside:
            save_manifest(dataclasses.replace(manifest, shards=tuple(shards), updated=utc_now()), cache_dir)
    finally:
        for lock in locks:
            lock.release()
    report.after = verify_cache(cache_dir)
    return report


def rewrite_shard(path: Path) -> dict:
    """Copy every entry of every table of the shard at `path` into a fresh file that replaces it;
    returns the new file's manifest fields (size, sha256, txnid). Call holding the shard's lock.

    The copy is made through LMDB, so only what a reader can reach is copied: free pages, the
    unused parts of pages and anything past the last page stay behind."""
    temp = path.with_name(f".{path.name}.rewrite-{os.getpid()}.tmp")
    old = open_shard(path, _IN_USE)
    try:
        _commit_no_op(old)  # the old file's last two commits now hold the same records
        with old.begin() as source:
            names = [name for name, _ in source.cursor()]  # the main database lists the named ones
        new = lmdb.open(str(temp), subdir=False, max_dbs=len(names) + 1, map_size=old.info()["map_size"],
                        lock=False, sync=False, metasync=False)
        try:
            with old.begin() as source:
                for name in names:
                    _copy_table(source, old.open_db(name, txn=source, create=False), new, name)
            # Both files end at one transaction id, the one readers' shared lock file will hold.
            txnid = max(old.info()["last_txnid"], new.info()["last_txnid"] + 1)
            _commit_no_op(old, up_to=txnid)
            _commit_no_op(new, up_to=txnid)
            new.sync(True)
        finally:
            new.close()
        fsync_file(temp)
        os.chmod(temp, os.stat(path).st_mode & 0o777)
        os.replace(temp, path)
        fsync_dir(path.parent)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    finally:
        old.close()
    return {"size": path.stat().st_size, "sha256": file_sha256(path), "txnid": txnid}


def _copy_table(source: lmdb.Transaction, source_db, target: lmdb.Environment, name: bytes) -> None:
    """Every (key, value) of one named database, in key order, into `target` (appended: keys come sorted)."""
    target_db = target.open_db(name, create=True)
    entries = source.cursor(db=source_db).iternext(keys=True, values=True)
    batch, batch_bytes = [], 0
    for key, value in entries:
        batch.append((key, value))
        batch_bytes += len(key) + len(value)
        if batch_bytes >= _COPY_BATCH_BYTES:
            _put_batch(target, target_db, batch)
            batch, batch_bytes = [], 0
    _put_batch(target, target_db, batch)
    with target.begin() as txn:
        copied = txn.stat(target_db)["entries"]
    expected = source.stat(source_db)["entries"]
    if copied != expected:  # a sorted source appended in order cannot lose an entry
        raise AssertionError(f"{name!r}: {copied} entries copied of {expected}")


def _put_batch(env: lmdb.Environment, db, batch: list[tuple[bytes, bytes]]) -> None:
    if not batch:
        return
    with env.begin(write=True, db=db) as txn:
        consumed, added = txn.cursor().putmulti(batch, append=True)
    if consumed != len(batch) or added != len(batch):
        raise AssertionError(f"putmulti stored {added} of {len(batch)} entries")


def _commit_no_op(env: lmdb.Environment, up_to: int | None = None) -> None:
    """Commit once (or until the last transaction id is `up_to`), each commit putting the shard's
    meta entry back unchanged: LMDB skips a commit that changes nothing, so the id would not move."""
    meta_db = env.open_db(META_TABLE.encode(), create=False)
    with env.begin(db=meta_db) as txn:
        meta = txn.get(SHARD_META_KEY)
    target = env.info()["last_txnid"] + 1 if up_to is None else up_to
    while env.info()["last_txnid"] < target:
        with env.begin(write=True, db=meta_db) as txn:
            txn.put(SHARD_META_KEY, meta)


def _set_aside(path: Path) -> Path:
    """Move an unreadable shard file (and LMDB's lock file beside it) out of the cache's way."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}{_UNREADABLE_SUFFIX}{stamp}")
    lock_file = path.with_name(path.name + "-lock")
    if path.exists():
        os.rename(path, aside)
    if lock_file.exists():
        # its readers read the old file; a new file starts with a new reader table
        os.rename(lock_file, aside.with_name(aside.name + "-lock"))
    fsync_dir(path.parent)
    return aside


def _empty_shard(path: Path, shard_index: int, manifest: Manifest) -> ShardInfo:
    """A new shard file with every table and its meta entry, for one that was set aside. Its
    manifest entry keeps the lost records' counts, so verify names them until they are recomputed."""
    env = open_shard(path, _IN_USE, sync=True, metasync=True)
    try:
        with env.begin(write=True) as txn:
            for name in SHARD_DATABASES:
                env.open_db(name.encode(), txn=txn, create=True)
            # the cache's creation time, as its other shards have: it is still the same cache
            meta = {"format": STORE_FORMAT, "shard_index": shard_index, "num_shards": manifest.num_shards,
                    "created": manifest.created}
            txn.put(SHARD_META_KEY, pack_plain(meta), db=env.open_db(META_TABLE.encode(), txn=txn))
        txnid = env.info()["last_txnid"]
    finally:
        env.close()
    previous = manifest.shards[shard_index]
    return ShardInfo(file=shard_name(shard_index), size=path.stat().st_size, sha256=file_sha256(path),
                     counts=dict(previous.counts), txnid=txnid)
