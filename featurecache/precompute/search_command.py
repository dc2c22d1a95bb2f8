"""`featurecache search`: the configured MSA and template searches only, written as files that
AlphaFold 3, Boltz and Protenix read.

The searches run exactly as in precompute (pipeline.py's search stage, reused here): the same
sequence keys and fingerprints, per-database reuse, errors recorded and retried, on Ray or
inline. Their results go into the `msa` table of a cache (``--cache``, default ``OUT/cache``),
so a later ``featurecache precompute --cache`` with the same config finds every one current and
skips it. Only the searches' records are written: feature records, the manifest's sampling and
excluded tables and fingerprints of an existing cache are kept as they were.

Then each target's outputs (search_outputs.py) are written under OUT:

    OUT/af3/<target id>.json                 AlphaFold 3 input, MSAs and templates inline
    OUT/protenix/<target id>.json            Protenix input (its dialect), naming the A3M files
    OUT/protenix/<target id>/<chain>.pairing.a3m  heteromers: the rows featurecache pairs (as in the AF3 JSON)
    OUT/boltz/<target id>/<chain>.csv        heteromers: every row, the ones featurecache pairs keyed alike
    OUT/boltz/<target id>.yaml               Boltz input, naming the CSV files
    OUT/msas/<sequence key>/non_pairing.a3m  every MSA row, query first
    OUT/msas/<sequence key>/pairing.a3m      protein: the query and the rows that name a species
    OUT/msas/<sequence key>/boltz_msa.csv    protein: every row with Boltz's pairing key
    OUT/msas/<sequence key>/template_hits.json
    OUT/index.json                           target -> chain id -> its msas/ folder
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from featurecache.config import ClusteringConfig, SampleConfig
from featurecache.io import inputs
from featurecache.io.af3_json_writer import af3_json_text
from featurecache.io.boltz_yaml_writer import boltz_yaml_text
from featurecache.io.protenix_json_writer import ProtenixMsaPaths, protenix_document, protenix_json_text
from featurecache.precompute.pipeline import CacheWriteError, PipelineRun
from featurecache.precompute.plan import PipelineSetupError, PrecomputeOptions, prepare
from featurecache.precompute.report import PrecomputeSummary, StageCounts
from featurecache.precompute.search_outputs import (
    BOLTZ_CSV,
    PAIRED_A3M,
    UNPAIRED_A3M,
    TargetOutputs,
    target_outputs,
)
from featurecache.precompute.tasks import ExcludedTarget, TargetInput, TaskError
from featurecache.schema import MSA_TABLE, SCHEMA_VERSION
from featurecache.store.files import write_text_atomic
from featurecache.store.locks import StoreLockedError
from featurecache.store.manifest import EXCLUDED_TABLE, SAMPLING_TABLE, read_manifest
from featurecache.store.writer import StoreWriteError, StoreWriter

AF3_FOLDER = "af3"
PROTENIX_FOLDER = "protenix"
BOLTZ_FOLDER = "boltz"
MSA_FOLDER = "msas"
INDEX_NAME = "index.json"
_FAILURES_SHOWN = 20


@dataclass
class SearchOptions:
    inputs: list[Path]
    config_path: Path
    out_dir: Path
    cache_dir: Path | None = None  # where the searches are stored; default OUT/cache
    address: str | None = None  # Ray cluster address; None starts Ray locally
    executor: str = "ray"  # or "inline" (every task in this process)
    num_workers: int | None = None
    max_templates: int = SampleConfig().max_templates  # templates per chain in the AF3 JSON (AF3 uses 4)
    progress: bool = True
    verbose: bool = False  # Ray's own messages

    @property
    def cache(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.out_dir / "cache"


@dataclass
class SearchSummary:
    out_dir: str
    cache_dir: str
    targets: int = 0
    written: int = 0  # targets whose AF3 JSON was written
    excluded: int = 0  # left out by curation, as precompute would
    sequences: StageCounts = field(default_factory=StageCounts)  # unique chain sequences searched
    failures: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return len(self.failures)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "failed": self.failed}

    def format(self) -> str:
        counts = self.sequences
        searches = (
            f"  searches   done {counts.done:>6}  skipped {counts.skipped:>6}  failed {counts.failed:>6}"
            f"  (stored in {self.cache_dir})"
        )
        lines = [
            f"search outputs in {self.out_dir}: {self.written} of {self.targets} target(s) in {self.seconds:.1f} s",
            searches,
        ]
        if self.excluded:
            lines.append(f"  excluded by curation: {self.excluded} target(s)")
        lines += [f"  warning: {warning}" for warning in self.warnings[:_FAILURES_SHOWN]]
        lines += [
            f"  FAILED {failure['stage']} {failure['key']}: {failure['message']}"
            for failure in self.failures[:_FAILURES_SHOWN]
        ]
        if self.failed > _FAILURES_SHOWN:
            lines.append(f"  ... and {self.failed - _FAILURES_SHOWN} more failures")
        return "\n".join(lines)


def search(options: SearchOptions) -> SearchSummary:
    """Run the searches and write the outputs; raises PipelineSetupError before any work."""
    started = time.perf_counter()
    if options.max_templates < 0:
        raise PipelineSetupError(f"--max-templates must be at least 0, got {options.max_templates}")
    _check_out_dir(options.out_dir)
    precompute_options = PrecomputeOptions(
        inputs=list(options.inputs),
        cache_dir=options.cache,
        config_path=options.config_path,
        address=options.address,
        executor=options.executor,
        num_workers=options.num_workers,
        clustering=ClusteringConfig(enabled=False),  # nothing is clustered: no MMseqs2 check
        progress=options.progress,
        verbose=options.verbose,
    )
    plan = prepare(precompute_options)
    _make_out_dir(options.out_dir)  # after the config and inputs passed: a refused run writes nothing
    previous = _finished_manifest(options.cache)
    try:
        writer = StoreWriter(options.cache, plan.store_config)
    except StoreLockedError as error:
        raise PipelineSetupError(str(error)) from None
    except (OSError, ValueError) as error:
        raise PipelineSetupError(f"--cache {options.cache}: {error}") from None
    summary = SearchSummary(str(options.out_dir), str(options.cache))
    try:
        run = _SearchRun(precompute_options, plan, writer, options, summary)
        run.search()
        for failure in summary.failures:  # precompute's search stage fails a target's featurize
            if failure["stage"] == "featurize":
                failure["stage"] = "target"
        # Only msa records changed: the last manifest's fingerprints and whole-cache tables still hold.
        fingerprints = previous.fingerprints if previous else {}
        derived = {
            name: previous.index[name]
            for name in (SAMPLING_TABLE, EXCLUDED_TABLE)
            if previous and name in previous.index
        }
        writer.finish(fingerprints=fingerprints, schema_version=SCHEMA_VERSION, derived_index=derived)
    except (StoreWriteError, OSError) as error:
        raise CacheWriteError(f"--cache {options.cache}: {error}") from None
    finally:
        writer.close()
    summary.seconds = time.perf_counter() - started
    return summary


class _SearchRun(PipelineRun):
    """Precompute's run, stopped after its search stage; then each target's outputs."""

    def __init__(
        self,
        precompute_options: PrecomputeOptions,
        plan,
        writer: StoreWriter,
        options: SearchOptions,
        summary: SearchSummary,
    ) -> None:
        # The search stage counts and records failures in a precompute summary, shared here.
        stages = PrecomputeSummary(cache_dir=summary.cache_dir, failures=summary.failures)
        stages.stages["search"] = summary.sequences
        super().__init__(precompute_options, plan, writer, "", stages, plan.chem)
        self.search_options = options
        self.search_summary = summary
        self.index: dict[str, dict[str, str]] = {}

    def search(self) -> None:
        todo = []
        for path in self.plan.inputs:
            target_id = inputs.target_id_for(path)
            try:
                todo.append(TargetInput(str(path), target_id, inputs.input_sha256(path)))
            except OSError as error:
                self._failed("parse", target_id, f"{path}: cannot read: {error.strerror}")
        self.search_summary.targets = len(self.plan.inputs)
        if not todo:
            return
        self.start_executor()
        ready, chain_keys = self.search_stage(todo)
        self._write_outputs(ready, chain_keys)
        self._write_index()

    def exclude(self, excluded: ExcludedTarget) -> None:
        """Curation leaves the target out: no outputs (and, unlike precompute, no cache change)."""
        self.search_summary.excluded += 1

    def _failed(self, stage: str, key: str, message: str) -> None:
        self.search_summary.failures.append({"stage": stage, "key": key, "message": message})

    def _write_outputs(self, ready: list[TargetInput], chain_keys: dict[str, dict[str, str]]) -> None:
        plan, options = self.plan, self.search_options

        def written(stage: str, target_id: str, result) -> None:
            if isinstance(result, TaskError):
                self._failed(result.stage, result.key, result.message)
            elif isinstance(result, ExcludedTarget):
                self.exclude(result)
            else:
                self._write_target(result)

        def crashed(stage: str, target_id: str, error: Exception) -> None:
            self._failed("outputs", target_id, f"worker crashed: {type(error).__name__}: {error}")

        runner = self.runner(written, crashed, len(ready), "outputs", "target")
        for target in ready:
            keys = chain_keys[target.target_id]
            blobs = {key: self.writer.get(MSA_TABLE, key) for key in set(keys.values())}
            runner.submit(
                "outputs",
                target.target_id,
                target_outputs,
                target,
                blobs,
                keys,
                plan.curation,
                plan.chem,
                plan.feature_config,
                plan.template_dir,
                options.max_templates,
            )
        runner.drain()

    def _write_target(self, outputs: TargetOutputs) -> None:
        out = self.search_options.out_dir
        for folder, files in outputs.folder_files.items():
            (out / MSA_FOLDER / folder).mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                write_text_atomic(out / MSA_FOLDER / folder / name, text)
        (out / AF3_FOLDER).mkdir(exist_ok=True)
        write_text_atomic(out / AF3_FOLDER / f"{outputs.target_id}.json", af3_json_text(outputs.document))
        self._write_peer_inputs(outputs)
        self.index[outputs.target_id] = {
            chain: f"{MSA_FOLDER}/{folder}" for chain, folder in outputs.chain_folders.items()
        }
        self.search_summary.warnings += [f"{outputs.target_id}: {warning}" for warning in outputs.warnings]
        self.search_summary.written += 1

    def _write_peer_inputs(self, outputs: TargetOutputs) -> None:
        """Protenix's JSON and Boltz's YAML of the target, naming its chains' files by absolute
        path (both tools resolve relative paths against their working folder, not the file's)."""
        out = self.search_options.out_dir.resolve()
        protenix_msas, boltz_msas = {}, {}
        for index, folder in outputs.entity_folders.items():
            entity = outputs.entities[index]
            if entity.kind != "protein":
                continue
            where = out / MSA_FOLDER / folder
            paired, csv = where / PAIRED_A3M, where / BOLTZ_CSV
            if index in outputs.paired_msas:  # this target's pairing, as in the AF3 JSON
                paired = out / PROTENIX_FOLDER / outputs.target_id / f"{entity.ids[0]}.{PAIRED_A3M}"
                csv = out / BOLTZ_FOLDER / outputs.target_id / f"{entity.ids[0]}.csv"
                for path, text in ((paired, outputs.paired_msas[index]), (csv, outputs.paired_csvs[index])):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_text_atomic(path, text)
            protenix_msas[index] = ProtenixMsaPaths(str(paired), str(where / UNPAIRED_A3M))
            boltz_msas[index] = str(csv)
        name, seeds = outputs.document["name"], tuple(outputs.document["modelSeeds"])
        (out / PROTENIX_FOLDER).mkdir(exist_ok=True)
        write_text_atomic(
            out / PROTENIX_FOLDER / f"{outputs.target_id}.json",
            protenix_json_text(protenix_document(name, outputs.entities, outputs.bonds, seeds, protenix_msas)),
        )
        (out / BOLTZ_FOLDER).mkdir(exist_ok=True)
        write_text_atomic(
            out / BOLTZ_FOLDER / f"{outputs.target_id}.yaml",
            boltz_yaml_text(outputs.entities, outputs.bonds, boltz_msas),
        )

    def _write_index(self) -> None:
        """index.json: target -> chain id -> msas folder, merged with an earlier run's."""
        path = self.search_options.out_dir / INDEX_NAME
        index = {}
        if path.is_file():
            try:
                index = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                index = {}
        index.update(self.index)
        write_text_atomic(path, json.dumps(index, indent=1, sort_keys=True) + "\n")


def _finished_manifest(cache_dir: Path):
    try:
        return read_manifest(cache_dir, expected_schema=None)
    except (OSError, ValueError):
        return None


def _check_out_dir(path: Path) -> None:
    """--out refused before any work when it is a file or below one; nothing is created yet."""
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not existing.is_dir():
        problem = "is a file, expected a folder" if existing == path else f"cannot create folder: {existing} is a file"
        raise PipelineSetupError(f"--out {path}: {problem}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PipelineSetupError(f"--out {path}: {existing} is not writable")


def _make_out_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PipelineSetupError(f"--out {path}: cannot create folder: {error.strerror}") from None
