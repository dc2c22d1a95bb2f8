"""Protenix's own input JSON (its docs/infer_json_format.md; read by protenix.data.inference), from
the same entities as the AlphaFold 3 JSON (io/af3_json_writer.py).

Protenix does not read AF3's dialect: its file is a top-level list of jobs, each with `name`,
`modelSeeds`, `sequences` and `covalent_bonds`. Per entity:

- ``proteinChain`` / ``dnaSequence`` / ``rnaSequence``: `sequence`, `count`, `id` (the chain ids,
  one per copy) and `modifications` as ``{"ptmType": "CCD_<code>", "ptmPosition": n}`` (protein)
  or ``{"modificationType": "CCD_<code>", "basePosition": n}`` (DNA, RNA), 1-based;
  a protein's MSAs as ``pairedMsaPath`` / ``unpairedMsaPath`` files (Protenix searches again
  for a protein with neither path, so text inline is not offered);
- ``ligand``: ``"CCD_<code>[_<code>...]"`` (one residue per code) or a SMILES string. Ions are
  written as ligands too: Protenix 2.0's MSA and template featurizers skip ``ion`` entities
  when counting chains, which shifts every later chain's features.

`covalent_bonds` name each end by its 1-based entity number, copy number, residue position
(1-based; a ligand's residue in its code list) and atom name. Templates are not written: Protenix
reads templates only as search hits (`templatesPath`, .hhr / .a3m) against its own mmCIF folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from featurecache.io.af3_json_writer import Af3Entity

_ENTITY_KEYS = {"protein": "proteinChain", "dna": "dnaSequence", "rna": "rnaSequence", "ligand": "ligand"}
_MODIFICATION_KEYS = {
    "protein": ("ptmType", "ptmPosition"),
    "rna": ("modificationType", "basePosition"),
    "dna": ("modificationType", "basePosition"),
}


@dataclass(frozen=True)
class ProtenixMsaPaths:
    """A protein entity's MSA files (absolute paths): rows Protenix pairs by species, every row."""

    paired: str
    unpaired: str


def protenix_entity(entity: Af3Entity, msa: ProtenixMsaPaths | None = None) -> dict:
    """One `sequences` entry of Protenix's dialect."""
    body: dict = {}
    if entity.kind == "ligand":
        body["ligand"] = entity.smiles or "CCD_" + "_".join(entity.ccd_codes)
    else:
        body["sequence"] = entity.sequence
        if entity.modifications:
            type_key, position_key = _MODIFICATION_KEYS[entity.kind]
            body["modifications"] = [
                {type_key: f"CCD_{code}", position_key: position} for code, position in entity.modifications
            ]
    body["count"] = len(entity.ids)
    body["id"] = list(entity.ids)
    if entity.kind == "protein" and msa is not None:
        body["pairedMsaPath"] = msa.paired
        body["unpairedMsaPath"] = msa.unpaired
    return {_ENTITY_KEYS[entity.kind]: body}


def protenix_bonds(entities: list[Af3Entity], bonds: list[list[list]]) -> list[dict]:
    """`covalent_bonds` from AF3's `bondedAtomPairs` ([AF3 chain id, 1-based residue, atom] pairs)."""
    place = {
        chain_id: (number, copy)
        for number, entity in enumerate(entities, start=1)
        for copy, chain_id in enumerate(entity.ids, start=1)
    }
    converted = []
    for pair in bonds:
        bond = {}
        for side, (chain_id, residue, atom) in enumerate(pair, start=1):
            entity_number, copy = place[chain_id]
            bond.update(
                {f"entity{side}": entity_number, f"copy{side}": copy, f"position{side}": residue, f"atom{side}": atom}
            )
        converted.append(bond)
    return converted


def protenix_document(
    name: str,
    entities: list[Af3Entity],
    bonds: list[list[list]] | None = None,
    model_seeds: tuple[int, ...] = (1,),
    msas: dict[int, ProtenixMsaPaths] | None = None,
) -> list[dict]:
    """The whole input: one job. `msas`: entity index (in `entities`) -> its MSA files."""
    job = {
        "name": name,
        "modelSeeds": list(model_seeds),
        "sequences": [protenix_entity(entity, (msas or {}).get(index)) for index, entity in enumerate(entities)],
    }
    if bonds:
        job["covalent_bonds"] = protenix_bonds(entities, bonds)
    return [job]


def protenix_json_text(document: list[dict]) -> str:
    return json.dumps(document, indent=1) + "\n"
