"""`featurecache export`: cached feature records as input files of AlphaFold 3 (JSON), Protenix
(its own JSON dialect), Boltz (YAML), or as per-chain A3M files or Boltz MSA CSV files.

A record keeps its MSA assembled for the whole target (features/msa.py): the query, the rows
paired across chains by species, then each entity's own rows. Exported per chain, every
assembled row is kept, restricted to the chain's residues (all gaps where the chain shows no
sequence), so the k-th rows of all chains of a target are the k-th assembled row: the pairing
featurecache made survives. In the AF3 JSON these rows are each protein's `unpairedMsa` with
`pairedMsa` "", the layout AF3's docs/input.md recommends for pairing done ahead of time (run AF3
with ``--resolve_msa_overlaps=false`` so it keeps the rows where they are). Protenix reads MSAs
only from files and pairs rows itself, by the species in their headers: its `pairedMsaPath` file
holds the query and the paired rows the chain shows, each under a header whose species code is
its own assembled row number (io/pairing_headers.py), so Protenix pairs exactly the rows
featurecache paired; `unpairedMsaPath` holds the query and the chain's other rows. Boltz pairs
rows only by its CSV's `key` column (io/boltz_csv.py): there a protein chain's rows are the query
and the assembled rows it shows residues in, a row paired across chains keyed by its assembled
row number (the same in every chain that shows it), every other row -1.

The chains' residues are written as the input had them: modified and non-standard polymer
residues as modifications of their parent's letter (metadata `modified_residues`), ligands by
their CCD codes or SMILES, and the input's covalent bonds to ligands (`ligand_bonds`) as bonded
atom pairs, so precomputing the exported AF3 JSON gives the record's tokens, atoms and bonds again.

What a record does not keep is not invented: inserted residues are written as unknown-residue
letters (their count is kept, io/msa.py `format_a3m`), rows have no headers but their number
and species id, and templates are one-chain mmCIFs of the stored backbone and CB atoms with the
template's release date (a template whose date the record lacks is left out, with a warning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featurecache import schema
from featurecache.features.msa import expand_msa
from featurecache.io.af3_json_writer import (
    Af3Entity,
    Af3Template,
    af3_document,
    af3_json_text,
    backbone_template_mmcif,
    documented_sequence,
    group_copies,
    msa_with_query,
)
from featurecache.io.boltz_csv import UNPAIRED, format_boltz_csv
from featurecache.io.boltz_yaml_writer import boltz_yaml_text
from featurecache.io.msa import Msa, format_a3m
from featurecache.io.pairing_headers import row_pairing_header
from featurecache.io.protenix_json_writer import ProtenixMsaPaths, protenix_document, protenix_json_text
from featurecache.store.codec import Record
from featurecache.store.files import write_text_atomic
from featurecache.store.reader import StoreReader

FORMATS = ("af3-json", "protenix-json", "boltz-yaml", "a3m", "boltz-csv")
# Per-chain formats: the file suffix under OUT/KEY/.
_CHAIN_FILE_SUFFIX = {"a3m": ".a3m", "boltz-csv": ".csv"}
# Whole-target formats: the input file OUT/KEY<suffix> (its MSA files under OUT/KEY/).
_TARGET_FILE_SUFFIX = {"af3-json": ".json", "protenix-json": ".protenix.json", "boltz-yaml": ".yaml"}
PAIRED_A3M, UNPAIRED_A3M = "pairing.a3m", "non_pairing.a3m"  # Protenix's names (as `search` writes them)
# What a record must hold to be written back as an input (schema version 4 on).
_INPUT_METADATA = ("modified_residues", "ligand_bonds", "template_release_dates")
# Residue class (schema.RESTYPES index) -> one-letter code; GAP -> '-'.
_LETTERS = np.frombuffer((schema.PROTEIN_LETTERS + "X" + "AGCUN" + "AGCTN" + "-").encode("ascii"), dtype=np.uint8)
_CCD_CODE = re.compile(r"^[A-Z0-9]{1,5}$")


class ExportError(ValueError):
    """A key that is not in the cache, or a record without what the format needs."""


@dataclass(frozen=True)
class _Chain:
    chain_id: str
    molecule_type: str
    sequence: str  # polymers: one-letter codes; ligands: "(CODE)(CODE)" or "(SMILES)"
    tokens: np.ndarray  # the chain's token positions, one per residue (the first of per-atom ones)
    modifications: tuple[tuple[str, int], ...]  # (CCD code, 1-based position) of modified residues


@dataclass(frozen=True)
class TargetInput:
    """A record as one input: AF3 entities (chains grouped into copies, MSAs as AF3 text), AF3's
    bonded atom pairs, each polymer entity's chain MSA (for the formats that read MSA files) and
    what was left out."""

    entities: list[Af3Entity]
    bonds: list[list[list]]
    entity_msas: dict[int, Msa]  # entity index -> the MSA of its first chain (protein, RNA)
    warnings: list[str]


def export_records(
    cache_dir: str | Path, keys: list[str], output_format: str, out_dir: str | Path, warnings: list[str] | None = None
) -> list[Path]:
    """Write each key's record in `output_format` under `out_dir`; returns the files written
    (what was left out is appended to `warnings`). Every key is checked before anything is
    written."""
    if output_format not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir}: is a file, expected a folder")
    with StoreReader(cache_dir) as reader:
        missing = [key for key in keys if not key or reader.get(schema.FEATURES_TABLE, key) is None]
        if missing:
            raise ExportError(f"cache {cache_dir}: no feature record {', '.join(map(repr, missing))}")
        records = {key: reader.get_record(schema.FEATURES_TABLE, key) for key in keys}
    if output_format in _TARGET_FILE_SUFFIX:
        for key, record in records.items():
            lacking = [name for name in _INPUT_METADATA if name not in record.meta]
            if lacking:
                raise ExportError(
                    f"cache {cache_dir}: record {key!r} (schema version {record.schema_version}) lacks "
                    f"{', '.join(lacking)}, which --format {output_format} writes: rerun "
                    "`featurecache precompute` on the cache to bring its records up to date"
                )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, record in records.items():
        if output_format in _CHAIN_FILE_SUFFIX:
            texts = chain_a3m(record) if output_format == "a3m" else chain_boltz_csv(record)
            written += _write_chain_files(out_dir / key, texts, _CHAIN_FILE_SUFFIX[output_format])
            continue
        target = target_input(key, record)
        if warnings is not None:
            warnings += [f"{key}: {warning}" for warning in target.warnings]
        path = out_dir / f"{key}{_TARGET_FILE_SUFFIX[output_format]}"
        if output_format == "af3-json":
            text = af3_json_text(af3_document(key, target.entities, bonds=target.bonds))
        elif output_format == "protenix-json":
            paths, files = _protenix_msa_files(out_dir.resolve() / key, record, target)
            written += files
            text = protenix_json_text(protenix_document(key, target.entities, target.bonds, msas=paths))
        else:
            paths, files = _boltz_msa_files(out_dir.resolve() / key, record, target)
            written += files
            text = boltz_yaml_text(target.entities, target.bonds, paths)
        write_text_atomic(path, text)
        written.append(path)
    return written


def _chains(record: Record) -> list[_Chain]:
    meta = record.meta
    asym_id, residue_index = record.arrays["asym_id"], record.arrays["residue_index"]
    modified = meta.get("modified_residues") or [[] for _ in meta["chain_ids"]]
    chains = []
    for number, (chain_id, molecule_type, sequence, modifications) in enumerate(
        zip(meta["chain_ids"], meta["chain_types"], meta["sequences"], modified), start=1
    ):
        in_chain = np.flatnonzero(asym_id == number)
        _, first = np.unique(residue_index[in_chain], return_index=True)
        chains.append(
            _Chain(
                chain_id,
                molecule_type,
                sequence,
                in_chain[np.sort(first)],
                tuple((code, position) for position, code in modifications),
            )
        )
    return chains


def chain_msas(record: Record) -> dict[str, Msa]:
    """Per protein / RNA chain, every assembled row in its residue columns (query first)."""
    msa, deletions = expand_msa(record.arrays)  # [rows, tokens]
    species = record.arrays["msa_species"]
    descriptions = ("query",) + tuple(
        f"row{row} species={species[row]}" if species[row] else f"row{row}" for row in range(1, msa.shape[0])
    )
    result = {}
    for chain in _chains(record):
        if chain.molecule_type not in ("protein", "rna"):
            continue
        aligned = _LETTERS[msa[:, chain.tokens].astype(np.int64)]
        aligned[0] = np.frombuffer(chain.sequence.encode("ascii"), dtype=np.uint8)
        result[chain.chain_id] = Msa(
            aligned, deletions[:, chain.tokens].astype(np.int32), descriptions, f"{record.key} chain {chain.chain_id}"
        )
    return result


def chain_a3m(record: Record) -> dict[str, str]:
    """Per protein / RNA chain, chain_msas as A3M text."""
    types = dict(zip(record.meta["chain_ids"], record.meta["chain_types"]))
    return {chain_id: format_a3m(msa, molecule_type=types[chain_id]) for chain_id, msa in chain_msas(record).items()}


def _shown_rows(msa: Msa) -> np.ndarray:
    """The rows (after the query) in which the chain shows a residue."""
    return np.flatnonzero((msa.aligned[1:] != ord("-")).any(axis=1)) + 1


def _boltz_csv(msa: Msa, paired: np.ndarray) -> str:
    shown = [0, *_shown_rows(msa).tolist()]
    keys = [UNPAIRED, *(row if paired[row] else UNPAIRED for row in shown[1:])]
    return format_boltz_csv(msa, keys, shown)


def chain_boltz_csv(record: Record) -> dict[str, str]:
    """Per protein chain (Boltz reads MSAs of proteins only), its Boltz MSA CSV (module docstring)."""
    types = dict(zip(record.meta["chain_ids"], record.meta["chain_types"]))
    paired = record.arrays["msa_is_paired"]
    return {
        chain_id: _boltz_csv(msa, paired)
        for chain_id, msa in chain_msas(record).items()
        if types[chain_id] == "protein"
    }


def protenix_a3m(msa: Msa, paired: np.ndarray) -> tuple[str, str]:
    """(pairing.a3m, non_pairing.a3m) of one protein chain for Protenix (module docstring)."""
    shown = _shown_rows(msa)
    paired_rows = shown[paired[shown]]
    headers = list(msa.descriptions)
    for row in paired_rows.tolist():
        headers[row] = row_pairing_header(row)
    with_headers = Msa(msa.aligned, msa.deletion_matrix, tuple(headers), msa.source)
    return (
        format_a3m(with_headers, [0, *paired_rows.tolist()], "protein"),
        format_a3m(msa, [0, *shown[~paired[shown]].tolist()], "protein"),
    )


def _write_chain_files(folder: Path, texts: dict[str, str], suffix: str) -> list[Path]:
    folder.mkdir(exist_ok=True)
    written = []
    for chain_id, text in texts.items():
        path = folder / f"{_file_name(chain_id)}{suffix}"
        write_text_atomic(path, text)  # whole or absent
        written.append(path)
    return written


def _file_name(chain_id: str) -> str:
    return chain_id.replace(":", "_")


def _protenix_msa_files(folder: Path, record: Record, target: TargetInput) -> tuple[dict, list[Path]]:
    """Each protein entity's pairing.a3m and non_pairing.a3m under folder/<chain>/."""
    paths, written = {}, []
    paired = record.arrays["msa_is_paired"]
    for index, msa in target.entity_msas.items():
        entity = target.entities[index]
        if entity.kind != "protein":
            continue
        chain_folder = folder / _file_name(entity.source_chains[0])
        chain_folder.mkdir(parents=True, exist_ok=True)
        for name, text in zip((PAIRED_A3M, UNPAIRED_A3M), protenix_a3m(msa, paired)):
            write_text_atomic(chain_folder / name, text)
            written.append(chain_folder / name)
        paths[index] = ProtenixMsaPaths(str(chain_folder / PAIRED_A3M), str(chain_folder / UNPAIRED_A3M))
    return paths, written


