"""Precompute orchestration on Ray: parse inputs, search or ingest alignments, featurize, write.

The driver is the only LMDB writer (one writer per shard, as LMDB requires); Ray tasks return
encoded records. Work in flight is bounded, so memory stays flat however many inputs there
are. Every record carries the fingerprint of what produced it and the hash of its input file:
a rerun skips current records, recomputes stale ones and retries failures. A killed run loses
at most the uncommitted batch; `manifest.json` is written last, so an unfinished cache is never
mistaken for a finished one.

Stages: `search` (one task per unique chain sequence, only with a pipeline config) and
`featurize` (one task per target). Failures become `errors` records and the run carries on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from featurecache.config import FeatureConfig, StoreConfig, file_sha256, fingerprint
from featurecache.schema import ERRORS_TABLE, FEATURES_TABLE, MSA_TABLE, SCHEMA_VERSION
from featurecache.store.codec import encode_record, read_header
from featurecache.store.layout import find_shards
from featurecache.store.locks import StoreLockedError
from featurecache.store.writer import StoreWriteError, StoreWriter, declared_shard_count
from featurecache.io import inputs
from featurecache.precompute import tasks
from featurecache.precompute.tasks import ChainSequence, TargetInput, TaskError

log = logging.getLogger(__name__)

STAGES = ("search", "featurize")
_STDERR_TAIL_CHARS = 2000


class PipelineSetupError(Exception):
    """A problem found before any work starts: bad option, missing tool, database or folder."""


class CacheWriteError(PipelineSetupError):
    """The cache stopped accepting writes mid-run (disk full, permissions). What was committed
    stays intact and the manifest is not written, so a rerun with space finishes the job."""


@dataclass
class PrecomputeOptions:
    inputs: list[Path]
    cache_dir: Path
    config_path: Path | None = None
    alignments_dir: Path | None = None
    template_dir: Path | None = None
    address: str | None = None         # Ray cluster address; None starts Ray locally
    executor: str = "ray"              # "ray", or "inline": every task in this process (debugging, tests)
    num_workers: int | None = None     # CPUs for a local Ray; None = all
    num_shards: int | None = None
    max_msa_rows: int | None = None
    retry_failed: bool = True
    progress: bool = True
    max_in_flight: int | None = None   # tasks submitted at once; default 4 per CPU


@dataclass
class StageCounts:
    done: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass
class PrecomputeSummary:
    cache_dir: str
    targets: int = 0
    stages: dict[str, StageCounts] = field(default_factory=lambda: {stage: StageCounts() for stage in STAGES})
    warnings: int = 0
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    tool_seconds: float = 0.0       # inside the search tools (summed over tasks)
    featurize_seconds: float = 0.0  # parsing + featurization + encoding (summed over tasks)
    write_seconds: float = 0.0      # driver time in LMDB writes

    @property
    def failed(self) -> int:
        return self.stages["featurize"].failed

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["failed"] = self.failed
        return data

    def format(self) -> str:
        lines = [f"cache {self.cache_dir}: {self.targets} target(s) in {self.seconds:.1f} s"]
        for stage, counts in self.stages.items():
            lines.append(f"  {stage:<10} done {counts.done:>6}  skipped {counts.skipped:>6}  failed {counts.failed:>6}")
        if self.warnings:
            lines.append(f"  warnings: {self.warnings} (see `featurecache stats`)")
        for failure in self.failures[:20]:
            lines.append(f"  FAILED {failure['stage']} {failure['key']}: {failure['message']}")
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20} more failures (see `featurecache stats`)")
        return "\n".join(lines)


# --- inputs and preflight -----------------------------------------------------------------------


def discover_inputs(paths: list[Path]) -> list[Path]:
    """Input files from files and folders; a missing input or a target-id clash is a setup error."""
    try:
        return inputs.discover_inputs(paths)
    except inputs.InputError as error:
        raise PipelineSetupError(str(error)) from None


def _check_writable_dir(path: Path, option: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PipelineSetupError(f"{option} {path}: cannot create folder: {error.strerror}") from None
    if not path.is_dir():
        raise PipelineSetupError(f"{option} {path} is not a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PipelineSetupError(f"{option} {path} is not writable")


def _folder_identity(root: Path) -> str:
    """Fingerprint of an input folder (alignments, templates): every file's path, size and mtime."""
    entries = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            stat = path.stat()
            entries.append((str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns))
    return fingerprint(entries)


