"""Precompute orchestration: parse inputs, search or ingest alignments, featurize, write.

The driver is the only LMDB writer (one writer per shard, as LMDB requires); the tasks, run on
Ray or inline (ray_executor.py), return encoded records. Every record carries the fingerprint of
what produced it and the hash of its input file: a rerun skips current records, recomputes stale
ones and retries failures. A killed run loses at most the uncommitted batch; `manifest.json` is
written last, so an unfinished cache is never mistaken for a finished one.

Stages: `search` (one task per unique chain sequence, only with a pipeline config),
`conformers` (every CCD code's reference conformer computed once into the `conformers` table;
conformers.py) and `featurize` (one task per target), both on curated structures (curation.py): a target
curation leaves out gets no record and is listed in the manifest's "excluded" table. Failures
become `errors` records and the run carries on. Last, the driver clusters every chain and
interface of the cache and writes AF3's sampling weights into the manifest
(sampling_index.py); feature records are not touched by that, so adding targets re-clusters
without recomputing features.

With `recheck` (`--recheck`) a rerun also reads in full every record it would keep and
recomputes the damaged ones (recheck.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from featurecache.config import ChemConfig, fingerprint
from featurecache.io import inputs
from featurecache.precompute import tasks
from featurecache.precompute.clustering import TargetChains
from featurecache.precompute.conformers import ConformerStage, chem_fingerprint
from featurecache.precompute.plan import (
    PipelineSetupError,
    PrecomputeOptions,
    RunPlan,
    discover_inputs,
    prepare,
)
from featurecache.precompute.ray_executor import TaskRunner, start_ray
from featurecache.precompute.recheck import Recheck
from featurecache.precompute.report import (
    STAGES,
    PrecomputeSummary,
    StageCounts,
    progress_bars,
)
from featurecache.precompute.sampling_index import SamplingIndex
from featurecache.precompute.search import SearchPlan, database_search_key, sequence_key
from featurecache.precompute.tasks import ChainSequence, ExcludedTarget, TargetInput, TaskError
from featurecache.precompute.tools import ToolError
from featurecache.features.featurize import FEATURIZE_REVISION
from featurecache.schema import ERRORS_TABLE, FEATURES_TABLE, MSA_TABLE, SCHEMA_VERSION
from featurecache.store.codec import CorruptRecordError, encode_record, read_header
from featurecache.store.locks import StoreLockedError
from featurecache.store.manifest import Manifest, read_manifest
from featurecache.store.writer import StoreWriteError, StoreWriter

__all__ = [
    "STAGES",
    "CacheWriteError",
    "ClusteringError",
    "PipelineSetupError",
    "PrecomputeOptions",
    "PrecomputeSummary",
    "StageCounts",
    "discover_inputs",
    "precompute",
]

log = logging.getLogger(__name__)

_STDERR_TAIL_CHARS = 2000
_TARGET_STAGES = ("parse", "alignments", "featurize")  # failures counted under "featurize"


class ClusteringError(PipelineSetupError):
    """MMseqs2 failed while clustering the finished records; they stay, a rerun clusters again."""


class CacheWriteError(PipelineSetupError):
    """The cache stopped accepting writes mid-run (disk full, permissions). What was committed
    stays intact and the manifest is not written, so a rerun with space finishes the job."""


# --- the driver ---------------------------------------------------------------------------------


def precompute(options: PrecomputeOptions) -> PrecomputeSummary:
    """Run the whole precompute job; see the module docstring. Raises PipelineSetupError early."""
    started = time.perf_counter()
    plan = prepare(options)
    summary = PrecomputeSummary(cache_dir=str(options.cache_dir))
    # Curation changes what is featurized, so its settings are part of every record's fingerprint.
    chem = plan.chem
    try:  # the CCD's content and the conformer settings change atoms and ref_pos
        chem_identity = chem_fingerprint(chem)
    except (ValueError, OSError) as error:
        raise PipelineSetupError(f"--ccd / [chem] ccd_path: {error}") from None
    feature_fingerprint = fingerprint(
        plan.feature_config.fingerprint_fields(),
        SCHEMA_VERSION,
        plan.mode_fingerprint,
        dataclasses.asdict(plan.curation),
        chem_identity,
        {"featurize_revision": FEATURIZE_REVISION},
    )
    try:
        writer = StoreWriter(options.cache_dir, plan.store_config)
    except StoreLockedError as error:
        raise PipelineSetupError(str(error)) from None
    except (OSError, ValueError) as error:
        raise PipelineSetupError(f"--cache {options.cache_dir}: {error}") from None
    try:
        run = PipelineRun(options, plan, writer, feature_fingerprint, summary, chem)
        run.run()
        derived_index, sampling_fingerprints = run.sampling_tables()
        fingerprints = {
            "features": feature_fingerprint,
            "feature_config": plan.feature_config.config_fingerprint(),
            "mode": plan.mode_fingerprint,
            **sampling_fingerprints,
        }
        writer.finish(
            fingerprints=fingerprints,
            schema_version=SCHEMA_VERSION,
            derived_index=derived_index,
            rewrite_shards=run.recheck.shards_to_rewrite if run.recheck is not None else (),
        )
    except (StoreWriteError, OSError) as error:
        raise CacheWriteError(f"--cache {options.cache_dir}: {error}") from None
    finally:
        try:
            writer.close()
        except (StoreWriteError, OSError) as error:
            log.error("closing %s: %s", options.cache_dir, error)
    summary.seconds = time.perf_counter() - started
    return summary


class PipelineRun:
    """One run's driver: picks the targets to do, runs the stages, writes every result.

    Its public methods are the seam other drivers build on: the conformer stage
    (conformers.ConformerStage) calls runner, kept, put, record_failure and timed_write; `featurecache
    search` (search_command.py) subclasses it, runs start_executor and search_stage alone and
    overrides exclude (a target curation leaves out)."""

    def __init__(
        self,
        options: PrecomputeOptions,
        plan: RunPlan,
        writer: StoreWriter,
        feature_fingerprint: str,
        summary: PrecomputeSummary,
        chem: ChemConfig = ChemConfig(),
    ) -> None:
        self.options = options
        self.plan = plan
        self.writer = writer
        self.feature_fingerprint = feature_fingerprint
        self.summary = summary
        self.attempts = _previous_attempts(writer)  # error key -> attempts so far
        self.progress = progress_bars(options.progress)
        self.ray = None
        self.max_in_flight = 1
        self.conformers = ConformerStage(self, chem)
        # --recheck: the records read in full and found damaged, until rewritten (see put)
        self.recheck = Recheck(writer, summary, options.cache_dir) if options.recheck else None
        self.sampling = SamplingIndex(plan.clustering, plan.mmseqs, plan.tmp_dir, _last_manifest(options.cache_dir))

    def run(self) -> None:
        if self.recheck is not None:
            self.recheck.read_dependency_tables()
        todo, current = self._targets_to_do()
        if self.recheck is not None and self.recheck.dependencies_damaged() and current:
            self.start_executor()
            todo += self.recheck.users_of_damaged_records(
                current, self.runner, self.plan.pipeline_config, self.conformers.chem
            )
        try:
            if not todo:
                return
            self.start_executor()
            self._run_stages(todo)
        finally:
            if self.recheck is not None:
                self.summary.damaged_left = self.recheck.left()

    def _run_stages(self, todo: list[TargetInput]) -> None:
        chain_keys: dict[str, dict[str, str]] = {}
        if self.plan.pipeline_config is not None:
            todo, chain_keys = self.search_stage(todo)
        conformer_codes = self.conformers.prepare(todo, tasks.conformer_codes)
        self._featurize_stage(todo, chain_keys, conformer_codes)

    def sampling_tables(self) -> tuple[dict, dict]:
        """The manifest's "sampling" and "excluded" tables and their fingerprints (sampling_index.py)."""
        started = time.perf_counter()
        try:
            tables = self.sampling.tables(self.writer)
        except ToolError as error:
            raise ClusteringError(
                f"--cache {self.options.cache_dir}: clustering failed (the feature records are "
                f"kept; rerun to retry): {error}"
            ) from None
        self.summary.clustered = self.sampling.clustered
        self.summary.cluster_seconds = time.perf_counter() - started
        return tables

    # --- bookkeeping ---

    def put(self, table: str, key: str, blob: bytes, index=None) -> None:
        """Write a record (writer.put); one --recheck found damaged counts as recomputed.

        Every record gets an index entry ({} where there is nothing to index: msa records), so the
        manifest lists every key: a record lost with an unreadable shard is then named by verify
        and recomputed by --recheck, wherever its key happens to place it."""
        self.writer.put(table, key, blob, index={} if index is None else index)
        if self.recheck is not None:
            self.recheck.rewritten(table, key)

    def kept(self, table: str, key: str) -> bool:
        """Whether the run keeps the stored record (table, key) rather than computing it: it is
        there, and (--recheck) was not found damaged."""
        return not self._damaged(table, key) and self.writer.get(table, key) is not None

    def _damaged(self, table: str, key: str) -> bool:
        return self.recheck is not None and self.recheck.is_damaged(table, key)

    @contextmanager
    def timed_write(self):
        started = time.perf_counter()
        yield
        self.summary.write_seconds += time.perf_counter() - started

    def record_failure(
        self, stage: str, key: str, message: str, stderr_tail: str = "", target: str | None = None
    ) -> None:
        self.summary.stages["featurize" if stage in _TARGET_STAGES else stage].failed += 1
        self.summary.failures.append({"stage": stage, "key": key, "message": message})
        error_key = f"{stage}/{key}"
        count = self.attempts.get(error_key, 0) + 1
        with self.timed_write():
            self.writer.put(
                ERRORS_TABLE,
                error_key,
                _error_blob(stage, key, message, stderr_tail, count, target),
                index={"stage": stage, "attempts": count},
            )

    def _clear_errors(self, key: str, stages) -> None:
        for stage in stages:
            if f"{stage}/{key}" in self.attempts:
                self.writer.delete(ERRORS_TABLE, f"{stage}/{key}")

    def _targets_to_do(self) -> tuple[list[TargetInput], list[tuple[TargetInput, dict]]]:
        """The inputs whose feature records are missing or stale (or failed, with retry_failed;
        or damaged, with --recheck), and the others' with their current records' metadata."""
        todo: list[TargetInput] = []
        current_targets: list[tuple[TargetInput, dict]] = []
        for path in self.plan.inputs:
            target_id = inputs.target_id_for(path)
            try:
                input_hash = inputs.input_sha256(path)  # an AF3 JSON's MSA / template files too
            except OSError as error:
                self.record_failure("parse", target_id, f"{path}: cannot read: {error.strerror}")
                continue
            self.summary.targets += 1
            target = TargetInput(str(path), target_id, input_hash)
            failed_before = any(f"{stage}/{target_id}" in self.attempts for stage in ("parse", "featurize"))
            current = _current_meta(self.writer, target, self.feature_fingerprint)
            damaged = (
                current is not None and self.recheck is not None and not self.recheck.intact(FEATURES_TABLE, target_id)
            )
            if current is not None and not damaged:
                self.sampling.add(TargetChains.from_meta(target_id, current))
                current_targets.append((target, current))
                self.summary.stages["featurize"].skipped += 1
            elif not damaged and self.sampling.was_excluded(target_id, input_hash, self.feature_fingerprint):
                self.sampling.carry_excluded(target_id)
                self.summary.stages["featurize"].skipped += 1
            elif failed_before and not self.options.retry_failed and not damaged:
                self.summary.stages["featurize"].skipped += 1
            else:
                todo.append(target)
        return todo, current_targets

    def exclude(self, excluded: ExcludedTarget) -> None:
        """A target curation leaves out: no feature record (an old one goes), listed in the manifest."""
        with self.timed_write():
            if self.writer.get(FEATURES_TABLE, excluded.target_id) is not None:
                self.writer.delete(FEATURES_TABLE, excluded.target_id)
                if self.recheck is not None:  # gone, with its damage
                    self.recheck.rewritten(FEATURES_TABLE, excluded.target_id)
            self._clear_errors(excluded.target_id, _TARGET_STAGES)
        self.sampling.exclude(excluded, self.feature_fingerprint)
        self.summary.excluded += 1

    def start_executor(self) -> None:
        if self.ray is not None:  # already started (--recheck parses before the stages)
            return
        cpus = 1
        if self.options.executor == "ray":
            try:
                self.ray = start_ray(self.options.address, self.options.num_workers, self.options.verbose)
            except (ConnectionError, ValueError, RuntimeError) as error:
                raise PipelineSetupError(
                    f"cannot start or join Ray (address={self.options.address!r}): {error}"
                ) from None
            cpus = max(1, int(self.ray.available_resources().get("CPU", 1)))
        self.max_in_flight = self.options.max_in_flight or 4 * cpus

    def runner(self, on_result, on_crash, total: int, desc: str, unit: str) -> TaskRunner:
        bar = self.progress(total=total, desc=desc, unit=unit)
        return TaskRunner(self.ray, self.max_in_flight, on_result, on_crash, bar)

    # --- featurize ---

    def _featurize_stage(
        self, todo: list[TargetInput], chain_keys: dict[str, dict[str, str]], conformer_codes: dict[str, list[str]]
    ) -> None:
        plan = self.plan
        runner = self.runner(self._store_features, self._featurize_crashed, len(todo), "featurize", "target")
        shared_index = plan.alignment_index if self.ray is None else self.ray.put(plan.alignment_index)
        for target in todo:
            # the stored conformers of the target's CCD codes travel with its task
            conformers = {
                "conformer_blobs": self.conformers.blobs_for(conformer_codes.get(target.target_id, [])),
                "chem": self.conformers.chem,
            }
            if plan.pipeline_config is not None:
                keys = chain_keys[target.target_id]
                blobs = {key: self.writer.get(MSA_TABLE, key) for key in set(keys.values())}
                runner.submit(
                    "featurize",
                    target.target_id,
                    partial(tasks.featurize_searched, **conformers),
                    target,
                    blobs,
                    keys,
                    plan.feature_config,
                    plan.curation,
                    plan.template_dir,
                    self.feature_fingerprint,
                )
            else:
                runner.submit(
                    "featurize",
                    target.target_id,
                    partial(tasks.featurize_ingested, **conformers),
                    target,
                    shared_index,
                    plan.feature_config,
                    plan.curation,
                    plan.template_dir,
                    self.feature_fingerprint,
                    _ingested_msa_key,
                )
        runner.drain()

    def _store_features(self, stage: str, target_id: str, result) -> None:
        if isinstance(result, TaskError):
            self.record_failure(result.stage, result.key, result.message, result.stderr_tail, target=target_id)
            return
        if isinstance(result, ExcludedTarget):
            self.exclude(result)
            return
        with self.timed_write():
            for msa_key, blob in result.msa_blobs.items():
                if not self.kept(MSA_TABLE, msa_key):
                    self.put(MSA_TABLE, msa_key, blob)
            self.put(FEATURES_TABLE, result.target_id, result.features_blob, index=result.index_entry)
            self._clear_errors(result.target_id, _TARGET_STAGES)
        self.sampling.add(result.chains)
        self.summary.featurize_seconds += result.seconds
        self.summary.warnings += len(result.warnings)
        self.summary.count_unplaced_templates(result.index_entry.get("template_hits_without_coordinates", 0))
        self.summary.stages["featurize"].done += 1

    def _featurize_crashed(self, stage: str, target_id: str, error: Exception) -> None:
        self.record_failure(stage, target_id, _crash_message(error), target=target_id)

    # --- search ---

    def search_stage(self, todo: list[TargetInput]) -> tuple[list[TargetInput], dict[str, dict[str, str]]]:
        """Search every unique chain sequence once.

        Returns the targets whose chains all have MSAs and, per target, chain id -> msa key. Only
        keys stay in the driver; the MSA records themselves are read back from the writer when
        each featurize task is submitted, so the driver's memory does not grow with the inputs.
        """
        search_plan = SearchPlan(self.plan.pipeline_config)
        chain_keys, unique = self._parse_chains(todo, search_plan)
        to_search = []
        for key, chain in unique.items():
            if self.kept(MSA_TABLE, key) and not (
                self.recheck is not None and self.recheck.search_damaged(chain, search_plan)
            ):
                self.summary.stages["search"].skipped += 1
            else:
                to_search.append((key, chain))
        failed_keys = self._search_sequences(to_search, search_plan)
        ready = []
        for target in todo:
            if target.target_id not in chain_keys:
                continue  # failed to parse: already recorded
            missing = sorted(chain for chain, key in chain_keys[target.target_id].items() if key in failed_keys)
            if missing:
                self.record_failure(
                    "featurize",
                    target.target_id,
                    f"search failed for chain(s) {', '.join(missing)}",
                    target=target.target_id,
                )
            else:
                ready.append(target)
        return ready, chain_keys

    def _parse_chains(self, todo: list[TargetInput], search_plan: SearchPlan):
        """Per target, chain id -> msa key; and each unique msa key's chain sequence."""
        chain_keys: dict[str, dict[str, str]] = {}
        unique: dict[str, ChainSequence] = {}

        def parsed(stage: str, target_id: str, result) -> None:
            if isinstance(result, TaskError):
                self.record_failure(result.stage, result.key, result.message, target=target_id)
                return
            if isinstance(result, ExcludedTarget):
                self.exclude(result)
                return
            keys = {}
            for chain in result:
                key = search_plan.msa_key(chain.molecule_type, chain.sequence)
                keys[chain.chain_id] = key
                unique.setdefault(key, chain)
            chain_keys[target_id] = keys

        def crashed(stage: str, target_id: str, error: Exception) -> None:
            self.record_failure("parse", target_id, _crash_message(error), target=target_id)

        runner = self.runner(parsed, crashed, len(todo), "parse", "target")
        for target in todo:
            runner.submit(
                "parse", target.target_id, tasks.parse_chains, target, self.plan.curation, self.conformers.chem
            )
        runner.drain()
        return chain_keys, unique

    def _search_sequences(self, to_search: list[tuple[str, ChainSequence]], search_plan: SearchPlan) -> set[str]:
        """Run the searches; returns the msa keys whose search failed."""
        failed_keys: set[str] = set()

        def searched(stage: str, key: str, result) -> None:
            if isinstance(result, TaskError):
                failed_keys.add(key)
                self.record_failure("search", key, result.message, result.stderr_tail)
                return
            with self.timed_write():
                for database_key, blob in result.database_blobs.items():
                    self.put(MSA_TABLE, database_key, blob)
                self.put(MSA_TABLE, key, result.msa_blob)
                self._clear_errors(key, ("search",))
            self.summary.tool_seconds += result.tool_seconds
            self.summary.stages["search"].done += 1

        def crashed(stage: str, key: str, error: Exception) -> None:
            failed_keys.add(key)
            self.record_failure("search", key, _crash_message(error))

        runner = self.runner(searched, crashed, len(to_search), "search", "sequence")
        for key, chain in to_search:
            databases = sum(search_plan.databases(chain.molecule_type), ())
            # Ask Ray for the CPUs the hungriest tool of this chain uses, so tools do not oversubscribe.
            threads = max((search_plan.tool(db.tool).threads for db in databases), default=1)
            runner.submit(
                "search",
                key,
                tasks.search_chain,
                chain,
                key,
                self.plan.pipeline_config,
                self.plan.feature_config.zstd_level,
                self._stored_outputs(chain, databases, search_plan),
                num_cpus=threads,
            )
        runner.drain()
        self.writer.flush()
        return failed_keys

    def _stored_outputs(self, chain: ChainSequence, databases, search_plan: SearchPlan) -> dict[str, bytes]:
        """Database name -> stored output of a database unchanged since an earlier run (not searched again)."""
        seq_key = sequence_key(chain.molecule_type, chain.sequence)
        stored = {}
        for database in databases:
            key = database_search_key(seq_key, search_plan.database_fingerprint(database))
            blob = None if self._damaged(MSA_TABLE, key) else self.writer.get(MSA_TABLE, key)  # damaged: search again
            if blob is not None:
                stored[database.name] = blob
        return stored