def _boltz_msa_files(folder: Path, record: Record, target: TargetInput) -> tuple[dict, list[Path]]:
    """Each protein entity's Boltz CSV, folder/<chain>.csv."""
    paths, written = {}, []
    paired = record.arrays["msa_is_paired"]
    for index, msa in target.entity_msas.items():
        entity = target.entities[index]
        if entity.kind != "protein":
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{_file_name(entity.source_chains[0])}.csv"
        write_text_atomic(path, _boltz_csv(msa, paired))
        written.append(path)
        paths[index] = str(path)
    return paths, written


def target_input(key: str, record: Record) -> TargetInput:
    """The record as AF3 entities and bonds (see the module docstring)."""
    chains = _chains(record)
    msas = chain_msas(record)
    copy_keys = [(chain.molecule_type, chain.sequence, chain.modifications) for chain in chains]
    entities, entity_msas, warnings = [], {}, []
    for group in group_copies([chain.chain_id for chain in chains], copy_keys, key):
        first = chains[group.members[0]]
        kind, sequence, ids, source, description = (
            first.molecule_type,
            first.sequence,
            group.ids,
            group.source_chains,
            group.description,
        )
        if kind == "ligand":
            entities.append(Af3Entity(kind, ids, source, description=description, **_ligand(sequence)))
            continue
        msa = msas.get(first.chain_id)
        if msa is not None:
            entity_msas[len(entities)] = msa
        sequence, modifications = documented_sequence(kind, sequence, first.modifications)
        unpaired = msa_with_query(format_a3m(msa, molecule_type=kind), sequence) if msa is not None else None
        templates = _templates(key, record, first, warnings) if kind == "protein" else None
        entities.append(
            Af3Entity(
                kind,
                ids,
                source,
                sequence=sequence,
                modifications=modifications,
                description=description,
                unpaired_msa=unpaired,
                paired_msa="",
                templates=templates,
            )
        )
    return TargetInput(entities, _bonds(record, entities), entity_msas, warnings)