@dataclass
class _Plan:
    """Everything resolved before work starts."""

    inputs: list[Path]
    feature_config: FeatureConfig
    store_config: StoreConfig
    template_dir: str | None
    pipeline_config: object | None  # workers.pipeline_config.PipelineConfig
    alignment_index: object | None  # io.alignments.AlignmentIndex
    mode_fingerprint: str


def _prepare(options: PrecomputeOptions) -> _Plan:
    if options.executor not in ("ray", "inline"):
        raise PipelineSetupError(f"executor must be 'ray' or 'inline', got {options.executor!r}")
    if not options.inputs:
        raise PipelineSetupError("no inputs given")
    inputs = discover_inputs(options.inputs)
    if not inputs:
        raise PipelineSetupError(f"no mmCIF or FASTA files found in {', '.join(map(str, options.inputs))}")

    pipeline_config = None
    feature_config, store_config = FeatureConfig(), StoreConfig()
    template_dir = None
    if options.config_path is not None:
        from featurecache.precompute.pipeline_config import PipelineConfigError, load_pipeline_config, preflight

        try:
            pipeline_config = load_pipeline_config(options.config_path)
        except (PipelineConfigError, OSError) as error:
            raise PipelineSetupError(str(error)) from None
        problems = preflight(pipeline_config)
        if problems:
            raise PipelineSetupError("preflight failed:\n  " + "\n  ".join(problems))
        feature_config, store_config = pipeline_config.features, pipeline_config.store
        template_dir = pipeline_config.template_mmcif_dir
    if options.max_msa_rows is not None:
        if options.max_msa_rows < 1:
            raise PipelineSetupError(f"--max-msa-rows must be at least 1, got {options.max_msa_rows}")
        feature_config = dataclasses.replace(feature_config, max_msa_rows=options.max_msa_rows)
    shard_files = find_shards(options.cache_dir) if options.cache_dir.is_dir() else []
    # What the shards were created for: a killed run may have left only some of them.
    existing_shards = (declared_shard_count(options.cache_dir) or len(shard_files)) if shard_files else 0
    num_shards = options.num_shards or existing_shards or store_config.num_shards
    if options.num_shards and existing_shards and options.num_shards != existing_shards:
        raise PipelineSetupError(
            f"--shards {options.num_shards}: cache {options.cache_dir} already has {existing_shards} shards")
    if num_shards < 1:
        raise PipelineSetupError(f"--shards must be at least 1, got {num_shards}")
    store_config = dataclasses.replace(store_config, num_shards=num_shards)
    _check_writable_dir(options.cache_dir, "--cache")

    if options.template_dir is not None:
        template_dir = str(options.template_dir)
    if template_dir is not None and not Path(template_dir).is_dir():
        raise PipelineSetupError(f"template folder {template_dir} does not exist")

    alignment_index = None
    mode = {"mode": "query-only"}
    if options.alignments_dir is not None:
        from featurecache.io.alignments import AlignmentIndex

        if not options.alignments_dir.is_dir():
            raise PipelineSetupError(f"--alignments {options.alignments_dir} is not a folder")
        alignment_index = AlignmentIndex(options.alignments_dir)
        for problem in alignment_index.errors:
            log.warning("alignments: %s", problem)
        mode = {"mode": "ingest", "alignments": _folder_identity(options.alignments_dir)}
    if pipeline_config is not None:
        from featurecache.precompute.search import SearchPlan

        plan = SearchPlan(pipeline_config)
        mode = {"mode": "search", **{t: plan.fingerprint(t) for t in tasks.SEARCHED_TYPES}, **mode}
    if template_dir is not None:
        mode["templates"] = _folder_identity(Path(template_dir))
    return _Plan(inputs, feature_config, store_config, template_dir, pipeline_config, alignment_index,
                 fingerprint(mode))


# --- Ray ----------------------------------------------------------------------------------------


def _start_ray(address: str | None, num_workers: int | None):
    import ray

    if ray.is_initialized():
        return ray
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=num_workers, include_dashboard=False, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise PipelineSetupError(f"cannot start or join Ray (address={address!r}): {error}") from None
    return ray


def _featurize_task(function, *args):
    """Ray task body: a TaskError is a result (recorded by the driver), not a crash to retry."""
    try:
        return function(*args)
    except TaskError as error:
        return error


