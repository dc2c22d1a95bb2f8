"""`precompute --recheck`: read in full every record a rerun would keep, and treat a damaged one as stale.

A rerun decides that a feature record is current from its header entry, and that an MSA or
conformer record is there from its key, without checking the records' arrays. With `recheck`
(`--recheck`) it also reads in full every record it would keep (features, msa, conformers: the
checksum of every byte and every array decoded, as verify does) and treats a damaged one as
stale: a damaged feature record is recomputed; a damaged MSA or conformer record is recomputed
with every target whose chains or CCD codes use it (found by parsing the targets the run would
otherwise skip), the search re-run for that chain only. The summary counts what was found
damaged and what was rewritten; a damaged record no input of the run uses stays, and is named.
It also hashes every shard file before writing: one that no longer matches the last manifest
(damage outside LMDB, perhaps where no record lies, which no record's checksum shows) is
rewritten from its entries when the run finishes (StoreWriter.finish, store/rewrite.py), after
its damaged records were recomputed, so the cache verifies again.

`Recheck` holds one run's damaged keys and counts; the driver (pipeline.PipelineRun) asks it
which records are damaged and tells it which it rewrote.
"""

from __future__ import annotations

import logging
from pathlib import Path

from featurecache.config import ChemConfig
from featurecache.precompute import tasks
from featurecache.precompute.conformers import keys_of
from featurecache.precompute.report import PrecomputeSummary
from featurecache.precompute.search import SEQUENCE_KEY_CHARS, SearchPlan, database_search_key, sequence_key
from featurecache.precompute.tasks import ChainSequence, TargetInput, TaskError
from featurecache.schema import CONFORMERS_TABLE, FEATURES_TABLE, MSA_TABLE
from featurecache.store.codec import CorruptRecordError, RecordFormatError, decode_record
from featurecache.store.layout import shard_name
from featurecache.store.manifest import read_manifest
from featurecache.store.writer import StoreWriter

__all__ = ["RECHECKED_TABLES", "Recheck"]

log = logging.getLogger(__name__)

RECHECKED_TABLES = (FEATURES_TABLE, MSA_TABLE, CONFORMERS_TABLE)  # what --recheck reads in full
_DEPENDENCY_TABLES = (MSA_TABLE, CONFORMERS_TABLE)  # records feature records are computed from


