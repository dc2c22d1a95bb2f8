"""verify_cache: decode and checksum every record; compare every shard file with the manifest.

Damage is reported, never raised: the report names each damaged key with its table and shard
(a record's header entry, layout.HEADER_TABLES, must match the record's header),
and each shard whose file no longer matches the manifest (size, sha256, counts) or cannot be
opened. Only a cache that cannot be read at all (missing folder, no or invalid manifest) raises.
Bytes flipped inside a record are caught by the record checksum; a flip in LMDB's own page
structure or where no record lies (a free page, the unused part of a page, bytes appended to the
file) shows up as a sha256 mismatch, and LMDB reports most damaged structure pages as corrupt.

A damaged report ends with the command that repairs it (VerifyReport.repair):
`featurecache verify --repair` (repair.py) when only shard files differ from the manifest while
their records are intact (it rewrites them), or when a shard is unreadable (it moves it aside;
precompute --recheck then recomputes its records); precompute --recheck when records are damaged
or missing (a plain rerun keeps a damaged record its header entry says is current; --recheck
recomputes it and rewrites any shard file changed outside LMDB).

During an update, or after an interrupted one (update_marker.py), the last finished manifest
still lists the records but no longer describes the shard files: their sizes, checksums, record
counts and index entries are not compared (the report says why), every record is still checked
by its CRC, and a record the manifest lists must still be there unless the update deleted it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from featurecache.schema import TABLES
from featurecache.store.codec import (
    CorruptRecordError,
    Record,
    RecordFormatError,
    decode_record,
    pack_plain,
    read_header,
    unpack_plain,
)
from featurecache.store.layout import ShardTruncatedError, header_table, index_table, open_shard, shard_of
from featurecache.store.manifest import MANIFEST_NAME, Manifest, check_shard_file, read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.update_marker import MARKER_NAME, UpdateMarker, read_update_marker


# The last line of a report naming damaged records: precompute --recheck reads every record it
# keeps in full and recomputes the damaged ones (a plain rerun decides from header entries alone).
REPAIR_HINT = (
    "to repair: run `featurecache precompute` again with the same inputs and options plus --recheck "
    "(it recomputes the damaged records and rewrites any damaged shard file), then verify again"
)

# ShardProblem.kind: what is wrong with a shard file, which decides its repair.
FILE_CHANGED = "file"  # size or sha256 differs from the manifest's: `verify --repair` rewrites it
UNREADABLE = "unreadable"  # missing, or LMDB cannot open or read it: its records must be recomputed
COUNTS = "counts"  # a table holds more or fewer records than the manifest says


def rewrite_hint(cache_dir: Path) -> str:
    """The repair of shard files that differ from the manifest while every record in them is intact."""
    return (
        f"to repair: run `featurecache verify --repair {cache_dir}` (it rewrites each such shard from its "
        f"records, all intact), then verify again"
    )


def unreadable_hint(cache_dir: Path) -> str:
    """The repair of a shard file that is missing or that LMDB cannot read: its records are lost."""
    return (
        f"to repair: run `featurecache verify --repair {cache_dir}` (it moves each unreadable shard aside "
        f"and puts an empty one in its place), then `featurecache precompute` again with the same inputs "
        f"and options plus --recheck (it recomputes the records that shard held), then verify again"
    )


@dataclass(frozen=True)
class DamagedRecord:
    table: str
    key: str
    shard: str  # shard file name
    reason: str


@dataclass(frozen=True)
class ShardProblem:
    shard: str
    reason: str
    kind: str = FILE_CHANGED  # FILE_CHANGED, UNREADABLE or COUNTS


@dataclass
class VerifyReport:
    cache_dir: Path
    records_checked: dict[str, int] = field(default_factory=dict)  # table -> records decoded
    damaged: list[DamagedRecord] = field(default_factory=list)
    shard_problems: list[ShardProblem] = field(default_factory=list)
    update: str | None = None  # an update in progress or interrupted, in one line

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.shard_problems

    def shards_to_rewrite(self) -> list[str]:
        """Shards whose file differs from the manifest while every record in them is intact: the
        damage lies where no record is (a free page, a page's unused part, bytes appended)."""
        problems: dict[str, set[str]] = {}
        for problem in self.shard_problems:
            problems.setdefault(problem.shard, set()).add(problem.kind)
        with_damaged_records = {record.shard for record in self.damaged}
        return sorted(
            shard for shard, kinds in problems.items() if kinds == {FILE_CHANGED} and shard not in with_damaged_records
        )

    def unreadable_shards(self) -> list[str]:
        return sorted({problem.shard for problem in self.shard_problems if problem.kind == UNREADABLE})

    @property
    def repair(self) -> str | None:
        """The command that repairs what this report names, as one line; None when nothing is damaged."""
        if self.unreadable_shards():  # verify --repair also rewrites the other damaged shards
            return unreadable_hint(self.cache_dir)
        if self.damaged or any(problem.kind == COUNTS for problem in self.shard_problems):
            return REPAIR_HINT  # --recheck also rewrites every shard file changed outside LMDB
        if self.shards_to_rewrite():
            return rewrite_hint(self.cache_dir)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_dir": str(self.cache_dir),
            "ok": self.ok,
            "records_checked": dict(self.records_checked),
            "damaged": [asdict(record) for record in self.damaged],
            "shard_problems": [asdict(problem) for problem in self.shard_problems],
            "update": self.update,
            "repair": self.repair,
        }

    def format(self) -> str:
        checked = ", ".join(f"{table} {count}" for table, count in self.records_checked.items())
        lines = [f"{self.cache_dir}: checked {sum(self.records_checked.values())} records ({checked})"]
        if self.update is not None:
            lines.append(
                f"  note: {self.update}; shard checksums were not compared, every record was checked by its CRC"
            )
        lines += [f"  damaged shard {problem.shard}: {problem.reason}" for problem in self.shard_problems]
        lines += [
            f"  damaged record {record.table}/{record.key} in {record.shard}: {record.reason}"
            for record in self.damaged
        ]
        lines.append(
            "OK" if self.ok else f"DAMAGED: {len(self.damaged)} records, {len(self.shard_problems)} shard problems"
        )
        if self.repair is not None:
            lines.append(self.repair)
        return "\n".join(lines)


