"""manifest.json: the versioned index of a finished cache, written last and atomically.

Its presence marks a cache (or a published generation) as finished. It names the format
versions, every shard file with its size and sha256, the fingerprints the cache was built with,
record counts per table, and per-record index entries (for feature records: num_tokens,
msa_depth, and the shard; their sampling weights below), so the loader builds its index, length
filter and sampler from this one file instead of reading every record.

Example (abridged)::

    {"format": 1, "record_format": 1, "store_format": 1, "schema_version": 1,
     "created": "2026-12-02T11:00:00+00:00", "updated": "2026-12-02T11:42:10+00:00",
     "generation": null,
     "fingerprints": {"features": "3f2a9c0d1e2b4a5c"},
     "counts": {"msa": 12, "features": 5, "errors": 1},
     "shards": [{"file": "shard-00000.lmdb", "size": 1052672, "sha256": "9b1f...", "txnid": 42,
                 "counts": {"msa": 7, "features": 2, "errors": 0}}, ...],
     "index": {"features": {"7a4d": {"num_tokens": 611, "msa_depth": 4096, "shard": 1}},
               "msa": {"5103de133cfcb380cd8f73983d546251-48caba42797094c4": {"shard": 2}},
               "errors": {}, "sampling": {...}, "excluded": {...}}}

Precompute lists every record it writes (an msa record's entry holds only its shard), so that
verify names, and precompute --recheck recomputes, the records of a shard found unreadable.

A shard's "txnid" is LMDB's last committed transaction when the manifest was written (absent in
manifests written before it was recorded): a writer that finds it unchanged, with the same size,
keeps the shard's sha256 instead of reading the whole file again.

Besides one table per shard table, the index holds tables computed over the whole cache when it
was finished, not stored in any shard (precompute passes them to StoreWriter.finish):

``index["sampling"]``: AlphaFold 3's weighted PDB sampling (SI 2.5.1, eq. 1), per target id::

    {"weight": 18.0,                       # sum of the chain and interface weights below
     "chains": [{"chain_id": "A",          # label_asym_id, as the record's meta "chain_ids"
                 "asym_id": 1,             # the record's asym_id (1-based chain number)
                 "molecule_type": "protein",   # protein | dna | rna | ligand
                 "cluster": "protein:841f33346a74",
                 "weight": 0.5}, ...],     # beta_chain / N_clust * alpha(type)
     "interfaces": [{"chains": [1, 4],     # the two chains' asym_ids, ascending
                     "cluster": "protein:841f33346a74|protein:841f33346a74",
                     "weight": 6.0}, ...]}  # beta_interface / N_clust * (alpha(a) + alpha(b))

Every chain of the record is listed, in asym_id order; an interface is a chain pair with heavy
atoms closer than 5 Angstrom. N_clust is the number of chains (interfaces) of the whole cache
that share the item's cluster, so it is the count of that cluster id over this table. Drawing
a target by "weight", then one of its items by the items' weights, draws each item with its own
weight. `Manifest.targets` merges these fields into the feature entries, so a loader reading
targets[id]["weight"] gets the cluster weight (and 1.0 is the default where there is none).
Caches built with clustering off have no "sampling" table. fingerprints["sampling"] names the
clustering inputs and settings it was computed from.

``index["excluded"]``: targets curation left out as a whole (no feature record), per target id:
{"reason": "resolution", "message": "...", "input_hash": "...", "fingerprint": "..."}.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from featurecache.config import file_sha256
from featurecache.schema import FEATURES_TABLE, RECORD_FORMAT, SCHEMA_VERSION
from featurecache.store.files import write_atomic
from featurecache.store.layout import SHARD_PATTERN, STORE_FORMAT, has_shard_files, shard_name

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.json"
# Index tables computed over the whole cache at finish, kept in the manifest only.
SAMPLING_TABLE = "sampling"
EXCLUDED_TABLE = "excluded"


class CacheNotFinishedError(ValueError):
    """A cache folder whose writer has not finished (no manifest.json yet)."""

    @classmethod
    def for_folder(cls, cache_dir: Path) -> CacheNotFinishedError:
        return cls(
            f"{cache_dir} has shard files but no {MANIFEST_NAME}: the cache is not finished "
            f"(a writer is running or was interrupted); rerun precompute to finish it"
        )


@dataclass(frozen=True)
class ShardInfo:
    file: str  # file name inside the cache folder
    size: int
    sha256: str
    counts: dict[str, int]
    txnid: int | None = None  # LMDB's last committed transaction then; None if not recorded


@dataclass(frozen=True)
class Manifest:
    path: Path
    schema_version: int
    created: str
    updated: str
    shards: tuple[ShardInfo, ...]
    fingerprints: dict[str, str]
    counts: dict[str, int]
    index: dict[str, dict[str, dict[str, Any]]]  # table -> key -> entry (with "shard")
    generation: str | None = None  # set in published generations
    format: int = MANIFEST_FORMAT
    record_format: int = RECORD_FORMAT
    store_format: int = STORE_FORMAT

    @property
    def cache_dir(self) -> Path:
        return self.path.parent

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def targets(self) -> dict[str, dict[str, Any]]:
        """Feature records' index entries with their sampling fields merged in: target id ->
        {num_tokens, msa_depth, shard, ..., weight, chains, interfaces}."""
        features = self.index.get(FEATURES_TABLE, {})
        sampling = self.index.get(SAMPLING_TABLE)
        if not sampling:
            return features
        return {target_id: {**entry, **sampling.get(target_id, {})} for target_id, entry in features.items()}

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies the index, a copy of every entry per target.
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "path"}
        data["shards"] = [dataclasses.asdict(shard) for shard in self.shards]
        return data


def utc_now() -> str:
    """The time stamp of manifests and shard meta entries: UTC, ISO 8601, whole seconds."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def save_manifest(manifest: Manifest, directory: str | os.PathLike) -> Manifest:
    """Write `manifest` as directory/manifest.json atomically; returns it with its new path."""
    path = Path(directory) / MANIFEST_NAME
    manifest = dataclasses.replace(manifest, path=path)

    def write(handle) -> None:
        # json.dump streams the text; json.dumps would hold it whole, and all its pieces, at once
        json.dump(manifest.to_json(), handle, indent=1, sort_keys=True, allow_nan=False)
        handle.write("\n")

    write_atomic(path, write)
    return manifest