class Recheck:
    """One --recheck run's damaged records: found by `intact`, until the driver rewrites (or,
    for a feature record, deletes) them, which it reports to `rewritten`. Counts go to the
    run's summary (rechecked, damaged, recomputed)."""

    def __init__(self, writer: StoreWriter, summary: PrecomputeSummary, cache_dir: Path) -> None:
        self.writer = writer
        self.summary = summary
        self.cache_dir = cache_dir
        # keys of records read in full and found damaged, until rewritten
        self.damaged: dict[str, set[str]] = {table: set() for table in RECHECKED_TABLES}
        summary.recheck = True
        # shards changed outside LMDB, hashed before the run writes: rewritten when it finishes
        self.shards_to_rewrite = writer.shards_changed_outside()
        for shard_index in self.shards_to_rewrite:
            log.warning(
                "--recheck: %s differs from the manifest (size or sha256) though no writer changed it; "
                "it is rewritten from its records when the run finishes",
                cache_dir / shard_name(shard_index),
            )

    def intact(self, table: str, key: str) -> bool:
        """Read the record in full as verify does (every byte's checksum, every array decoded);
        a damaged one (or one of another record format) is noted, to be recomputed."""
        blob = self.writer.get(table, key)
        if blob is None:
            return True
        self.summary.rechecked += 1
        try:
            decode_record(blob, where=f"{self.cache_dir}/{table}", key=key)
            return True
        except (CorruptRecordError, RecordFormatError) as error:
            log.warning("--recheck: %s; recomputing it", error)
            self.damaged[table].add(key)
            self.summary.damaged[table] = self.summary.damaged.get(table, 0) + 1
            return False

    def read_dependency_tables(self) -> None:
        """Read every msa and conformers record in full (feature records are read as their
        targets are looked at). One the last manifest lists that is gone (its shard was
        unreadable and set aside by `verify --repair`) counts as damaged too."""
        listed = _last_index(self.cache_dir)
        for table in _DEPENDENCY_TABLES:
            present = self.writer.keys(table)
            for key in present:
                self.intact(table, key)
            for key in sorted(set(listed.get(table, ())) - set(present)):
                log.warning("--recheck: %s/%s is listed in the last manifest but missing; recomputing it", table, key)
                self.damaged[table].add(key)
                self.summary.damaged[table] = self.summary.damaged.get(table, 0) + 1

    def dependencies_damaged(self) -> bool:
        """Whether an msa or conformers record was found damaged (and is not rewritten yet)."""
        return any(self.damaged[table] for table in _DEPENDENCY_TABLES)

    def is_damaged(self, table: str, key: str) -> bool:
        """Whether the stored record (table, key) was found damaged and is not rewritten yet."""
        return key in self.damaged.get(table, ())

    def search_damaged(self, chain: ChainSequence, search_plan: SearchPlan) -> bool:
        """Whether a record of the chain's search (its MSA, a database's raw output) is damaged."""
        return any(key in self.damaged[MSA_TABLE] for key in _search_keys(chain, search_plan))

    def rewritten(self, table: str, key: str) -> None:
        """The driver wrote (or deleted) the record: one found damaged counts as recomputed."""
        damaged = self.damaged.get(table)
        if damaged is not None and key in damaged:
            damaged.discard(key)
            self.summary.recomputed[table] = self.summary.recomputed.get(table, 0) + 1

    def left(self) -> list[str]:
        """ "table/key" of every record still damaged (its recompute failed, or no input uses it)."""
        return sorted(f"{table}/{key}" for table, keys in self.damaged.items() for key in keys)

    def users_of_damaged_records(
        self, current: list[tuple[TargetInput, dict]], runner, pipeline_config, chem: ChemConfig
    ) -> list[TargetInput]:
        """Of the targets whose feature records are current and intact, those whose chains or
        CCD codes use a damaged msa or conformer record (parsed again, with the driver's
        `runner` factory, to find out): they are recomputed, and with them the damaged records,
        so they no longer count as skipped."""
        damaged_msa, damaged_conformers = self.damaged[MSA_TABLE], self.damaged[CONFORMERS_TABLE]
        search_plan = SearchPlan(pipeline_config) if pipeline_config is not None else None
        damaged_sequences = {
            key[:SEQUENCE_KEY_CHARS] for key in damaged_msa if key[SEQUENCE_KEY_CHARS : SEQUENCE_KEY_CHARS + 1] == "-"
        }
        users: set[str] = set()

        def listed(stage: str, target_id: str, result) -> None:
            if isinstance(result, TaskError):
                return  # it parsed when its record was written: left as it is
            chains, codes = result
            for chain in chains:
                if search_plan is not None:
                    uses_damaged = self.search_damaged(chain, search_plan)
                else:  # ingested: the key's second half fingerprints the alignment files
                    uses_damaged = sequence_key(chain.molecule_type, chain.sequence) in damaged_sequences
                if uses_damaged:
                    users.add(target_id)
            if damaged_conformers and any(key in damaged_conformers for key in keys_of(codes, chem).values()):
                users.add(target_id)

        parse = runner(listed, lambda *_: None, len(current), "recheck", "target")
        for target, _ in current:
            parse.submit("parse", target.target_id, tasks.dependencies, target, chem)
        parse.drain()
        todo = [target for target, _ in current if target.target_id in users]
        self.summary.stages["featurize"].skipped -= len(todo)
        return todo


def _last_index(cache_dir: Path) -> dict:
    """The last finished manifest's index (table -> key -> entry); empty if there is none."""
    try:
        return read_manifest(cache_dir, expected_schema=None).index
    except (OSError, ValueError):
        return {}


def _search_keys(chain: ChainSequence, search_plan: SearchPlan) -> list[str]:
    """The msa keys of a chain's search: its MSA record, then each database's raw output."""
    seq_key = sequence_key(chain.molecule_type, chain.sequence)
    databases = sum(search_plan.databases(chain.molecule_type), ())
    return [
        search_plan.msa_key(chain.molecule_type, chain.sequence),
        *(database_search_key(seq_key, search_plan.database_fingerprint(database)) for database in databases),
    ]