def _search_task(sequence, msa_key, pipeline_config, zstd_level, stored_blobs):
    from featurecache.precompute.search import SearchPlan

    try:
        return tasks.search_chain(sequence, msa_key, SearchPlan(pipeline_config), zstd_level, stored_blobs)
    except TaskError as error:
        return error


class _Runner:
    """Submits tasks with a bound on work in flight and hands finished results to a callback.

    With `ray=None` tasks run inline, one after another, in this process.
    """

    def __init__(self, ray, max_in_flight: int, on_result, on_crash):
        self.ray = ray
        self.max_in_flight = max_in_flight
        self.on_result = on_result
        self.on_crash = on_crash
        self.pending: dict = {}  # ObjectRef -> (stage, key)
        self._remotes: dict = {}

    def submit(self, function, num_cpus: int, stage: str, key: str, *args) -> None:
        if self.ray is None:
            self.on_result(stage, key, function(*args))
            return
        if function not in self._remotes:
            # Retries cover crashed workers; a TaskError is a returned value, never retried.
            self._remotes[function] = self.ray.remote(max_retries=2)(function)
        while len(self.pending) >= self.max_in_flight:
            self._collect_one()
        self.pending[self._remotes[function].options(num_cpus=num_cpus).remote(*args)] = (stage, key)

    def _collect_one(self) -> None:
        ready, _ = self.ray.wait(list(self.pending), num_returns=1)
        stage, key = self.pending.pop(ready[0])
        try:
            result = self.ray.get(ready[0])
        except Exception as error:  # the task's worker died even after its retries
            self.on_crash(stage, key, error)
            return
        self.on_result(stage, key, result)

    def drain(self) -> None:
        while self.pending:
            self._collect_one()


# --- the driver ---------------------------------------------------------------------------------


