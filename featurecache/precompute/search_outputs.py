"""What `featurecache search` writes for one target, built from its chains' stored searches.

`target_outputs` is a task (run on Ray or inline like precompute's): it parses and curates the
input as precompute does, decodes the `msa` records its chains' searches produced, and returns
text only, so workers never write into the output folder; the driver (search_command.py) does.

Per unique chain sequence (a folder named by its sequence key):

- ``non_pairing.a3m``: every row of the searched MSA (databases in config order), query first;
- ``pairing.a3m`` (protein): the query and the rows that name a species, for a predictor that
  pairs rows across chains by species itself (AF3's `pairedMsa`, Protenix), under UniProt-style
  headers both read (io/pairing_headers.py); the query alone when no row names one;
- ``boltz_msa.csv`` (protein): the same rows with Boltz's pairing `key` per row (the species'
  taxid), for Boltz, which pairs rows across chains only through such keys;
- ``template_hits.json``: every template hit with its 0-based query / template residue indices.

Per target, an AlphaFold 3 input JSON (io/af3_json_writer.py) with those MSAs inline
(`pairedMsa`, for targets of two or more different protein chains, as AF3 pairs only there: the
rows featurecache pairs across them, as precompute would, each paired row under a code of its own
so AF3 pairs exactly those; `target_pairing`) and the templates precompute would keep (features/templates.py's filters), each as a one-chain
mmCIF with its residue mapping and the template's release date (which AF3 requires). From the
same entities the driver writes Protenix's JSON and Boltz's YAML (io/protenix_json_writer.py,
io/boltz_yaml_writer.py), which name the chains' files instead. A chain whose MSA an input AF3
JSON gives gets a folder of this target's own (``given-<target>-<chain>``) with the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from featurecache.config import ChemConfig, CurationConfig, FeatureConfig
from featurecache.features.msa import pair_msas, query_identity
from featurecache.features.templates import (
    TemplateReport,
    TemplateStore,
    select_templates,
)
from featurecache.io.af3_json_writer import (
    Af3Entity,
    Af3Template,
    af3_bonds,
    af3_document,
    af3_entities,
    msa_with_query,
    single_chain_mmcif,
)
from featurecache.io.boltz_csv import UNPAIRED, format_boltz_csv, species_key
from featurecache.io.common import ParseError, decode_text, read_bytes
from featurecache.io.hits import TemplateHit
from featurecache.io.inputs import AF3_JSON_SUFFIXES
from featurecache.io.mmcif import Chain, parse_mmcif
from featurecache.io.msa import Msa, format_a3m
from featurecache.io.pairing_headers import pairing_header, row_pairing_header
from featurecache.io.species import SpeciesResolver
from featurecache.precompute.curation import curate
from featurecache.precompute.msa_records import decode_msa_record
from featurecache.precompute.search import sequence_key
from featurecache.precompute.tasks import (
    ExcludedTarget,
    TargetInput,
    TaskError,
    read_parsed,
)
from featurecache.store.codec import CorruptRecordError

UNPAIRED_A3M = "non_pairing.a3m"
PAIRED_A3M = "pairing.a3m"
TEMPLATE_HITS = "template_hits.json"
BOLTZ_CSV = "boltz_msa.csv"


@dataclass
class TargetOutputs:
    """One target's files, as text: the AF3 JSON and each unique chain's folder."""

    target_id: str
    document: dict  # the AlphaFold 3 input JSON
    chain_folders: dict[str, str]  # chain id -> folder name (the chain's sequence key)
    folder_files: dict[str, dict[str, str]]  # folder name -> file name -> text
    warnings: list[str] = field(default_factory=list)
    # The AF3 document's entities and bonds, and each polymer entity's folder (by its index), from
    # which the driver writes the Protenix JSON and Boltz YAML with the folders' absolute paths.
    entities: list[Af3Entity] = field(default_factory=list)
    bonds: list[list[list]] = field(default_factory=list)
    entity_folders: dict[int, str] = field(default_factory=dict)
    # entity index -> the rows featurecache pairs across this target's proteins (target_pairing)
    paired_msas: dict[int, str] = field(default_factory=dict)  # A3M
    paired_csvs: dict[int, str] = field(default_factory=dict)  # Boltz CSV of every row, paired ones keyed


def target_outputs(
    target: TargetInput,
    msa_blobs: dict[str, bytes],
    chain_keys: dict[str, str],
    curation: CurationConfig,
    chem: ChemConfig,
    features: FeatureConfig,
    template_dir: str | None,
    max_templates: int,
) -> TargetOutputs | ExcludedTarget:
    """The search outputs of one target (chain id -> msa key of its searched chains); raises
    TaskError naming the target when its input or a stored search cannot be read."""
    parsed = read_parsed(target.path, chem)
    curated = curate(parsed.structure, curation)
    if curated.exclusion is not None:
        return ExcludedTarget(target.target_id, target.input_hash, curated.exclusion)
    structure = curated.structure
    searched: dict[str, tuple[Msa, list[TemplateHit]]] = {}
    for key in set(chain_keys.values()):
        try:
            searched[key] = decode_msa_record(msa_blobs[key], where=f"msa/{key}")
        except CorruptRecordError as error:
            raise TaskError("outputs", target.target_id, str(error)) from None
    outputs = TargetOutputs(target.target_id, {}, {}, {})
    store = TemplateStore(template_dir) if template_dir else None
    entities = af3_entities(structure)
    filled = []
    protein_msas: dict[int, Msa] = {}  # entity index -> its MSA, for pairing
    for entity in entities:
        chain = structure.chain(entity.source_chains[0])
        given_templates = _given_templates(target, chain.chain_id) if chain.chain_id in parsed.templates else None
        if chain.chain_id in parsed.msas:  # the input JSON gives this chain's MSA: kept as given
            given = parsed.msas[chain.chain_id].msa
            text = format_a3m(given, molecule_type=chain.molecule_type) if given is not None else ""
            # its files for the tools that read MSA files, in a folder of this target's own
            folder = f"given-{target.target_id}-{chain.chain_id}"
            outputs.folder_files[folder] = _chain_files(given or _query_only(chain), [], chain.molecule_type)
            outputs.chain_folders.update({chain_id: folder for chain_id in entity.source_chains})
            outputs.entity_folders[len(filled)] = folder
            if given is not None and chain.molecule_type == "protein":
                protein_msas[len(filled)] = given
            filled.append(_with_msas(entity, text, "", given_templates or []))
            continue
        key = chain_keys.get(chain.chain_id)
        if key is None:  # DNA and ligands: nothing searched
            filled.append(entity)
            continue
        msa, hits = searched[key]
        folder = sequence_key(chain.molecule_type, chain.sequence)
        for chain_id in entity.source_chains:
            outputs.chain_folders[chain_id] = folder
        files = _chain_files(msa, hits, chain.molecule_type)
        outputs.folder_files[folder] = files
        outputs.entity_folders[len(filled)] = folder
        templates = given_templates or []  # templates the input JSON gives replace searched ones
        if chain.molecule_type == "protein" and store is not None and given_templates is None:
            templates = _templates(
                chain, hits, store, features, structure.release_date, max_templates, outputs.warnings
            )
        if chain.molecule_type == "protein":
            protein_msas[len(filled)] = msa
        filled.append(_with_msas(entity, files[UNPAIRED_A3M], "", templates))
    outputs.paired_msas, outputs.paired_csvs = target_pairing(protein_msas, features.max_paired_rows - 1)
    for index, text in outputs.paired_msas.items():
        filled[index] = replace(filled[index], paired_msa=msa_with_query(text, filled[index].sequence))
    name, seeds = _name_and_seeds(target)
    outputs.entities, outputs.bonds = filled, af3_bonds(structure, filled)
    outputs.document = af3_document(name, filled, seeds, outputs.bonds)
    return outputs


def target_pairing(msas: dict[int, Msa], max_rows: int) -> tuple[dict[int, str], dict[int, str]]:
    """Per protein entity (index -> its MSA), the rows featurecache pairs across the target's
    entities (features/msa.py `pair_msas`, as precompute would), as (A3M texts, Boltz CSV texts);
    both {} when fewer than two proteins have MSAs (AF3 pairs only heteromers).

    The A3M holds the query and the paired rows, the k-th paired row under a header of its own
    code (io/pairing_headers.py `row_pairing_header`) in every entity that shows it, so AF3 and
    Protenix pair exactly those rows. The CSV holds every row, the k-th paired row keyed k in
    every entity that shows it (so Boltz pairs exactly those), every other row -1."""
    indices = sorted(msas)
    pairs = pair_msas([msas[index] for index in indices], max_rows)
    if not pairs:
        return {}, {}
    resolver = SpeciesResolver(msas[index].species_tags for index in indices)
    a3m, csv = {}, {}
    for place, index in enumerate(indices):
        msa = msas[index]
        species = resolver.keys(msa.species_tags)
        numbers = {picks[place]: number for number, (_, picks) in enumerate(pairs, start=1) if place in picks}
        headers = list(msa.descriptions)
        for row, number in numbers.items():
            headers[row] = row_pairing_header(number, msa.descriptions[row], species[row])
        a3m[index] = format_a3m(replace(msa, descriptions=tuple(headers)), [0, *numbers], "protein")
        csv[index] = format_boltz_csv(msa, [UNPAIRED, *(numbers.get(row, UNPAIRED) for row in range(1, msa.depth))])
    return a3m, csv


def _query_only(chain: Chain) -> Msa:
    """The chain's sequence as an MSA of one row (an input JSON's MSA given as "")."""
    aligned = np.frombuffer(chain.sequence.encode("ascii"), dtype=np.uint8)[None].copy()
    return Msa(aligned, np.zeros(aligned.shape, np.int32), ("query",), f"chain {chain.chain_id} query")


def _given_templates(target: TargetInput, chain_id: str) -> list[Af3Template]:
    """The templates an AF3 JSON input gives a chain, as given (read_parsed checked them); a
    template from a file (`mmcifPath`) is written inline."""
    document = json.loads(Path(target.path).read_text(encoding="utf-8"))
    for entry in document["sequences"]:
        body = entry.get("protein", {})
        ids = body.get("id", [])
        if chain_id in (ids if isinstance(ids, list) else [ids]):
            templates = []
            for given in body.get("templates") or []:
                text = given.get("mmcif")
                if text is None:
                    path = Path(given["mmcifPath"])
                    path = path if path.is_absolute() else Path(target.path).parent / path
                    text = decode_text(read_bytes(path), str(path))
                templates.append(Af3Template(text, tuple(given["queryIndices"]), tuple(given["templateIndices"])))
            return templates
    return []


def _name_and_seeds(target: TargetInput) -> tuple[str, tuple[int, ...]]:
    """An AF3 JSON input keeps its own name and model seeds (read_parsed checked them); others
    get the target id and seed 1."""
    if target.path.lower().endswith(AF3_JSON_SUFFIXES):
        document = json.loads(Path(target.path).read_text(encoding="utf-8"))
        return document["name"], tuple(document["modelSeeds"])
    return target.target_id, (1,)


def _with_msas(entity: Af3Entity, unpaired: str, paired: str, templates: list[Af3Template]) -> Af3Entity:
    """The entity with its MSAs (their query rows as its sequence) and templates."""
    unpaired, paired = msa_with_query(unpaired, entity.sequence), msa_with_query(paired, entity.sequence)
    if entity.kind == "protein":
        return replace(entity, unpaired_msa=unpaired, paired_msa=paired, templates=tuple(templates))
    if entity.kind == "rna":
        return replace(entity, unpaired_msa=unpaired)
    return entity


def _chain_files(msa: Msa, hits: list[TemplateHit], molecule_type: str) -> dict[str, str]:
    unpaired = format_a3m(msa, molecule_type=molecule_type)
    files = {
        UNPAIRED_A3M: unpaired,
        TEMPLATE_HITS: "[\n" + ",\n".join(json.dumps(_hit_json(hit)) for hit in hits) + "\n]\n",
    }
    if molecule_type == "protein":
        files[PAIRED_A3M] = pairing_a3m(msa)
        files[BOLTZ_CSV] = format_boltz_csv(msa, [UNPAIRED, *map(species_key, msa.species[1:])])
    return files


def pairing_a3m(msa: Msa) -> str:
    """The query and the rows whose headers name a species, most similar to the query first (the
    order featurecache pairs a species' rows in, features/msa.py), under headers AF3 and Protenix
    pair by (io/pairing_headers.py); the query alone when no row names one, so a predictor given
    the file finds it."""
    similarity = query_identity(msa, "protein")
    rows = sorted(
        (row for row, species in enumerate(msa.species) if row > 0 and species), key=lambda row: (-similarity[row], row)
    )
    headers = list(msa.descriptions)
    for row in rows:
        headers[row] = pairing_header(headers[row], msa.species[row], row)
    return format_a3m(replace(msa, descriptions=tuple(headers)), [0, *rows], "protein")


def _hit_json(hit: TemplateHit) -> dict:
    return {
        "name": hit.name,
        "source": hit.source,
        "e_value": hit.e_value,
        "identity": hit.identity,
        "sum_probs": hit.sum_probs,
        "aligned_cols": hit.aligned_cols,
        "description": hit.description,
        "query_indices": hit.query_indices.tolist(),
        "template_indices": hit.hit_indices.tolist(),
    }


def _templates(
    chain: Chain,
    hits: list[TemplateHit],
    store: TemplateStore,
    features: FeatureConfig,
    release_date: str | None,
    max_templates: int,
    warnings: list[str],
) -> list[Af3Template]:
    """The chain's first `max_templates` hits that precompute's filters keep, as AF3 templates."""
    report = TemplateReport()
    templates = []
    for selected in select_templates(chain, hits, store, features, release_date, report):
        if len(templates) >= max_templates:
            break
        path = store.path(selected.hit.pdb_id)
        try:
            text = single_chain_mmcif(path, selected.chain.auth_chain_id)
            written = parse_mmcif(text, f"{path} chain {selected.chain.auth_chain_id}").chains
        except (ValueError, ParseError, RuntimeError) as error:
            warnings.append(f"chain {chain.chain_id}: template {selected.hit.name} left out: {error}")
            continue
        # The indices count the chain's residues as our reader sees them; AF3 must see the same.
        if len(written) != 1 or written[0].sequence != selected.chain.sequence:
            warnings.append(
                f"chain {chain.chain_id}: template {selected.hit.name} left out: its one-chain mmCIF "
                "does not keep the chain's residues"
            )
            continue
        templates.append(
            Af3Template(text, tuple(selected.query_positions.tolist()), tuple(selected.hit_positions.tolist()))
        )
    return templates
