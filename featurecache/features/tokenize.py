"""AF3 tokenization of a parsed structure: token- and atom-level arrays.

- A standard residue or nucleotide is one token; its atoms are the residue's fixed heavy-atom
  list (`atoms.STANDARD_ATOMS`), masked where the model lacks them; the centre atom is CA / C1'.
- A modified residue of a polymer chain (anything not standard for the chain type, MSE is
  already MET; a 5' GTP or an ACE cap too) is tokenized per atom, as AF3 does: one token per
  heavy atom of its CCD entry (`atoms.polymer_residue_atoms`; masked where the model lacks
  the atom), with the chain's molecule-type flag, the residue's number and the parent's
  residue class. A residue that the CCD does not know and the model does not resolve is one
  token with its parent's standard atoms (or the chain type's unknown residue's), all masked.
- Every heavy atom of a ligand / ion chain is one token (class UNK, `is_ligand`).

`input_warnings` lists what the record's metadata should say about the input itself: the
structure's own warnings (ambiguity codes read as X / N, a PDB file without SEQRES) and chains
too long to be a likely training example (`LONG_CHAIN_RESIDUES`).

entity_id numbers distinct (molecule type, sequence) pairs in order of appearance, so chains
with the same sequence share it; sym_id counts copies within an entity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featurecache import schema
from featurecache.features.atoms import (
    NUCLEIC_CENTER_ATOM,
    PROTEIN_CENTER_ATOM,
    STANDARD_ATOMS,
    ResidueAtoms,
    encode_atom_names,
    polymer_residue_atoms,
    standard_atom_element,
)
from featurecache.io.residues import DNA_STANDARD, PROTEIN_3TO1, RNA_STANDARD, STANDARD_RESIDUES
from featurecache.io.structure import Chain, Residue, Structure

LIGAND_RESIDUE_POSITION = -1
# A chain this long is past any crop and any complex in the PDB (the longest chains there hold
# a few thousand residues); it is more often two sequences run together. Cached, with a warning.
LONG_CHAIN_RESIDUES = 10_000


def input_warnings(structure: Structure) -> list[str]:
    """The structure's own warnings, then one per chain longer than LONG_CHAIN_RESIDUES."""
    warnings = list(structure.warnings)
    for chain in structure.chains:
        if chain.is_polymer and len(chain.residues) > LONG_CHAIN_RESIDUES:
            warnings.append(
                f"chain {chain.chain_id}: {len(chain.residues):,} residues, longer than {LONG_CHAIN_RESIDUES:,} "
                "(cached as it is; check the input is one chain)"
            )
    return warnings


@dataclass(frozen=True, eq=False)
class Tokens:
    """Token and atom arrays (names as in features/schema.py) plus the token -> residue map."""

    arrays: dict[str, np.ndarray]
    token_chain: np.ndarray  # [N] 0-based index into structure.chains
    token_residue: np.ndarray  # [N] index into that chain's residues (-1 for ligand chains)
    chain_entity: tuple[int, ...]  # entity_id per chain (1-based)

    @property
    def num_tokens(self) -> int:
        return int(self.token_chain.shape[0])


def residue_class(parent: str, molecule_type: str) -> int:
    """RESTYPES index of a residue from its standard parent and its chain's molecule type."""
    if molecule_type == "protein":
        return schema.RESTYPE_INDEX[parent] if parent in PROTEIN_3TO1 else schema.UNK_PROTEIN
    if molecule_type == "dna":
        return schema.RESTYPE_INDEX[parent] if parent in DNA_STANDARD else schema.UNK_DNA
    if molecule_type == "rna":
        return schema.RESTYPE_INDEX[parent] if parent in RNA_STANDARD else schema.UNK_RNA
    return schema.UNK_PROTEIN  # AF3 encodes ligand atoms as unknown amino acid


