"""`featurecache verify --repair`: bring shard files back in line with the manifest, losing no record.

verify compares every shard file's sha256 with the manifest's. Bytes changed where no record
lies (a free page, the unused part of a page, bytes appended to the file) leave every record
intact but the digest wrong, and a rerun that leaves the shard unchanged keeps that digest, so
verify would keep failing. `repair_cache` takes every shard lock (no writer runs meanwhile) and:

- rewrites each shard whose file differs from the manifest while all its records are intact
  (VerifyReport.shards_to_rewrite): rewrite.py copies every entry of every table, through LMDB,
  into a fresh file that takes the old one's place, and the manifest gets its new size, sha256
  and transaction id (readers keep reading throughout; rewrite.py says how);
- moves each shard that is missing or that LMDB cannot read aside (`<shard>.unreadable-<time>`,
  with its -lock file) and puts an empty shard in its place. Its records are lost: the manifest
  still lists them, so verify names them as missing until precompute recomputes them from the
  inputs;
- leaves shards with damaged records alone: precompute --recheck recomputes those records, then
  rewrites such a shard the same way.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

from featurecache.config import file_sha256
from featurecache.store.codec import pack_plain
from featurecache.store.files import fsync_dir
from featurecache.store.layout import META_TABLE, SHARD_DATABASES, SHARD_META_KEY, STORE_FORMAT, open_shard, shard_name
from featurecache.store.locks import ShardLock
from featurecache.store.manifest import Manifest, ShardInfo, read_manifest, save_manifest, utc_now
from featurecache.store.rewrite import IN_USE, rewrite_shard
from featurecache.store.update_marker import read_update_marker
from featurecache.store.verify import VerifyReport, verify_cache

_UNREADABLE_SUFFIX = ".unreadable-"


@dataclass
class RepairReport:
    cache_dir: Path
    rewritten: list[str] = field(default_factory=list)  # shard files rewritten from their records
    set_aside: dict[str, str] = field(default_factory=dict)  # unreadable shard file -> where it was moved
    left: list[str] = field(default_factory=list)  # shards with damaged records (precompute --recheck)
    after: VerifyReport | None = None  # verify of the repaired cache

    def to_dict(self) -> dict:
        return {
            "rewritten": self.rewritten,
            "set_aside": self.set_aside,
            "left": self.left,
            "verify": None if self.after is None else self.after.to_dict(),
        }

    def format(self) -> str:
        lines = [f"rewrote {shard} from its records" for shard in self.rewritten]
        lines += [
            f"moved unreadable {shard} to {aside} and put an empty shard in its place; its records "
            f"must be recomputed from the inputs"
            for shard, aside in self.set_aside.items()
        ]
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
        raise ValueError(
            f"{cache_dir} is the published generation {manifest.generation}: generations are never "
            f"written; repair the cache it was published from and publish it again"
        )
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


def _set_aside(path: Path) -> Path:
    """Move an unreadable shard file (and LMDB's lock file beside it) out of the cache's way."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
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
    env = open_shard(path, IN_USE, sync=True, metasync=True)
    try:
        with env.begin(write=True) as txn:
            for name in SHARD_DATABASES:
                env.open_db(name.encode(), txn=txn, create=True)
            # the cache's creation time, as its other shards have: it is still the same cache
            meta = {
                "format": STORE_FORMAT,
                "shard_index": shard_index,
                "num_shards": manifest.num_shards,
                "created": manifest.created,
            }
            txn.put(SHARD_META_KEY, pack_plain(meta), db=env.open_db(META_TABLE.encode(), txn=txn))
        txnid = env.info()["last_txnid"]
    finally:
        env.close()
    previous = manifest.shards[shard_index]
    return ShardInfo(
        file=shard_name(shard_index),
        size=path.stat().st_size,
        sha256=file_sha256(path),
        counts=dict(previous.counts),
        txnid=txnid,
    )