def _error_blob(stage: str, key: str, message: str, stderr_tail: str, attempts: int, target: str | None) -> bytes:
    meta = {"stage": stage, "key": key, "target": target, "message": message,
            "stderr_tail": stderr_tail[-_STDERR_TAIL_CHARS:], "attempts": attempts,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return encode_record(f"{stage}/{key}", {}, meta, "", "", SCHEMA_VERSION, 0)


def precompute(options: PrecomputeOptions) -> PrecomputeSummary:
    """Run the whole precompute job; see the module docstring. Raises PipelineSetupError early."""
    started = time.perf_counter()
    plan = _prepare(options)
    summary = PrecomputeSummary(cache_dir=str(options.cache_dir))
    feature_fingerprint = fingerprint(dataclasses.asdict(plan.feature_config), SCHEMA_VERSION, plan.mode_fingerprint)
    try:
        writer = StoreWriter(options.cache_dir, plan.store_config)
    except StoreLockedError as error:
        raise PipelineSetupError(str(error)) from None
    except (OSError, ValueError) as error:
        raise PipelineSetupError(f"--cache {options.cache_dir}: {error}") from None
    try:
        _run(options, plan, writer, feature_fingerprint, summary)
        fingerprints = {"features": feature_fingerprint, "feature_config": fingerprint(plan.feature_config),
                        "mode": plan.mode_fingerprint}
        writer.finish(fingerprints=fingerprints, schema_version=SCHEMA_VERSION)
    except (StoreWriteError, OSError) as error:
        raise CacheWriteError(f"--cache {options.cache_dir}: {error}") from None
    finally:
        try:
            writer.close()
        except (StoreWriteError, OSError) as error:
            log.error("closing %s: %s", options.cache_dir, error)
    summary.seconds = time.perf_counter() - started
    return summary


def _run(options: PrecomputeOptions, plan: _Plan, writer: StoreWriter, feature_fingerprint: str,
         summary: PrecomputeSummary) -> None:
    attempts = _previous_attempts(writer)

    def record_failure(stage: str, key: str, message: str, stderr_tail: str = "", target: str | None = None):
        summary.stages["featurize" if stage in ("parse", "alignments", "featurize") else stage].failed += 1
        summary.failures.append({"stage": stage, "key": key, "message": message})
        error_key = f"{stage}/{key}"
        count = attempts.get(error_key, 0) + 1
        write_started = time.perf_counter()
        writer.put(ERRORS_TABLE, error_key, _error_blob(stage, key, message, stderr_tail, count, target),
                   index={"stage": stage, "attempts": count})
        summary.write_seconds += time.perf_counter() - write_started

    def clear_errors(key: str, stages) -> None:
        for stage in stages:
            if f"{stage}/{key}" in attempts:
                writer.delete(ERRORS_TABLE, f"{stage}/{key}")

    # Which targets are already current?
    todo: list[TargetInput] = []
    for path in plan.inputs:
        target_id = inputs.target_id_for(path)
        try:
            input_hash = file_sha256(path)
        except OSError as error:
            record_failure("parse", target_id, f"{path}: cannot read: {error.strerror}")
            continue
        summary.targets += 1
        target = TargetInput(str(path), target_id, input_hash)
        if _is_current(writer, target, feature_fingerprint):
            summary.stages["featurize"].skipped += 1
            continue
        if not options.retry_failed and any(f"{stage}/{target_id}" in attempts for stage in ("parse", "featurize")):
            summary.stages["featurize"].skipped += 1
            continue
        todo.append(target)
    if not todo:
        return

    if options.executor == "inline":
        ray, cpus = None, 1
    else:
        ray = _start_ray(options.address, options.num_workers)
        cpus = max(1, int(ray.available_resources().get("CPU", 1)))
    max_in_flight = options.max_in_flight or 4 * cpus
    progress = _progress(options.progress)

    def on_featurized(stage, key, result):
        if isinstance(result, TaskError):
            record_failure(result.stage, result.key, result.message, result.stderr_tail, target=key)
            bar.update(1)
            return
        write_started = time.perf_counter()
        for msa_key, blob in result.msa_blobs.items():
            if writer.get(MSA_TABLE, msa_key) is None:
                writer.put(MSA_TABLE, msa_key, blob)
        writer.put(FEATURES_TABLE, result.target_id, result.features_blob, index=result.index_entry)
        clear_errors(result.target_id, ("parse", "alignments", "featurize"))
        summary.write_seconds += time.perf_counter() - write_started
        summary.featurize_seconds += result.seconds
        summary.warnings += len(result.warnings)
        summary.stages["featurize"].done += 1
        bar.update(1)

    def on_crash(stage, key, error):
        record_failure(stage, key, f"worker crashed: {type(error).__name__}: {error}".strip(), target=key)
        if stage == "featurize":
            bar.update(1)

    chain_keys: dict[str, dict[str, str]] = {}
    if plan.pipeline_config is not None:
        todo, chain_keys = _search_stage(ray, plan, todo, writer, summary, record_failure, clear_errors,
                                                    max_in_flight, progress)

    bar = progress(total=len(todo), desc="featurize", unit="target")
    runner = _Runner(ray, max_in_flight, on_featurized, on_crash)
    shared_index = plan.alignment_index if ray is None else ray.put(plan.alignment_index)
    for target in todo:
        if plan.pipeline_config is not None:
            keys = chain_keys[target.target_id]
            blobs = {key: writer.get(MSA_TABLE, key) for key in set(keys.values())}
            runner.submit(_featurize_task, 1, "featurize", target.target_id, tasks.featurize_searched,
                          target, blobs, keys, plan.feature_config, plan.template_dir, feature_fingerprint)
        else:
            runner.submit(_featurize_task, 1, "featurize", target.target_id, tasks.featurize_ingested,
                          target, shared_index, plan.feature_config, plan.template_dir, feature_fingerprint,
                          _ingested_msa_key)
    runner.drain()
    bar.close()


def _ingested_msa_key(chain: ChainSequence, files_fingerprint: str) -> str:
    from featurecache.precompute.search import sequence_key

    return f"{sequence_key(chain.molecule_type, chain.sequence)}-{files_fingerprint}"


def _parse_task(target: TargetInput):
    """Ray task body: the chain sequences of one input (a TaskError is returned, not raised)."""
    try:
        return tasks.chain_sequences(tasks.read_target(target.path))
    except TaskError as error:
        return error


def _search_stage(ray, plan: _Plan, todo: list[TargetInput], writer: StoreWriter, summary: PrecomputeSummary,
                  record_failure, clear_errors, max_in_flight: int, progress):
    """Search every unique chain sequence once.

    Returns the targets whose chains all have MSAs and, per target, chain id -> msa key. Only
    keys stay in the driver; the MSA records themselves are read back from the writer when
    each featurize task is submitted, so the driver's memory does not grow with the inputs.
    """
    from featurecache.precompute.search import SearchPlan, database_search_key, sequence_key

    search_plan = SearchPlan(plan.pipeline_config)
    chain_keys: dict[str, dict[str, str]] = {}
    unique: dict[str, ChainSequence] = {}
    parse_bar = progress(total=len(todo), desc="parse", unit="target")

    def on_parsed(stage, target_id, result):
        parse_bar.update(1)
        if isinstance(result, TaskError):
            record_failure(result.stage, result.key, result.message, target=target_id)
            return
        keys = {}
        for chain in result:
            key = f"{sequence_key(chain.molecule_type, chain.sequence)}-{search_plan.fingerprint(chain.molecule_type)}"
            keys[chain.chain_id] = key
            unique.setdefault(key, chain)
        chain_keys[target_id] = keys

    def on_parse_crash(stage, target_id, error):
        parse_bar.update(1)
        record_failure("parse", target_id, f"worker crashed: {type(error).__name__}: {error}", target=target_id)

    parser = _Runner(ray, max_in_flight, on_parsed, on_parse_crash)
    for target in todo:
        parser.submit(_parse_task, 1, "parse", target.target_id, target)
    parser.drain()
    parse_bar.close()

    failed_keys: set[str] = set()
    to_search = []
    for key, chain in unique.items():
        if writer.get(MSA_TABLE, key) is not None:
            summary.stages["search"].skipped += 1
        else:
            to_search.append((key, chain))

    bar = progress(total=len(to_search), desc="search", unit="sequence")

    def on_searched(stage, key, result):
        bar.update(1)
        if isinstance(result, TaskError):
            failed_keys.add(key)
            record_failure("search", key, result.message, result.stderr_tail)
            return
        write_started = time.perf_counter()
        for database_key, blob in result.database_blobs.items():
            writer.put(MSA_TABLE, database_key, blob)
        writer.put(MSA_TABLE, key, result.msa_blob)
        clear_errors(key, ("search",))
        summary.write_seconds += time.perf_counter() - write_started
        summary.tool_seconds += result.tool_seconds
        summary.stages["search"].done += 1

    def on_crash(stage, key, error):
        bar.update(1)
        failed_keys.add(key)
        record_failure("search", key, f"worker crashed: {type(error).__name__}: {error}")

    runner = _Runner(ray, max_in_flight, on_searched, on_crash)
    for key, chain in to_search:
        databases = sum(search_plan.databases(chain.molecule_type), ())
        # Ask Ray for the CPUs the hungriest tool of this chain uses, so tools do not oversubscribe.
        threads = max((search_plan.tool(db.tool).threads for db in databases), default=1)
        # Outputs of databases unchanged since an earlier run: only the others are searched.
        seq_key = sequence_key(chain.molecule_type, chain.sequence)
        stored = {db.name: writer.get(MSA_TABLE, database_search_key(seq_key, search_plan.database_fingerprint(db)))
                  for db in databases}
        stored = {name: blob for name, blob in stored.items() if blob is not None}
        runner.submit(_search_task, threads, "search", key, chain, key, plan.pipeline_config,
                      plan.feature_config.zstd_level, stored)
    runner.drain()
    bar.close()
    writer.flush()

    ready = []
    for target in todo:
        if target.target_id not in chain_keys:
            continue  # failed to parse: already recorded
        missing = sorted(chain for chain, key in chain_keys[target.target_id].items() if key in failed_keys)
        if missing:
            record_failure("featurize", target.target_id, f"search failed for chain(s) {', '.join(missing)}",
                           target=target.target_id)
        else:
            ready.append(target)
    return ready, chain_keys


def _previous_attempts(writer: StoreWriter) -> dict[str, int]:
    attempts = {}
    for key in writer.keys(ERRORS_TABLE):
        blob = writer.get(ERRORS_TABLE, key)
        try:
            attempts[key] = int(read_header(blob, where="errors", key=key).meta.get("attempts", 1))
        except Exception:  # a damaged error record only loses its attempt count
            attempts[key] = 1
    return attempts


def _is_current(writer: StoreWriter, target: TargetInput, feature_fingerprint: str) -> bool:
    blob = writer.get(FEATURES_TABLE, target.target_id)
    if blob is None:
        return False
    try:
        header = read_header(blob, where=f"features/{target.target_id}", key=target.target_id)
    except Exception:  # damaged: recompute it
        return False
    return header.fingerprint == feature_fingerprint and header.input_hash == target.input_hash


def _progress(enabled: bool):
    from tqdm.auto import tqdm

    def make(**kwargs):
        return tqdm(disable=not enabled, dynamic_ncols=True, **kwargs)

    return make