def tokenize(structure: Structure) -> Tokens:
    """Tokenize every chain of `structure`, in chain order."""
    tokens: dict[str, list] = {name: [] for name in (
        "restype", "residue_index", "asym_id", "entity_id", "sym_id", "is_protein", "is_rna", "is_dna",
        "is_ligand", "token_center_pos", "token_center_mask")}
    atoms: dict[str, list] = {name: [] for name in (
        "atom_to_token", "atom_element", "atom_names", "atom_charge", "atom_pos", "atom_mask")}
    token_chain: list[int] = []
    token_residue: list[int] = []

    entity_of: dict[tuple[str, str], int] = {}
    copies: dict[int, int] = {}
    chain_entity = []
    for chain_index, chain in enumerate(structure.chains):
        entity = entity_of.setdefault((chain.molecule_type, chain.sequence), len(entity_of) + 1)
        copies[entity] = copies.get(entity, 0) + 1
        chain_entity.append(entity)
        flags = (
            chain.molecule_type == "protein",
            chain.molecule_type == "rna",
            chain.molecule_type == "dna",
            chain.molecule_type == "ligand",
        )
        for position, residue in enumerate(chain.residues):
            klass = residue_class(residue.parent, chain.molecule_type)
            residue_index = residue.seq_id
            per_residue = (chain_index, position if chain.is_polymer else LIGAND_RESIDUE_POSITION)
            residue_atoms = _atoms_of(chain, residue)
            if residue_atoms is None:
                _add_standard_token(chain, residue, klass, tokens, atoms, len(token_chain))
                count = 1
            else:
                count = _add_atom_tokens(residue_atoms, klass, tokens, atoms, len(token_chain))
            for _ in range(count):
                tokens["residue_index"].append(residue_index)
                tokens["asym_id"].append(chain_index + 1)
                tokens["entity_id"].append(entity)
                tokens["sym_id"].append(copies[entity])
                for name, flag in zip(("is_protein", "is_rna", "is_dna", "is_ligand"), flags):
                    tokens[name].append(flag)
                token_chain.append(per_residue[0])
                token_residue.append(per_residue[1])

    count = len(token_chain)
    arrays = {
        "restype": np.asarray(tokens["restype"], dtype=np.int8),
        "residue_index": np.asarray(tokens["residue_index"], dtype=np.int32),
        "token_index": np.arange(count, dtype=np.int32),
        "asym_id": np.asarray(tokens["asym_id"], dtype=np.int32),
        "entity_id": np.asarray(tokens["entity_id"], dtype=np.int32),
        "sym_id": np.asarray(tokens["sym_id"], dtype=np.int32),
        "is_protein": np.asarray(tokens["is_protein"], dtype=bool),
        "is_rna": np.asarray(tokens["is_rna"], dtype=bool),
        "is_dna": np.asarray(tokens["is_dna"], dtype=bool),
        "is_ligand": np.asarray(tokens["is_ligand"], dtype=bool),
        "token_center_pos": np.asarray(tokens["token_center_pos"], dtype=np.float32).reshape(count, 3),
        "token_center_mask": np.asarray(tokens["token_center_mask"], dtype=bool),
        "atom_to_token": np.asarray(atoms["atom_to_token"], dtype=np.int32),
        "atom_element": np.asarray(atoms["atom_element"], dtype=np.int8),
        "atom_name_chars": encode_atom_names(atoms["atom_names"]),
        "atom_charge": np.asarray(atoms["atom_charge"], dtype=np.int8),
        "atom_pos": np.asarray(atoms["atom_pos"], dtype=np.float32).reshape(-1, 3),
        "atom_mask": np.asarray(atoms["atom_mask"], dtype=bool),
    }
    return Tokens(arrays, np.asarray(token_chain, dtype=np.int32), np.asarray(token_residue, dtype=np.int32), tuple(chain_entity))


def _add_standard_token(chain: Chain, residue, klass: int, tokens, atoms, token: int) -> None:
    """One token for a standard (or unresolved) residue, with its fixed atom list."""
    name = schema.RESTYPES[klass] if residue.name not in STANDARD_ATOMS else residue.name
    atom_names = STANDARD_ATOMS.get(name, ())
    present = {atom: index for index, atom in enumerate(residue.atom_names)}
    center_name = PROTEIN_CENTER_ATOM if chain.molecule_type == "protein" else NUCLEIC_CENTER_ATOM
    center_pos, center_mask = np.zeros(3, np.float32), False
    for atom in atom_names:
        index = present.get(atom)
        resolved = index is not None and residue.occupancies[index] > 0
        position = residue.positions[index] if index is not None else np.zeros(3, np.float32)
        atoms["atom_to_token"].append(token)
        atoms["atom_element"].append(standard_atom_element(atom))
        atoms["atom_names"].append(atom)
        atoms["atom_charge"].append(residue.charges[index] if index is not None else 0)
        atoms["atom_pos"].append(position)
        atoms["atom_mask"].append(resolved)
        if atom == center_name:
            center_pos, center_mask = position, resolved
    tokens["restype"].append(klass)
    tokens["token_center_pos"].append(center_pos)
    tokens["token_center_mask"].append(center_mask)


def _atoms_of(chain: Chain, residue: Residue) -> ResidueAtoms | None:
    """Atoms of a residue tokenized per atom; None for a one-token (standard) residue."""
    if not chain.is_polymer:
        return ResidueAtoms(residue.atom_names, residue.elements, residue.charges, residue.positions,
                            residue.occupancies > 0)
    if residue.name in STANDARD_RESIDUES[chain.molecule_type]:
        return None
    return polymer_residue_atoms(residue)


def _add_atom_tokens(residue_atoms: ResidueAtoms, klass: int, tokens, atoms, first_token: int) -> int:
    """One token per heavy atom (ligands, modified residues); returns the number of tokens."""
    for offset, atom in enumerate(residue_atoms.names):
        resolved = bool(residue_atoms.resolved[offset])
        position = residue_atoms.positions[offset]
        atoms["atom_to_token"].append(first_token + offset)
        atoms["atom_element"].append(residue_atoms.elements[offset])
        atoms["atom_names"].append(atom)
        atoms["atom_charge"].append(residue_atoms.charges[offset])
        atoms["atom_pos"].append(position)
        atoms["atom_mask"].append(resolved)
        tokens["restype"].append(klass)
        tokens["token_center_pos"].append(position)
        tokens["token_center_mask"].append(resolved)
    return len(residue_atoms.names)
