"""Predicted atoms as mmCIF (gemmi writes it): one file per sample, readable by gemmi and viewers.

A sample's atoms carry everything the file needs except residue names of non-standard
components: chains come from `asym_id` and the record's `chain_ids`, residues from
`ref_space_uid` (one per residue instance) and `residue_index`, atom names from
`ref_atom_name_chars`, elements from `ref_element`. A standard residue (one token) is named by
its `restype`; a ligand or modified residue (one token per atom) by its chain's CCD codes in the
record's `sequences` when they line up, else by the code among the record's `conformer_codes`
whose CCD atoms hold its atom names ("UNL" if none does, as for a SMILES ligand).
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import gemmi
import numpy as np

from featurecache.chem.ccd import Ccd
from featurecache.schema import RESTYPES
from featurecache.store.files import atomic_path

UNKNOWN_LIGAND = "UNL"  # PDB's code for an unnamed ligand


@dataclass(frozen=True)
class ResidueInstance:
    """One residue of the sample: its chain (0-based into chain_ids), CCD code, numbers and atoms."""

    chain: int
    name: str
    seq_id: int
    auth_seq_id: int
    is_polymer: bool
    atoms: np.ndarray  # indices into the sample's atom axis


def atom_names(name_chars: np.ndarray) -> list[str]:
    """AF3's encoding (ord(c) - 32 per character, zero padded) back to atom names."""
    return ["".join(chr(int(code) + 32) for code in row).strip() for row in name_chars]


def _ligand_codes(sequence: str) -> list[str]:
    """The CCD codes of a ligand chain's sequence "(NAG)(NAG)(BMA)" in order."""
    return re.findall(r"\(([^()]*)\)", sequence)


def _auth_number(chain_id: str) -> int | None:
    """A split-off ligand's author number, from its chain id "<chain>:<CCD><number>"."""
    found = re.search(r":[^:]*?(-?\d+)$", chain_id)
    return int(found.group(1)) if found else None


def _match_code(names: set[str], candidates: list[str], ccd: Ccd) -> str:
    """The candidate CCD code whose atoms hold `names` with the fewest others (UNL if none)."""
    best, best_extra = UNKNOWN_LIGAND, None
    for code in candidates:
        if code not in ccd:
            continue
        known = set(ccd.component(code).heavy_atoms().atom_names.tolist())
        if names <= known and (best_extra is None or len(known - names) < best_extra):
            best, best_extra = code, len(known - names)
    return best


def residue_instances(sample: dict[str, np.ndarray], meta: dict, ccd: Ccd) -> list[ResidueInstance]:
    """Every residue instance of one (unbatched, numpy) sample, in atom order."""
    atom_to_token = sample["atom_to_token"]
    token_of_atom = {name: sample[name][atom_to_token] for name in ("asym_id", "restype", "residue_index", "is_ligand")}
    names = atom_names(sample["ref_atom_name_chars"])
    uids, first = np.unique(sample["ref_space_uid"], return_index=True)
    order = uids[np.argsort(first)]
    chain_ids, sequences = meta["chain_ids"], meta["sequences"]
    nonstandard = [code for code in meta.get("conformer_codes", []) if code not in RESTYPES]
    per_chain: dict[int, list[np.ndarray]] = {}
    for uid in order:
        atoms = np.flatnonzero(sample["ref_space_uid"] == uid)
        per_chain.setdefault(int(token_of_atom["asym_id"][atoms[0]]) - 1, []).append(atoms)
    instances = []
    for chain, residues in per_chain.items():
        ligand_chain = bool(token_of_atom["is_ligand"][residues[0][0]]) and sequences[chain].startswith("(")
        codes = _ligand_codes(sequences[chain]) if ligand_chain else []
        auth = _auth_number(chain_ids[chain])
        for number, atoms in enumerate(residues, start=1):
            one_token = len(np.unique(atom_to_token[atoms])) == 1 and not token_of_atom["is_ligand"][atoms[0]]
            if one_token:
                name = RESTYPES[int(token_of_atom["restype"][atoms[0]])]
            elif ligand_chain and len(codes) == len(residues):
                name = codes[number - 1]
            else:
                name = _match_code({names[i] for i in atoms}, nonstandard, ccd)
            seq_id = int(token_of_atom["residue_index"][atoms[0]]) if not ligand_chain else number
            auth_seq_id = auth if ligand_chain and auth is not None and len(residues) == 1 else seq_id
            instances.append(ResidueInstance(chain, name, seq_id, auth_seq_id, not ligand_chain, atoms))
    return instances