def _scan_table(
    reader: StoreReader,
    manifest: Manifest,
    shard_index: int,
    table: str,
    report: VerifyReport,
    update: UpdateMarker | None,
) -> int:
    shard_file = manifest.shards[shard_index].file
    where = f"{reader.shard_paths[shard_index]}/{table}"
    count = 0
    keys = set()
    for key, blob in reader.items(table, shard_index=shard_index):
        count += 1
        keys.add(key)
        try:
            record = decode_record(blob, where=where, key=key)
        except CorruptRecordError as error:
            report.damaged.append(DamagedRecord(table, key, shard_file, error.reason))
            continue
        except RecordFormatError as error:
            report.damaged.append(DamagedRecord(table, key, shard_file, str(error)))
            continue
        if shard_of(key, manifest.num_shards) != shard_index:
            report.damaged.append(
                DamagedRecord(table, key, shard_file, f"belongs in shard {shard_of(key, manifest.num_shards)}")
            )
        problem = _header_entry_problem(reader, table, record)
        if problem is not None:
            report.damaged.append(DamagedRecord(header_table(table), key, shard_file, problem))
    for key in reader.header_keys(table, shard_index):
        if key not in keys:
            report.damaged.append(DamagedRecord(header_table(table), key, shard_file, "header entry without a record"))
    # Index entries carry no checksum of their own: they must parse and agree with the manifest.
    manifest_index = manifest.index.get(table, {})
    indexed = set()
    for key, packed in reader.index_blobs(table, shard_index):
        indexed.add(key)
        try:
            entry = unpack_plain(packed, f"{where} index")
        except ValueError as error:
            report.damaged.append(DamagedRecord(index_table(table), key, shard_file, str(error)))
            continue
        listed = manifest_index.get(key)
        # An update rewrites index entries with their records; the old manifest has the old ones.
        if update is None and listed is not None and {**entry, "shard": shard_index} != listed:
            report.damaged.append(
                DamagedRecord(
                    index_table(table), key, shard_file, f"index entry {entry} differs from the manifest's {listed}"
                )
            )
    listed_here = {key for key, entry in manifest_index.items() if entry.get("shard") == shard_index}
    for key in sorted(listed_here - indexed):
        if reader.get(table, key) is None and not (update is not None and update.was_deleted(table, key)):
            report.damaged.append(DamagedRecord(table, key, shard_file, "listed in the manifest but missing"))
    return count