def af3_input(key: str, record: Record) -> dict:
    """The record as an AlphaFold 3 input JSON (see the module docstring)."""
    target = target_input(key, record)
    return af3_document(key, target.entities, bonds=target.bonds)


def _bonds(record: Record, entities: list[Af3Entity]) -> list[list[list]]:
    """The record's bonds to ligands as AF3's `bondedAtomPairs` (AF3 chain ids, 1-based residues)."""
    new_id = {source: new for entity in entities for source, new in zip(entity.source_chains, entity.ids)}
    return [
        [[new_id[chain_id], residue + 1, atom] for chain_id, residue, atom in pair]
        for pair in record.meta["ligand_bonds"]
    ]


def _ligand(sequence: str) -> dict:
    """ccd_codes or smiles of a ligand chain's recorded sequence ("(MG)", "(NAG)(NAG)", "(SMILES)")."""
    codes = re.findall(r"\(([^()]*)\)", sequence)
    if codes and "".join(f"({code})" for code in codes) == sequence and all(_CCD_CODE.match(c) for c in codes):
        return {"ccd_codes": tuple(codes)}
    return {"smiles": sequence[1:-1]}


def _template_dates(record: Record, chain_id: str) -> list[str | None]:
    """The release dates of the chain's stored templates, in template row order."""
    names, dates = record.meta["template_names"], record.meta["template_release_dates"]
    return [date for name, date in zip(names, dates) if name.startswith(f"{chain_id}:")]