def shard_info(
    path: Path, counts: Mapping[str, int], txnid: int | None = None, previous: ShardInfo | None = None
) -> ShardInfo:
    """The manifest entry of a closed shard file. Its sha256 is `previous`'s (the last manifest's
    entry) when LMDB's last transaction and the size are those it recorded: a rerun that changed
    nothing then does not read the whole cache again (56 GiB at PDB scale). A file changed
    outside LMDB keeps the old digest, so verify still names it."""
    size = path.stat().st_size
    unchanged = previous is not None and txnid is not None and (previous.txnid, previous.size) == (txnid, size)
    return ShardInfo(
        file=path.name,
        size=size,
        sha256=previous.sha256 if unchanged else file_sha256(path),
        counts=dict(counts),
        txnid=txnid,
    )


def check_shard_file(path: Path, info: ShardInfo) -> str | None:
    """What is wrong with the shard file at `path` compared with its manifest entry, or None."""
    if not path.is_file():
        return "file is missing"
    size = path.stat().st_size
    if size != info.size:
        return f"size is {size} bytes, manifest says {info.size}"
    digest = file_sha256(path)
    if digest != info.sha256:
        return f"sha256 is {digest}, manifest says {info.sha256}"
    return None


def write_manifest(
    cache_dir: str | os.PathLike,
    summaries: Sequence[Mapping[str, Any]],
    fingerprints: Mapping[str, str],
    schema_version: int | None = None,
    created: str | None = None,
    derived_index: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    previous: Manifest | None = None,
) -> Manifest:
    """Build and atomically write the manifest of a cache whose shard files are closed.

    `summaries[i]` is shard i's {"counts": {table: n}, "index": {table: {key: entry}},
    "txnid": LMDB's last transaction} (ShardWriter.summary()). `derived_index` adds index tables
    computed over the whole cache ("sampling", "excluded"; see the module docstring). `previous`,
    the cache's last manifest, lends its digests to unchanged shards (shard_info). Call only while
    holding the shard locks (StoreWriter.finish does).
    """
    cache_dir = Path(cache_dir)
    previous_shards = {} if previous is None else {shard.file: shard for shard in previous.shards}
    shards, counts, index = [], {}, {}
    for shard_index, summary in enumerate(summaries):
        path = cache_dir / shard_name(shard_index)
        shards.append(shard_info(path, summary["counts"], summary.get("txnid"), previous_shards.get(path.name)))
        for table, count in summary["counts"].items():
            counts[table] = counts.get(table, 0) + count
        for table, entries in summary["index"].items():
            table_index = index.setdefault(table, {})
            for key, entry in entries.items():
                table_index[key] = {**entry, "shard": shard_index}
    for table, entries in (derived_index or {}).items():
        if table in index:
            raise ValueError(f"derived index table {table!r} has the name of a shard table")
        index[table] = {str(key): dict(entry) for key, entry in entries.items()}
    manifest = Manifest(
        path=cache_dir / MANIFEST_NAME,
        schema_version=SCHEMA_VERSION if schema_version is None else int(schema_version),
        created=created or utc_now(),
        updated=utc_now(),
        shards=tuple(shards),
        fingerprints={str(name): str(value) for name, value in fingerprints.items()},
        counts=counts,
        index=index,
    )
    return save_manifest(manifest, cache_dir)