def asym_ids(chain_ids: list[str]) -> tuple[list[str], list[str]]:
    """(label_asym_id, auth_asym_id) per record chain: a split-off ligand "A:MG167" keeps its
    author chain "A" and gets a label_asym_id of its own (mmCIF gives every instance one)."""
    labels, used = [], set()
    spare = (
        f"{first}{second}" for first in ["", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"] for second in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    )
    for chain_id in chain_ids:
        label = chain_id if ":" not in chain_id and chain_id not in used else ""
        while not label:  # a spare id no chain of the record has
            candidate = next(spare)
            label = candidate if candidate not in used and candidate not in chain_ids else ""
        used.add(label)
        labels.append(label)
    return labels, [chain_id.split(":")[0] for chain_id in chain_ids]


def written_order(instances: list[ResidueInstance], chain_ids: list[str]) -> list[ResidueInstance]:
    """The residue instances in the order the mmCIF lists them: grouped by author chain (a
    split-off ligand joins its chain), chains in order of first appearance."""
    auths = asym_ids(chain_ids)[1]
    rank: dict[str, int] = {}
    for instance in instances:
        rank.setdefault(auths[instance.chain], len(rank))
    return sorted(instances, key=lambda instance: rank[auths[instance.chain]])


def structure_mmcif(
    target_id: str,
    sample: dict[str, np.ndarray],
    meta: dict,
    positions: np.ndarray,
    instances: list[ResidueInstance],
    b_factors: np.ndarray | None = None,
) -> gemmi.cif.Document:
    """One predicted structure (positions [A, 3], Angstrom) as an mmCIF document; b_factors [A]
    (the pLDDT, 0-100, as AlphaFold writes it) or 0."""
    labels, auths = asym_ids(list(meta["chain_ids"]))
    names = atom_names(sample["ref_atom_name_chars"])
    structure = gemmi.Structure()
    structure.name = target_id
    model = gemmi.Model(1)
    chains: dict[str, gemmi.Chain] = {}
    for instance in instances:
        auth = auths[instance.chain]
        if auth not in chains:
            chains[auth] = gemmi.Chain(auth)
        residue = gemmi.Residue()
        residue.name = instance.name
        residue.seqid = gemmi.SeqId(instance.auth_seq_id, " ")
        residue.subchain = labels[instance.chain]
        residue.entity_type = gemmi.EntityType.Polymer if instance.is_polymer else gemmi.EntityType.NonPolymer
        residue.het_flag = "A" if instance.is_polymer and instance.name in RESTYPES else "H"
        if instance.is_polymer:
            residue.label_seq = instance.seq_id
        for index in instance.atoms:
            atom = gemmi.Atom()
            atom.name = names[index]
            atom.element = gemmi.Element(int(sample["ref_element"][index]))
            atom.pos = gemmi.Position(*map(float, positions[index]))
            atom.occ = 1.0
            atom.b_iso = 0.0 if b_factors is None else float(b_factors[index])
            residue.add_atom(atom)
        chains[auth].add_residue(residue)
    for chain in chains.values():
        model.add_chain(chain)
    structure.add_model(model)
    # gemmi's setup_entities would rename the label_asym_ids: keep ours, number the entities
    structure.add_entity_types()
    structure.ensure_entities()
    for entity in structure.entities:  # polymer sequences, so that copies share one entity
        if entity.entity_type == gemmi.EntityType.Polymer:
            entity.full_sequence = [residue.name for residue in model.get_subchain(entity.subchains[0])]
    structure.deduplicate_entities()
    for number, entity in enumerate(structure.entities, start=1):
        entity.name = str(number)
    return structure.make_mmcif_document()


def write_mmcif(
    path: pathlib.Path,
    target_id: str,
    sample: dict[str, np.ndarray],
    meta: dict,
    positions: np.ndarray,
    instances: list[ResidueInstance],
    b_factors: np.ndarray | None = None,
) -> None:
    """Write one predicted structure to `path` (a temporary file renamed: never half written)."""
    with atomic_path(path) as partial:  # removed again if the write fails
        structure_mmcif(target_id, sample, meta, positions, instances, b_factors).write_file(str(partial))
