"""The two kinds of record in the `msa` table, encoded and decoded.

- A chain's MSA record: the assembled MSA (aligned rows, deletion matrix, row descriptions) and
  its template hits, keyed by sequence key + search fingerprint (searched) or + the alignment
  files' fingerprint (ingested). Featurization reads these.
- A database search record: one database's raw tool output for one sequence, keyed by
  `database_search_key`, so that a later run re-searches only the databases that changed.

Hits are stored as flat index arrays with offsets (one slice per hit) plus their scalar fields
in the metadata, so decoding never unpickles anything.
"""

from __future__ import annotations

import numpy as np

from featurecache.io.hits import TemplateHit
from featurecache.io.msa import Msa
from featurecache.precompute.search import DatabaseSearch
from featurecache.schema import SCHEMA_VERSION
from featurecache.store.codec import decode_record, encode_record

_HIT_SCALARS = (
    "name",
    "index",
    "aligned_cols",
    "sum_probs",
    "e_value",
    "identity",
    "query_start",
    "query_end",
    "hit_start",
    "hit_end",
    "hit_sequence",
    "hit_length",
    "description",
    "source",
)
_DATABASE_SEARCH_SCALARS = (
    "database",
    "tool",
    "role",
    "output_format",
    "num_hits",
    "fingerprint",
    "wall_seconds",
    "tool_version",
)


def encode_msa_record(
    key: str,
    msa: Msa,
    hits: tuple[TemplateHit, ...] | list[TemplateHit],
    meta: dict,
    record_fingerprint: str,
    zstd_level: int,
) -> bytes:
    """One chain's MSA and template hits as a record of the `msa` table."""
    offsets = np.cumsum([0] + [len(hit.query_indices) for hit in hits]).astype(np.int64)
    arrays = {
        "aligned": msa.aligned,
        "deletion_matrix": msa.deletion_matrix.astype(np.int32),
        "hit_offsets": offsets,
        "hit_query_indices": np.concatenate([hit.query_indices for hit in hits]).astype(np.int32)
        if hits
        else np.zeros(0, np.int32),
        "hit_hit_indices": np.concatenate([hit.hit_indices for hit in hits]).astype(np.int32)
        if hits
        else np.zeros(0, np.int32),
    }
    meta = dict(meta)
    meta["descriptions"] = list(msa.descriptions)
    meta["msa_source"] = msa.source
    meta["hits"] = [{name: getattr(hit, name) for name in _HIT_SCALARS} for hit in hits]
    return encode_record(key, arrays, meta, record_fingerprint, "", SCHEMA_VERSION, zstd_level)


def decode_msa_record(blob: bytes, where: str) -> tuple[Msa, list[TemplateHit]]:
    """The MSA and hits of a record written by `encode_msa_record`; `where` names it in errors."""
    record = decode_record(blob, where=where)
    arrays, meta = record.arrays, record.meta
    msa = Msa(arrays["aligned"], arrays["deletion_matrix"], tuple(meta["descriptions"]), meta["msa_source"])
    offsets = arrays["hit_offsets"]
    hits = [
        TemplateHit(
            **fields,
            query_indices=arrays["hit_query_indices"][offsets[i] : offsets[i + 1]],
            hit_indices=arrays["hit_hit_indices"][offsets[i] : offsets[i + 1]],
        )
        for i, fields in enumerate(meta["hits"])
    ]
    return msa, hits


def encode_database_search(key: str, item: DatabaseSearch, zstd_level: int) -> bytes:
    """One database's raw output for one sequence, as a record of the `msa` table."""
    meta = {name: getattr(item, name) for name in _DATABASE_SEARCH_SCALARS}
    meta["command"] = list(item.command)
    text = np.frombuffer(item.text.encode("utf-8"), dtype=np.uint8)
    return encode_record(key, {"text": text}, meta, item.fingerprint, "", SCHEMA_VERSION, zstd_level)


def decode_database_search(blob: bytes, where: str) -> DatabaseSearch:
    """The DatabaseSearch of a record written by `encode_database_search`."""
    record = decode_record(blob, where=where)
    meta = dict(record.meta)
    meta["command"] = tuple(meta["command"])
    return DatabaseSearch(text=record.arrays["text"].tobytes().decode("utf-8"), **meta)