def _header_entry_problem(reader: StoreReader, table: str, record: Record) -> str | None:
    """Why a record's header entry (a rerun reads it instead of the record) does not stand for
    the record, or None; a record without an entry is fine (its readers read the record)."""
    entry = reader.header_entry(table, record.key)
    if entry is None:
        return None
    try:
        header = read_header(entry, where=f"{reader.where(table, record.key)} header", key=record.key)
    except (CorruptRecordError, RecordFormatError) as error:
        return f"header entry: {error}"
    # packed, so that a NaN in the metadata compares equal to itself
    if pack_plain([header.fingerprint, header.input_hash, header.schema_version, header.meta]) != pack_plain(
        [record.fingerprint, record.input_hash, record.schema_version, record.meta]
    ):
        return "header entry differs from the record's header"
    return None


def verify_cache(cache_dir: str | os.PathLike, check_files: bool = True) -> VerifyReport:
    """Check every record of every table, and (check_files) every shard file against the manifest.

    Raises FileNotFoundError / ValueError only when the cache itself cannot be read.
    """
    cache_dir = Path(cache_dir)
    before = _writer_trace(cache_dir)
    report = _verify(cache_dir, check_files)
    if not report.ok and report.update is None and _writer_trace(cache_dir) != before:
        # A writer opened the cache while it was being checked: what differed may be its changes.
        report = _verify(cache_dir, check_files)
    return report


def _writer_trace(cache_dir: Path) -> tuple:
    """Changes whenever a writer opens the cache (update marker) or finishes (a new manifest file)."""
    try:
        manifest = (cache_dir / MANIFEST_NAME).stat()
    except FileNotFoundError:
        return None, (cache_dir / MARKER_NAME).exists()
    return (manifest.st_ino, manifest.st_mtime_ns), (cache_dir / MARKER_NAME).exists()


def _verify(cache_dir: Path, check_files: bool) -> VerifyReport:
    manifest = read_manifest(cache_dir, expected_schema=None)
    update = read_update_marker(cache_dir)
    report = VerifyReport(
        cache_dir=cache_dir,
        records_checked={table: 0 for table in TABLES},
        update=None if update is None else update.describe(),
    )
    # readahead: verify reads every page in order.
    reader = StoreReader(cache_dir, readahead=True, num_shards=manifest.num_shards)
    try:
        for shard_index, shard in enumerate(manifest.shards):
            path = cache_dir / shard.file
            if not path.is_file():
                report.shard_problems.append(ShardProblem(shard.file, "file is missing", UNREADABLE))
                continue
            if check_files and update is None:
                problem = check_shard_file(path, shard)
                if problem is not None:
                    report.shard_problems.append(ShardProblem(shard.file, problem))
            try:
                truncated = _truncation(path)
                if truncated is not None:
                    report.shard_problems.append(ShardProblem(shard.file, truncated, UNREADABLE))
                    continue
                for table in TABLES:
                    found = _scan_table(reader, manifest, shard_index, table, report, update)
                    report.records_checked[table] += found
                    expected = shard.counts.get(table, 0)
                    if update is None and found != expected:
                        report.shard_problems.append(
                            ShardProblem(
                                shard.file, f"table {table} has {found} records, manifest says {expected}", COUNTS
                            )
                        )
            except (lmdb.Error, ValueError, OSError) as error:
                report.shard_problems.append(ShardProblem(shard.file, f"unreadable: {error}", UNREADABLE))
    finally:
        reader.close()
    return report


def _truncation(path: Path) -> str | None:
    """Why LMDB must not read the shard at `path` (it ends before its last used page); None if it may.

    Checked on an environment of its own, before the reader opens the shard's tables (which reads
    pages); a shard this process already has open was read without harm, so it is not checked."""
    try:
        open_shard(path, "is open in this process", readonly=True, lock=False).close()
    except RuntimeError:
        return None
    except ShardTruncatedError as error:
        return f"unreadable: {error.what}"
    return None