def _ingested_msa_key(chain: ChainSequence, files_fingerprint: str) -> str:
    return f"{sequence_key(chain.molecule_type, chain.sequence)}-{files_fingerprint}"


def _crash_message(error: Exception) -> str:
    return f"worker crashed: {type(error).__name__}: {error}".strip()


def _error_blob(stage: str, key: str, message: str, stderr_tail: str, attempts: int, target: str | None) -> bytes:
    meta = {
        "stage": stage,
        "key": key,
        "target": target,
        "message": message,
        "stderr_tail": stderr_tail[-_STDERR_TAIL_CHARS:],
        "attempts": attempts,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return encode_record(f"{stage}/{key}", {}, meta, "", "", SCHEMA_VERSION, 0)


def _previous_attempts(writer: StoreWriter) -> dict[str, int]:
    attempts = {}
    for key in writer.keys(ERRORS_TABLE):
        blob = writer.get(ERRORS_TABLE, key)
        try:
            attempts[key] = int(read_header(blob, where="errors", key=key).meta.get("attempts", 1))
        except Exception:  # a damaged error record only loses its attempt count
            attempts[key] = 1
    return attempts


def _current_meta(writer: StoreWriter, target: TargetInput, feature_fingerprint: str) -> dict | None:
    """The metadata of the target's feature record if it is current (same settings and input), else None.

    Read from the record's header entry, not the record (StoreWriter.header): a rerun of a
    finished cache reads ~2 KiB per target instead of the whole cache. A record without an
    intact entry (a cache written before header entries) is read whole and checked by its CRC."""
    try:
        header = writer.header(FEATURES_TABLE, target.target_id)
    except (CorruptRecordError, ValueError):  # damaged, or another record format: recompute it
        return None
    if header is not None and header.fingerprint == feature_fingerprint and header.input_hash == target.input_hash:
        return header.meta
    return None


def _last_manifest(cache_dir: Path) -> Manifest | None:
    """The cache's last finished manifest (its excluded targets and sampling table), if readable."""
    try:
        return read_manifest(cache_dir, expected_schema=None)
    except (OSError, ValueError):
        return None