def _require(data: Mapping, field: str, kind, path: Path):
    if field not in data:
        raise ValueError(f"{path} has no {field!r} field: not a featurecache manifest or damaged")
    value = data[field]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{path}: field {field!r} is {type(value).__name__}, expected {kind}")
    return value


def _parse_shards(raw: list, path: Path) -> tuple[ShardInfo, ...]:
    shards = []
    for position, entry in enumerate(raw):
        where = f"{path} shards[{position}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        file = _require(entry, "file", str, path)
        match = SHARD_PATTERN.match(file)
        if match is None or int(match.group(1)) != position:
            raise ValueError(f"{where} names {file!r}, expected {shard_name(position)}")
        shards.append(
            ShardInfo(
                file=file,
                size=_require(entry, "size", int, path),
                sha256=_require(entry, "sha256", str, path),
                counts=_require(entry, "counts", dict, path),
                txnid=entry["txnid"] if isinstance(entry.get("txnid"), int) else None,
            )
        )
    if not shards:
        raise ValueError(f"{path} lists no shards")
    return tuple(shards)


def read_manifest(cache_dir: str | os.PathLike, expected_schema: int | None = SCHEMA_VERSION) -> Manifest:
    """Read and validate cache_dir/manifest.json.

    Raises FileNotFoundError for a missing folder, CacheNotFinishedError (a ValueError) for a
    cache without a manifest, and ValueError naming the file and the field for anything else.
    `expected_schema=None` accepts any feature schema version (for verify and stats).
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / MANIFEST_NAME
    if not cache_dir.is_dir():
        raise FileNotFoundError(f"cache folder {cache_dir} does not exist")
    if not path.is_file():
        if has_shard_files(cache_dir):
            raise CacheNotFinishedError.for_folder(cache_dir)
        raise ValueError(f"{cache_dir} is not a featurecache cache: it has no {MANIFEST_NAME}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    for field, expected in (
        ("format", MANIFEST_FORMAT),
        ("record_format", RECORD_FORMAT),
        ("store_format", STORE_FORMAT),
    ):
        found = _require(data, field, int, path)
        if found != expected:
            raise ValueError(f"{path} has {field} {found}, expected {expected}")
    schema_version = _require(data, "schema_version", int, path)
    if expected_schema is not None and schema_version != expected_schema:
        raise ValueError(
            f"{path} has schema_version {schema_version}, expected {expected_schema}: the cache was built by "
            f"another featurecache version; rerun `featurecache precompute` into it (it recomputes those records)"
        )
    index = _require(data, "index", dict, path)
    for table, entries in index.items():
        if not isinstance(entries, dict) or not all(isinstance(entry, dict) for entry in entries.values()):
            raise ValueError(f"{path}: index of table {table!r} is not a map of objects")
    generation = data.get("generation")
    if generation is not None and not isinstance(generation, str):
        raise ValueError(f"{path}: field 'generation' is {type(generation).__name__}, expected str")
    return Manifest(
        path=path,
        schema_version=schema_version,
        created=_require(data, "created", str, path),
        updated=_require(data, "updated", str, path),
        shards=_parse_shards(_require(data, "shards", list, path), path),
        fingerprints=_require(data, "fingerprints", dict, path),
        counts=_require(data, "counts", dict, path),
        index=index,
        generation=generation,
    )