def _templates(key: str, record: Record, chain: _Chain, warnings: list[str]) -> tuple[Af3Template, ...]:
    """The chain's stored templates (template rows 0..template_count-1 in its columns)."""
    arrays = record.arrays
    count = int(arrays["template_count"][chain.tokens].max(initial=0))
    dates = _template_dates(record, chain.chain_id)
    templates = []
    for row in range(count):
        restype = arrays["template_restype"][row, chain.tokens]
        present = np.flatnonzero(restype != schema.GAP)
        if not present.size:
            continue
        date = dates[row] if row < len(dates) else None
        if date is None:
            warnings.append(
                f"chain {chain.chain_id}: template {row} left out: the record has no release date "
                "for it, which AlphaFold 3 requires"
            )
            continue
        tokens = chain.tokens[present]
        names = [schema.RESTYPES[int(value)] for value in restype[present]]
        text = backbone_template_mmcif(
            f"{key}_{chain.chain_id}_{row}",
            names,
            arrays["template_backbone_pos"][row, tokens],
            arrays["template_backbone_mask"][row, tokens],
            arrays["template_pseudo_beta_pos"][row, tokens],
            arrays["template_pseudo_beta_mask"][row, tokens],
            date,
        )
        templates.append(Af3Template(text, tuple(present.tolist()), tuple(range(present.size))))
    return tuple(templates)
