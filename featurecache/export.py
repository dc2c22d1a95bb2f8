"""`featurecache export`: cached feature records as A3M files, Boltz MSA CSV files or AlphaFold 3
input JSON.

A record keeps its MSA assembled for the whole target (features/msa.py): the query, the rows
paired across chains by species, then each entity's own rows. Exported per chain, every
assembled row is kept, restricted to the chain's residues (all gaps where the chain shows no
sequence), so the k-th rows of all chains of a target are the k-th assembled row: the pairing
featurecache made survives. In the AF3 JSON these rows are each protein's `unpairedMsa` with
`pairedMsa` "", the layout AF3's docs/input.md recommends for pairing done ahead of time (run AF3
with ``--resolve_msa_overlaps=false`` so it keeps the rows where they are). Boltz pairs rows only
by its CSV's `key` column (io/boltz_csv.py): there a protein chain's rows are the query and the
assembled rows it shows residues in, a row paired across chains keyed by its assembled row number
(the same in every chain that shows it), every other row -1.

What a record does not keep is not invented: inserted residues are written as unknown-residue
letters (their count is kept, io/msa.py `format_a3m`), rows have no headers but their number
and species id, sequences use the standard parents' letters (modified residues are not
recorded), and templates are one-chain mmCIFs of the stored backbone and CB atoms.
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
    group_copies,
)
from featurecache.io.boltz_csv import UNPAIRED, format_boltz_csv
from featurecache.io.msa import Msa, format_a3m
from featurecache.store.codec import Record
from featurecache.store.files import write_text_atomic
from featurecache.store.reader import StoreReader

FORMATS = ("af3-json", "a3m", "boltz-csv")
# Per-chain formats: the file suffix under OUT/KEY/.
_CHAIN_FILE_SUFFIX = {"a3m": ".a3m", "boltz-csv": ".csv"}
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


def export_records(cache_dir: str | Path, keys: list[str], output_format: str, out_dir: str | Path) -> list[Path]:
    """Write each key's record in `output_format` under `out_dir`; returns the files written.
    Every key is checked before anything is written."""
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
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, record in records.items():
        if output_format == "af3-json":
            path = out_dir / f"{key}.json"
            write_text_atomic(path, af3_json_text(af3_input(key, record)))
            written.append(path)
        else:
            texts = chain_a3m(record) if output_format == "a3m" else chain_boltz_csv(record)
            written += _write_chain_files(out_dir / key, texts, _CHAIN_FILE_SUFFIX[output_format])
    return written


def _chains(record: Record) -> list[_Chain]:
    meta = record.meta
    asym_id, residue_index = record.arrays["asym_id"], record.arrays["residue_index"]
    chains = []
    for number, (chain_id, molecule_type, sequence) in enumerate(
            zip(meta["chain_ids"], meta["chain_types"], meta["sequences"]), start=1):
        in_chain = np.flatnonzero(asym_id == number)
        _, first = np.unique(residue_index[in_chain], return_index=True)
        chains.append(_Chain(chain_id, molecule_type, sequence, in_chain[np.sort(first)]))
    return chains


def chain_msas(record: Record) -> dict[str, Msa]:
    """Per protein / RNA chain, every assembled row in its residue columns (query first)."""
    msa, deletions = expand_msa(record.arrays)  # [rows, tokens]
    species = record.arrays["msa_species"]
    descriptions = ("query",) + tuple(f"row{row} species={species[row]}" if species[row] else f"row{row}"
                                      for row in range(1, msa.shape[0]))
    result = {}
    for chain in _chains(record):
        if chain.molecule_type not in ("protein", "rna"):
            continue
        aligned = _LETTERS[msa[:, chain.tokens].astype(np.int64)]
        aligned[0] = np.frombuffer(chain.sequence.encode("ascii"), dtype=np.uint8)
        result[chain.chain_id] = Msa(aligned, deletions[:, chain.tokens].astype(np.int32), descriptions,
                                     f"{record.key} chain {chain.chain_id}")
    return result


def chain_a3m(record: Record) -> dict[str, str]:
    """Per protein / RNA chain, chain_msas as A3M text."""
    types = dict(zip(record.meta["chain_ids"], record.meta["chain_types"]))
    return {chain_id: format_a3m(msa, molecule_type=types[chain_id]) for chain_id, msa in chain_msas(record).items()}


def chain_boltz_csv(record: Record) -> dict[str, str]:
    """Per protein chain (Boltz reads MSAs of proteins only), its Boltz MSA CSV (module docstring)."""
    types = dict(zip(record.meta["chain_ids"], record.meta["chain_types"]))
    paired = record.arrays["msa_is_paired"]
    texts = {}
    for chain_id, msa in chain_msas(record).items():
        if types[chain_id] != "protein":
            continue
        shown = [0, *(np.flatnonzero((msa.aligned[1:] != ord("-")).any(axis=1)) + 1).tolist()]
        keys = [UNPAIRED, *(row if paired[row] else UNPAIRED for row in shown[1:])]
        texts[chain_id] = format_boltz_csv(msa, keys, shown)
    return texts


def _write_chain_files(folder: Path, texts: dict[str, str], suffix: str) -> list[Path]:
    folder.mkdir(exist_ok=True)
    written = []
    for chain_id, text in texts.items():
        path = folder / f"{chain_id.replace(':', '_')}{suffix}"
        write_text_atomic(path, text)  # whole or absent
        written.append(path)
    return written


def af3_input(key: str, record: Record) -> dict:
    """The record as an AlphaFold 3 input JSON (see the module docstring)."""
    chains = _chains(record)
    msas = chain_msas(record)
    copy_keys = [(chain.molecule_type, chain.sequence) for chain in chains]
    entities = []
    for group in group_copies([chain.chain_id for chain in chains], copy_keys, key):
        first = chains[group.members[0]]
        kind, sequence, ids, source, description = (first.molecule_type, first.sequence, group.ids,
                                                    group.source_chains, group.description)
        if kind == "ligand":
            entities.append(Af3Entity(kind, ids, source, description=description, **_ligand(sequence)))
            continue
        msa = msas.get(first.chain_id)
        unpaired = format_a3m(msa, molecule_type=kind) if msa is not None else None
        templates = _templates(key, record, first) if kind == "protein" else None
        entities.append(Af3Entity(kind, ids, source, sequence=sequence, description=description,
                                  unpaired_msa=unpaired, paired_msa="", templates=templates))
    return af3_document(key, entities)


def _ligand(sequence: str) -> dict:
    """ccd_codes or smiles of a ligand chain's recorded sequence ("(MG)", "(NAG)(NAG)", "(SMILES)")."""
    codes = re.findall(r"\(([^()]*)\)", sequence)
    if codes and "".join(f"({code})" for code in codes) == sequence and all(_CCD_CODE.match(c) for c in codes):
        return {"ccd_codes": tuple(codes)}
    return {"smiles": sequence[1:-1]}


def _templates(key: str, record: Record, chain: _Chain) -> tuple[Af3Template, ...]:
    """The chain's stored templates (template rows 0..template_count-1 in its columns)."""
    arrays = record.arrays
    count = int(arrays["template_count"][chain.tokens].max(initial=0))
    templates = []
    for row in range(count):
        restype = arrays["template_restype"][row, chain.tokens]
        present = np.flatnonzero(restype != schema.GAP)
        if not present.size:
            continue
        tokens = chain.tokens[present]
        names = [schema.RESTYPES[int(value)] for value in restype[present]]
        text = backbone_template_mmcif(f"{key}_{chain.chain_id}_{row}", names,
                                       arrays["template_backbone_pos"][row, tokens],
                                       arrays["template_backbone_mask"][row, tokens],
                                       arrays["template_pseudo_beta_pos"][row, tokens],
                                       arrays["template_pseudo_beta_mask"][row, tokens])
        templates.append(Af3Template(text, tuple(present.tolist()), tuple(range(present.size))))
    return tuple(templates)
