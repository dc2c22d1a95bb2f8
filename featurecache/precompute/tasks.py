"""The units of precompute work, as plain functions (ray_executor.py runs them on Ray or inline).

- `read_target` parses one input file (mmCIF, or FASTA / AF3 input JSON for sequence-only
  targets; `read_parsed` also gives the MSAs and templates a JSON brings); `parse_chains`
  gives the searched chains of the structure after curation (curation.py). A target curation leaves out as a whole comes back as an
  `ExcludedTarget` instead (from `parse_chains` and the featurize tasks alike).
- `conformer_codes` lists the CCD codes whose reference conformers an input's featurization
  uses (the conformer stage computes each once: conformers.py); the featurize tasks get those
  stored conformers (`conformer_blobs`). `dependencies` lists an input's chains and codes
  together (`--recheck`: which targets use a damaged msa or conformer record).
- `search_chain` runs the configured search tools for one unique chain sequence and returns
  its MSA record (MSA + template hits), ready for the `msa` table.
- `featurize_ingested` / `featurize_searched` build one target's feature record from its
  curated structure and the MSAs of its chains, ingested from an alignments folder or decoded
  from `msa` records. An AF3 JSON's own MSAs and templates replace those of its chains (such
  chains are not searched). The record's metadata adds what curation removed ("curation"), each
  chain's molecule type ("chain_types"), where each polymer chain's MSA came from
  ("msa_sources": the input JSON, a search, alignment files, or the query alone) and the chain
  pairs in contact ("interfaces", the input of clustering, which runs over the whole cache at
  the end of the run).

Search and featurization return encoded records (bytes), so workers never touch LMDB: the
driver is the only writer, as LMDB requires. Failures raise `TaskError` carrying the stage and,
for tools, the stderr tail; the driver turns them into `errors` records.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from featurecache.config import ChemConfig, CurationConfig, FeatureConfig, fingerprint
from featurecache.features.featurize import featurize_target as build_features
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.common import ParseError
from featurecache.io.af3_json import GivenMsa
from featurecache.io.hits import TemplateHit, parse_hhr, parse_m8
from featurecache.io.inputs import ParsedInput, read_input, target_id_for
from featurecache.io.mmcif import Structure
from featurecache.io.msa import Msa, parse_a3m, parse_stockholm
from featurecache.precompute.conformers import codes_of, conformers_for
from featurecache.precompute.msa_records import (
    decode_database_search,
    decode_msa_record,
    encode_database_search,
    encode_msa_record,
)
from featurecache.precompute.clustering import TargetChains
from featurecache.precompute.contacts import interface_pairs
from featurecache.precompute.curation import Curated, Exclusion, curate
from featurecache.precompute.pipeline_config import PipelineConfig
from featurecache.precompute.search import SearchPlan, database_search_key, sequence_key
from featurecache.precompute.tools import ToolError
from featurecache.schema import SCHEMA_VERSION
from featurecache.store.codec import CorruptRecordError, encode_record

SEARCHED_TYPES = ("protein", "dna", "rna")


class TaskError(Exception):
    """A failed unit of work: what stage, which key, what went wrong (and the tool's stderr)."""

    def __init__(self, stage: str, key: str, message: str, stderr_tail: str = ""):
        super().__init__(f"{stage} {key}: {message}")
        self.stage = stage
        self.key = key
        self.message = message
        self.stderr_tail = stderr_tail

    def __reduce__(self):
        return (TaskError, (self.stage, self.key, self.message, self.stderr_tail))


@dataclass(frozen=True)
class TargetInput:
    path: str
    target_id: str
    input_hash: str


@dataclass(frozen=True)
class ChainSequence:
    chain_id: str
    molecule_type: str
    sequence: str


@dataclass(frozen=True)
class ExcludedTarget:
    """A target curation leaves out as a whole (it gets no feature record)."""

    target_id: str
    input_hash: str
    exclusion: Exclusion


@dataclass
class FeaturizeResult:
    target_id: str
    features_blob: bytes
    index_entry: dict
    chains: TargetChains  # clustering's input, as the record's metadata holds it
    msa_blobs: dict[str, bytes] = field(default_factory=dict)  # msa key -> record (ingest mode)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class SearchOutcome:
    msa_key: str
    msa_blob: bytes
    tool_seconds: float
    seconds: float
    database_blobs: dict[str, bytes] = field(default_factory=dict)  # database_search_key -> record, new ones


def read_parsed(path: str | os.PathLike, chem: ChemConfig | None = None) -> ParsedInput:
    """Parse one input file (with the MSAs an AF3 JSON gives); raises TaskError(stage='parse')
    naming the file. `chem`: the CCD an AF3 JSON's codes are checked against."""
    try:
        return read_input(path, (chem or ChemConfig()).ccd_path)
    except (ParseError, ValueError, OSError) as error:
        raise TaskError("parse", target_id_for(path), str(error)) from None


def read_target(path: str | os.PathLike, chem: ChemConfig | None = None) -> Structure:
    """Parse one input file; raises TaskError(stage='parse') naming the file."""
    return read_parsed(path, chem).structure


def chain_sequences(structure: Structure) -> list[ChainSequence]:
    return [
        ChainSequence(chain.chain_id, chain.molecule_type, chain.sequence)
        for chain in structure.chains
        if chain.molecule_type in SEARCHED_TYPES
    ]


def conformer_codes(target: TargetInput, chem: ChemConfig) -> list[str]:
    """The CCD codes whose conformers featurizing one input uses (of the whole parsed structure:
    a few more than curation keeps); raises TaskError(stage='parse') naming the file."""
    return codes_of(read_target(target.path, chem), chem)


def dependencies(target: TargetInput, chem: ChemConfig) -> tuple[list[ChainSequence], list[str]]:
    """The polymer chains and CCD codes of one input (of the whole parsed structure, a few more
    than curation keeps): whose msa and conformer records its feature record was computed from.
    --recheck asks when such records are damaged. Raises TaskError(stage='parse')."""
    structure = read_target(target.path, chem)
    return chain_sequences(structure), codes_of(structure, chem)


def parse_chains(
    target: TargetInput, curation: CurationConfig, chem: ChemConfig | None = None
) -> list[ChainSequence] | ExcludedTarget:
    """The searched chains of one curated input (not those whose MSA the input gives); raises
    TaskError(stage='parse') naming the file."""
    curated, parsed = _curated_input(target, curation, chem)
    if curated.exclusion is not None:
        return ExcludedTarget(target.target_id, target.input_hash, curated.exclusion)
    return [chain for chain in chain_sequences(curated.structure) if chain.chain_id not in parsed.msas]


def _curated_input(
    target: TargetInput, curation: CurationConfig, chem: ChemConfig | None
) -> tuple[Curated, ParsedInput]:
    """Parse one input and curate it; raises TaskError(stage='parse') naming the file."""
    parsed = read_parsed(target.path, chem)
    return curate(parsed.structure, curation), parsed


def _use_given_msas(
    structure: Structure, given: dict[str, GivenMsa], chain_msas: dict, chain_hits: dict, msa_sources: dict[str, str]
) -> None:
    """The input's own MSAs replace searched or ingested ones (and their template hits)."""
    for chain in structure.chains:
        if chain.chain_id in given:
            msa = given[chain.chain_id].msa
            chain_msas[chain.chain_id] = msa or query_only_msa(chain.sequence, "input JSON (query only)")
            chain_hits[chain.chain_id] = []
            msa_sources[chain.chain_id] = given[chain.chain_id].origin


def query_only_msa(sequence: str, source: str) -> Msa:
    aligned = np.frombuffer(sequence.upper().encode("ascii"), dtype=np.uint8)[None, :].copy()
    return Msa(aligned, np.zeros(aligned.shape, np.int32), ("query",), source)


# --- search -----------------------------------------------------------------------------------


def parse_search_result(result) -> tuple[Msa, list[TemplateHit]]:
    """Turn a SearchResult's raw tool outputs into one MSA (databases in config order) and hits."""
    msas = []
    for item in result.msas:
        source = f"{item.database}:{item.tool}"
        if item.num_hits == 0 or not item.text.strip():
            continue  # no hits: tools then write an empty alignment, or none at all
        if item.output_format == "sto":
            msas.append(parse_stockholm(item.text, source))
        elif item.output_format == "a3m":
            msas.append(parse_a3m(item.text, source))
        else:
            raise ValueError(f"{source}: cannot read MSA output format {item.output_format!r}")
    msas = [msa for msa in msas if msa.depth > 0]
    query = result.sequence.upper()
    combined = query_only_msa(query, "query")
    if msas:
        rows = [combined.aligned] + [msa.aligned[1:] for msa in msas]
        deletions = [combined.deletion_matrix] + [msa.deletion_matrix[1:] for msa in msas]
        descriptions = combined.descriptions + sum((msa.descriptions[1:] for msa in msas), ())
        for msa in msas:
            if msa.length != len(query):
                raise ValueError(f"{msa.source}: MSA has {msa.length} columns, query has {len(query)} residues")
        combined = Msa(
            np.concatenate(rows), np.concatenate(deletions), descriptions, "+".join(msa.source for msa in msas)
        )
    hits: list[TemplateHit] = []
    for item in result.templates:
        source = f"{item.database}:{item.tool}"
        if item.num_hits == 0 or not item.text.strip():
            continue
        if item.output_format not in ("hhr", "m8"):
            raise ValueError(f"{source}: cannot read template output format {item.output_format!r}")
        parse = parse_hhr if item.output_format == "hhr" else parse_m8
        hits.extend(parse(item.text, source))
    return combined, hits


def search_chain(
    sequence: ChainSequence,
    msa_key: str,
    config: PipelineConfig,
    zstd_level: int,
    stored_blobs: dict[str, bytes] | None = None,
) -> SearchOutcome:
    """Run every configured search for one unique chain sequence; raises TaskError on failure.

    `stored_blobs` are earlier per-database outputs for this sequence (database name -> record):
    those still current are reused, and the outcome carries records of the searches run now.
    """
    started = time.perf_counter()
    try:
        stored = {}
        for name, blob in (stored_blobs or {}).items():
            try:
                stored[name] = decode_database_search(blob, where=f"msa/{msa_key} (stored {name} output)")
            except CorruptRecordError:
                pass  # a damaged stored output is searched again
        result = SearchPlan(config).search(sequence.sequence, sequence.molecule_type, stored)
        msa, hits = parse_search_result(result)
    except ToolError as error:
        raise TaskError("search", msa_key, str(error), getattr(error, "stderr_tail", "")) from None
    except (ParseError, ValueError, OSError) as error:
        raise TaskError("search", msa_key, str(error)) from None
    meta = {
        "molecule_type": sequence.molecule_type,
        "sequence": sequence.sequence,
        "databases": {
            item.database: {
                "tool": item.tool,
                "version": item.tool_version,
                "hits": item.num_hits,
                "seconds": round(item.wall_seconds, 3),
                "reused": item.reused,
            }
            for item in result.msas + result.templates
        },
    }
    blob = encode_msa_record(msa_key, msa, hits, meta, result.fingerprint, zstd_level)
    seq_key = sequence_key(sequence.molecule_type, sequence.sequence)
    database_blobs = {}
    for item in result.msas + result.templates:
        if not item.reused:
            key = database_search_key(seq_key, item.fingerprint)
            database_blobs[key] = encode_database_search(key, item, zstd_level)
    searched_seconds = sum(item.wall_seconds for item in result.msas + result.templates if not item.reused)
    return SearchOutcome(msa_key, blob, searched_seconds, time.perf_counter() - started, database_blobs)


# --- featurization ----------------------------------------------------------------------------


def _index_entry(arrays: dict, meta: dict, record_fingerprint: str, input_hash: str, removed: dict[str, int]) -> dict:
    return {
        "num_tokens": int(arrays["restype"].shape[0]),
        "num_atoms": int(arrays["atom_to_token"].shape[0]),
        "msa_depth": int(arrays["msa_species"].shape[0]),
        "num_templates": int(arrays["template_restype"].shape[0]),
        "num_chains": len(meta.get("chain_ids", [])),
        "warnings": len(meta.get("warnings", [])),
        "template_hits_without_coordinates": len(meta.get("template_hits_without_coordinates", [])),
        "curation": removed,  # removals per reason (the record's meta "curation" lists them)
        "fingerprint": record_fingerprint,
        "input_hash": input_hash,
    }


def _encode_features(
    target: TargetInput,
    curated: Curated,
    chain_msas: dict,
    chain_hits: dict,
    config: FeatureConfig,
    curation: CurationConfig,
    template_dir: str | None,
    record_fingerprint: str,
    extra_warnings: list[str],
    msa_blobs: dict[str, bytes],
    started: float,
    conformer_blobs: dict[str, bytes] | None,
    chem: ChemConfig | None,
    msa_sources: dict[str, str] | None = None,
    given_templates: dict | None = None,
) -> FeaturizeResult:
    structure = curated.structure
    try:
        conformers = conformers_for(conformer_blobs, chem or ChemConfig())
        arrays, meta = build_features(
            structure,
            chain_msas,
            chain_hits,
            config,
            template_dir=template_dir,
            source_hash=target.input_hash,
            warnings=extra_warnings,
            conformers=conformers,
            given_templates=given_templates,
        )
    except (ValueError, KeyError, IndexError, CorruptRecordError) as error:
        raise TaskError("featurize", target.target_id, f"{target.path}: {error}") from None
    meta["curation"] = [removal.to_json() for removal in curated.removals]
    meta["chain_types"] = [chain.molecule_type for chain in structure.chains]
    if msa_sources:  # where each polymer chain's MSA came from (the input JSON, a search, files)
        meta["msa_sources"] = msa_sources
    meta["interfaces"] = interface_pairs(structure, curation.interface_distance)
    blob = encode_record(
        target.target_id, arrays, meta, record_fingerprint, target.input_hash, SCHEMA_VERSION, config.zstd_level
    )
    entry = _index_entry(arrays, meta, record_fingerprint, target.input_hash, curated.removed_counts())
    return FeaturizeResult(
        target.target_id,
        blob,
        entry,
        TargetChains.from_meta(target.target_id, meta),
        msa_blobs,
        meta["warnings"],
        time.perf_counter() - started,
    )


def featurize_ingested(
    target: TargetInput,
    alignments: AlignmentIndex | None,
    config: FeatureConfig,
    curation: CurationConfig,
    template_dir: str | None,
    record_fingerprint: str,
    msa_key,
    *,
    conformer_blobs: dict[str, bytes] | None = None,
    chem: ChemConfig | None = None,
) -> FeaturizeResult | ExcludedTarget:
    """Featurize one target with alignments ingested from files (or none: query-only MSAs).

    `msa_key(chain_sequence, files_fingerprint)` names the chain's record in the `msa` table;
    homomer chains share it, so it is stored once.
    """
    started = time.perf_counter()
    curated, parsed = _curated_input(target, curation, chem)
    given = parsed.msas
    if curated.exclusion is not None:
        return ExcludedTarget(target.target_id, target.input_hash, curated.exclusion)
    structure = curated.structure
    warnings: list[str] = []
    chain_msas: dict[str, Msa | None] = {}
    chain_hits: dict[str, list[TemplateHit]] = {}
    msa_blobs: dict[str, bytes] = {}
    msa_sources: dict[str, str] = {}
    if alignments is not None:
        try:
            found, found_warnings = alignments.for_structure(structure)
        except (ParseError, ValueError, OSError) as error:
            raise TaskError("alignments", target.target_id, str(error)) from None
        warnings.extend(found_warnings)
        for chain_id, chain_alignments in found.items():
            if chain_id in given:
                continue  # the input gives this chain's MSA
            chain_msas[chain_id] = chain_alignments.msa
            if chain_alignments.msa is not None:
                msa_sources[chain_id] = "alignments " + ", ".join(map(os.path.basename, chain_alignments.msa_files))
            chain_hits[chain_id] = list(chain_alignments.hits)
            if chain_alignments.msa is None:
                continue
            chain = structure.chain(chain_id)
            files_fingerprint = fingerprint(sorted(chain_alignments.msa_files), sorted(chain_alignments.hit_files))
            key = msa_key(ChainSequence(chain_id, chain.molecule_type, chain.sequence), files_fingerprint)
            if key not in msa_blobs:
                meta = {
                    "molecule_type": chain.molecule_type,
                    "sequence": chain.sequence,
                    "files": list(chain_alignments.msa_files) + list(chain_alignments.hit_files),
                }
                msa_blobs[key] = encode_msa_record(
                    key, chain_alignments.msa, chain_alignments.hits, meta, files_fingerprint, config.zstd_level
                )
    _use_given_msas(structure, given, chain_msas, chain_hits, msa_sources)
    return _encode_features(
        target,
        curated,
        chain_msas,
        chain_hits,
        config,
        curation,
        template_dir,
        record_fingerprint,
        warnings,
        msa_blobs,
        started,
        conformer_blobs,
        chem,
        _all_sources(structure, msa_sources, "query only (no alignment files)"),
        parsed.templates,
    )


def featurize_searched(
    target: TargetInput,
    msa_blobs: dict[str, bytes],
    chain_keys: dict[str, str],
    config: FeatureConfig,
    curation: CurationConfig,
    template_dir: str | None,
    record_fingerprint: str,
    *,
    conformer_blobs: dict[str, bytes] | None = None,
    chem: ChemConfig | None = None,
) -> FeaturizeResult | ExcludedTarget:
    """Featurize one target from the `msa` records of its chains (chain id -> msa key)."""
    started = time.perf_counter()
    curated, parsed = _curated_input(target, curation, chem)
    given = parsed.msas
    if curated.exclusion is not None:
        return ExcludedTarget(target.target_id, target.input_hash, curated.exclusion)
    chain_msas: dict[str, Msa | None] = {}
    chain_hits: dict[str, list[TemplateHit]] = {}
    decoded: dict[str, tuple[Msa, list[TemplateHit]]] = {}
    msa_sources: dict[str, str] = {}
    for chain_id, key in chain_keys.items():
        if key not in decoded:
            decoded[key] = decode_msa_record(msa_blobs[key], where=f"msa/{key}")
        chain_msas[chain_id], chain_hits[chain_id] = decoded[key]
        msa_sources[chain_id] = f"search (msa/{key})"
    _use_given_msas(curated.structure, given, chain_msas, chain_hits, msa_sources)
    return _encode_features(
        target,
        curated,
        chain_msas,
        chain_hits,
        config,
        curation,
        template_dir,
        record_fingerprint,
        [],
        {},
        started,
        conformer_blobs,
        chem,
        _all_sources(curated.structure, msa_sources, "query only"),
        parsed.templates,
    )


def _all_sources(structure: Structure, sources: dict[str, str], otherwise: str) -> dict[str, str]:
    """Chain id -> where its MSA came from, for every searched-type chain."""
    return {
        chain.chain_id: sources.get(chain.chain_id, otherwise)
        for chain in structure.chains
        if chain.molecule_type in SEARCHED_TYPES
    }
