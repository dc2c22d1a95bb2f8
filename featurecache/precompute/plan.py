"""Everything a precompute run resolves before work starts: its options, inputs, configs,
fingerprint of where MSAs and templates come from, and the checks that fail early (exit 2).

`prepare(options)` turns `PrecomputeOptions` into a `RunPlan` or raises `PipelineSetupError`
naming the bad option, missing tool, database or folder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from featurecache.config import (
    ChemConfig,
    ClusteringConfig,
    CurationConfig,
    FeatureConfig,
    StoreConfig,
    fingerprint,
)
from featurecache.io import inputs
from featurecache.io.alignments import AlignmentIndex
from featurecache.precompute import tasks
from featurecache.precompute.pipeline_config import (
    PipelineConfig,
    PipelineConfigError,
    load_pipeline_config,
    preflight,
)
from featurecache.precompute.search import SearchPlan
from featurecache.precompute.tools import MmseqsCluster, ToolError, ToolSettings
from featurecache.store.layout import find_shards
from featurecache.store.writer import declared_shard_count

log = logging.getLogger(__name__)


class PipelineSetupError(Exception):
    """A problem found before any work starts: bad option, missing tool, database or folder."""


@dataclass
class PrecomputeOptions:
    inputs: list[Path]
    cache_dir: Path
    config_path: Path | None = None
    alignments_dir: Path | None = None
    template_dir: Path | None = None
    address: str | None = None  # Ray cluster address; None starts Ray locally
    executor: str = "ray"  # "ray", or "inline": every task in this process (debugging, tests)
    num_workers: int | None = None  # CPUs for a local Ray; None = all
    num_shards: int | None = None
    msa_rows_stored: int | None = None  # overrides the config's features.msa_rows_stored
    ccd_path: Path | None = None  # a newer components.cif[.gz]; overrides the config's [chem] ccd_path
    curation: CurationConfig | None = None  # overrides the config's [curation] (default: AF3's)
    clustering: ClusteringConfig | None = None  # overrides the config's [clustering] (default: AF3's)
    retry_failed: bool = True
    recheck: bool = False  # read every kept record in full; recompute the damaged ones
    progress: bool = True
    verbose: bool = False  # show Ray's own messages (start-up, warnings, workers' output)
    max_in_flight: int | None = None  # tasks submitted at once; default 4 per CPU


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
class RunPlan:
    """Everything resolved before work starts."""

    inputs: list[Path]
    feature_config: FeatureConfig
    store_config: StoreConfig
    template_dir: str | None
    pipeline_config: PipelineConfig | None  # the searches' config; None when alignments are ingested
    alignment_index: AlignmentIndex | None
    mode_fingerprint: str
    curation: CurationConfig
    clustering: ClusteringConfig
    mmseqs: ToolSettings  # the clustering's MMseqs2: binary, threads, timeout ([tools.mmseqs])
    chem: ChemConfig = ChemConfig()  # the CCD and conformer settings ([chem], --ccd)
    tmp_dir: str | None = None  # [search] tmp_dir: where clustering's temporary folder is made


def prepare(options: PrecomputeOptions) -> RunPlan:
    if options.executor not in ("ray", "inline"):
        raise PipelineSetupError(f"executor must be 'ray' or 'inline', got {options.executor!r}")
    if not options.inputs:
        raise PipelineSetupError("no inputs given")
    input_files = discover_inputs(options.inputs)
    if not input_files:
        raise PipelineSetupError(f"no mmCIF or FASTA files found in {', '.join(map(str, options.inputs))}")
    # With --alignments the config's settings apply (features, curation, clustering, chemistry,
    # store, templates), its searches may not: search_config is None.
    pipeline_config = _load_pipeline_config(options.config_path, options.alignments_dir)
    search_config = pipeline_config if options.alignments_dir is None else None
    feature_config, store_config = FeatureConfig(), StoreConfig()
    template_dir = None
    if pipeline_config is not None:
        feature_config, store_config = pipeline_config.features, pipeline_config.store
        template_dir = pipeline_config.template_mmcif_dir
    if options.msa_rows_stored is not None:
        if options.msa_rows_stored < 1:
            raise PipelineSetupError(f"--msa-rows-stored must be at least 1, got {options.msa_rows_stored}")
        feature_config = dataclasses.replace(feature_config, msa_rows_stored=options.msa_rows_stored)
    store_config = dataclasses.replace(store_config, num_shards=_shard_count(options, store_config))
    _check_writable_dir(options.cache_dir, "--cache")
    if options.template_dir is not None:
        template_dir = str(options.template_dir)
    if template_dir is not None and not Path(template_dir).is_dir():
        raise PipelineSetupError(f"template folder {template_dir} does not exist")
    alignment_index = _alignment_index(options.alignments_dir)
    mode = _mode(options.alignments_dir, search_config, template_dir)
    curation = options.curation or (pipeline_config.curation if pipeline_config else CurationConfig())
    clustering = options.clustering or (pipeline_config.clustering if pipeline_config else ClusteringConfig())
    mmseqs = pipeline_config.tool_settings("mmseqs") if pipeline_config else ToolSettings()
    if clustering.enabled:
        _check_clustering_tool(mmseqs, pipeline_config)
    chem = pipeline_config.chem if pipeline_config is not None else ChemConfig()
    if options.ccd_path is not None:
        chem = dataclasses.replace(chem, ccd_path=str(Path(options.ccd_path).resolve()))
    return RunPlan(
        input_files,
        feature_config,
        store_config,
        template_dir,
        search_config,
        alignment_index,
        fingerprint(mode),
        curation,
        clustering,
        mmseqs,
        chem,
        tmp_dir=pipeline_config.tmp_dir if pipeline_config is not None else None,
    )


def _check_clustering_tool(mmseqs: ToolSettings, pipeline_config: PipelineConfig | None) -> None:
    """Clustering runs after every feature is written: a missing MMseqs2 must stop the run first."""
    try:
        MmseqsCluster(mmseqs).identity()
    except ToolError as error:
        where = f"in {pipeline_config.source}" if pipeline_config else "in a pipeline config (--config)"
        raise PipelineSetupError(
            f"clustering (AF3 sampling weights) needs MMseqs2: {error.message}; install it, "
            f"or set [clustering] enabled = false {where}"
        ) from None


def _load_pipeline_config(path: Path | None, alignments_dir: Path | None) -> PipelineConfig | None:
    """The --config file, read and preflighted (every missing tool or database named at once).

    With --alignments (`alignments_dir`) its searches would be ignored, so a config that
    configures any ([[databases]]) is refused, naming the first database and both sides."""
    if path is None:
        return None
    try:
        config = load_pipeline_config(path)
    except (PipelineConfigError, OSError) as error:
        raise PipelineSetupError(str(error)) from None
    if alignments_dir is not None and config.databases:
        names = ", ".join(database.name for database in config.databases)
        raise PipelineSetupError(
            f"--config {path}: [[databases]] configures searches ({names}), but --alignments {alignments_dir} "
            f"ingests precomputed alignments instead; remove the [[databases]] tables to ingest with this "
            f"config's other settings, or drop --alignments to search"
        )
    problems = preflight(config)
    if problems:
        raise PipelineSetupError("preflight failed:\n  " + "\n  ".join(problems))
    return config


def _shard_count(options: PrecomputeOptions, store_config: StoreConfig) -> int:
    """--shards for a new cache; an existing cache keeps the count its shards were created with."""
    shard_files = find_shards(options.cache_dir) if options.cache_dir.is_dir() else []
    # What the shards were created for: a killed run may have left only some of them.
    existing_shards = (declared_shard_count(options.cache_dir) or len(shard_files)) if shard_files else 0
    num_shards = options.num_shards or existing_shards or store_config.num_shards
    if options.num_shards and existing_shards and options.num_shards != existing_shards:
        raise PipelineSetupError(
            f"--shards {options.num_shards}: cache {options.cache_dir} already has {existing_shards} shards"
        )
    if num_shards < 1:
        raise PipelineSetupError(f"--shards must be at least 1, got {num_shards}")
    return num_shards


def _alignment_index(alignments_dir: Path | None) -> AlignmentIndex | None:
    if alignments_dir is None:
        return None
    if not alignments_dir.is_dir():
        raise PipelineSetupError(f"--alignments {alignments_dir} is not a folder")
    index = AlignmentIndex(alignments_dir)
    for problem in index.errors:
        log.warning("alignments: %s", problem)
    return index


def _mode(alignments_dir: Path | None, pipeline_config: PipelineConfig | None, template_dir: str | None) -> dict:
    """Where the MSAs and templates come from, as fingerprints: part of every feature fingerprint."""
    mode = {"mode": "query-only"}
    if alignments_dir is not None:
        mode = {"mode": "ingest", "alignments": _folder_identity(alignments_dir)}
    if pipeline_config is not None:
        plan = SearchPlan(pipeline_config)
        mode = {"mode": "search", **{t: plan.fingerprint(t) for t in tasks.SEARCHED_TYPES}, **mode}
    if template_dir is not None:
        mode["templates"] = _folder_identity(Path(template_dir))
    return mode
