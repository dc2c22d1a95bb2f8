"""AF3 tokenization of a parsed structure: token- and atom-level arrays.

- A standard residue or nucleotide is one token holding its atoms (`atoms.residue_atoms`: the
  CCD entry's heavy atoms, masked where the model lacks them); its centre atom is CA / C1'.
- A modified residue of a polymer chain (anything not standard for the chain type; MSE is
  already MET; a 5' GTP or an ACE cap too) is tokenized per atom, as AF3 does: one token per
  atom of its own CCD entry, with the chain's molecule-type flag, the residue's number and the
  parent's residue class.
- Every atom of a ligand / ion / glycan component is one token (class UNK, `is_ligand`).

Each residue instance is one reference space (`ref_space_uid`): its atoms' `ref_pos` come from
one conformer of its CCD code. Representative atoms (distogram, frames) are picked by
`token_atoms`, token bonds by `bonds`.

`input_warnings` lists what the record's metadata should say about the input itself: the
structure's own warnings (ambiguity codes read as X / N, a PDB file without SEQRES) and chains
too long to be a likely training example (`LONG_CHAIN_RESIDUES`).

entity_id numbers distinct (molecule type, sequence) pairs in order of appearance, so chains
with the same sequence share it; sym_id counts copies within an entity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from featurecache import schema
from featurecache.features.atoms import ResidueAtoms, encode_atom_names, residue_atoms
from featurecache.features.bonds import token_bonds
from featurecache.features.conformers import ReferenceConformers
from featurecache.features.token_atoms import TokenAtoms, representative_atoms
from featurecache.io.residues import DNA_STANDARD, PROTEIN_3TO1, RNA_STANDARD, STANDARD_RESIDUES
from featurecache.io.structure import Bond, Chain, Structure

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
    """Token and atom arrays (names as in schema.FEATURES) plus the token -> residue map."""

    arrays: dict[str, np.ndarray]
    token_chain: np.ndarray  # [N] 0-based index into structure.chains
    token_residue: np.ndarray  # [N] index into that chain's residues (-1 for ligand chains)
    chain_entity: tuple[int, ...]  # entity_id per chain (1-based)
    warnings: tuple[str, ...] = ()  # what featurizing the atoms left out
    conformer_codes: frozenset = field(default_factory=frozenset)  # CCD codes whose conformers were used
    ligand_bonds: tuple[Bond, ...] = ()  # the structure's bonds that token_bonds holds (each touches a ligand)

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


class _Builder:
    """Accumulates tokens and atoms residue by residue."""

    def __init__(self) -> None:
        self.tokens: dict[str, list] = {
            name: [] for name in ("restype", "residue_index", "asym_id", "entity_id", "sym_id", "chain", "residue")
        }
        self.atoms: dict[str, list] = {
            name: []
            for name in (
                "atom_to_token",
                "atom_pos",
                "atom_mask",
                "ref_pos",
                "ref_mask",
                "ref_element",
                "ref_charge",
                "names",
                "ref_space_uid",
            )
        }
        self.token_atoms: list[TokenAtoms] = []
        # (chain index, residue index) -> (first record atom, its atoms, one token for all of them)
        self.placed: dict[tuple[int, int], tuple[int, ResidueAtoms, bool]] = {}
        self.num_atoms = 0

    def add_residue(
        self,
        chain_index: int,
        position: int,
        chain: Chain,
        atoms: ResidueAtoms,
        klass: int,
        one_token: bool,
        ids: tuple[int, int, int],
    ) -> None:
        space = len(self.placed)
        first_atom, first_token = self.num_atoms, len(self.tokens["restype"])
        self.placed[(chain_index, position)] = (first_atom, atoms, one_token)
        count = len(atoms.names)
        per_residue = position if chain.is_polymer else LIGAND_RESIDUE_POSITION
        groups = [list(range(count))] if one_token else [[atom] for atom in range(count)]
        for offset, group in enumerate(groups):
            for name, value in zip(
                ("restype", "residue_index", "asym_id", "entity_id", "sym_id", "chain", "residue"),
                (klass, chain.residues[position].seq_id, *ids, chain_index, per_residue),
            ):
                self.tokens[name].append(value)
            self.token_atoms.append(TokenAtoms(chain.molecule_type, one_token, first_atom, atoms, tuple(group)))
            self.atoms["atom_to_token"].extend([first_token + offset] * len(group))
        self.atoms["atom_pos"].append(atoms.positions)
        self.atoms["atom_mask"].append(atoms.resolved)
        self.atoms["ref_pos"].append(atoms.ref_pos)
        self.atoms["ref_mask"].append(atoms.ref_mask)
        self.atoms["ref_element"].append(atoms.elements)
        self.atoms["ref_charge"].append(atoms.charges)
        self.atoms["names"].extend(atoms.names)
        self.atoms["ref_space_uid"].extend([space] * count)
        self.num_atoms += count


def _concat(parts: list, dtype, shape) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)


def tokenize(structure: Structure, conformers: ReferenceConformers | None = None) -> Tokens:
    """Tokenize every chain of `structure`, in chain order; conformers default to the bundled
    CCD's, computed here."""
    conformers = conformers or ReferenceConformers()
    bonded: dict[tuple[str, int], set[str]] = {}
    for bond in structure.bonds:
        for end in (bond.first, bond.second):
            bonded.setdefault((end.chain_id, end.residue), set()).add(end.atom)
    builder = _Builder()
    entity_of: dict[tuple[str, str], int] = {}
    copies: dict[int, int] = {}
    chain_entity, dropped, codes = [], [], set()
    for chain_index, chain in enumerate(structure.chains):
        entity = entity_of.setdefault((chain.molecule_type, chain.sequence), len(entity_of) + 1)
        copies[entity] = copies.get(entity, 0) + 1
        chain_entity.append(entity)
        for position, residue in enumerate(chain.residues):
            atoms = residue_atoms(chain, position, conformers, bonded.get((chain.chain_id, position), ()))
            if atoms is None:
                continue  # unresolved and of unknown chemistry: nothing to featurize
            if atoms.code is not None:
                codes.add(atoms.code)
            dropped.extend(f"{chain.chain_id}/{residue.seq_id}/{residue.name}:{name}" for name in atoms.dropped)
            one_token = chain.is_polymer and residue.name in STANDARD_RESIDUES[chain.molecule_type]
            builder.add_residue(
                chain_index,
                position,
                chain,
                atoms,
                residue_class(residue.parent, chain.molecule_type),
                one_token,
                (chain_index + 1, entity, copies[entity]),
            )
    arrays = _arrays(builder)
    arrays["token_bonds"], ligand_bonds = token_bonds(structure, builder.placed, arrays)
    warnings = []
    if dropped:
        warnings.append(
            f"{len(dropped)} model atoms are not in their components' CCD entries and were left "
            f"out: {', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''}"
        )
    return Tokens(
        arrays,
        np.asarray(builder.tokens["chain"], dtype=np.int32),
        np.asarray(builder.tokens["residue"], dtype=np.int32),
        tuple(chain_entity),
        tuple(warnings),
        frozenset(codes),
        ligand_bonds,
    )


def _arrays(builder: _Builder) -> dict[str, np.ndarray]:
    tokens, atoms = builder.tokens, builder.atoms
    count = len(tokens["restype"])
    molecule = [token.molecule_type for token in builder.token_atoms]
    atom_pos = _concat(atoms["atom_pos"], np.float32, (0, 3)).reshape(-1, 3)
    atom_mask = _concat(atoms["atom_mask"], bool, (0,))
    ref_pos = _concat(atoms["ref_pos"], np.float32, (0, 3)).reshape(-1, 3)
    ref_mask = _concat(atoms["ref_mask"], bool, (0,))
    picked = representative_atoms(builder.token_atoms, ref_pos, ref_mask)
    center = picked["center"]
    return {
        "restype": np.asarray(tokens["restype"], dtype=np.int8),
        "residue_index": np.asarray(tokens["residue_index"], dtype=np.int32),
        "token_index": np.arange(count, dtype=np.int32),
        "asym_id": np.asarray(tokens["asym_id"], dtype=np.int32),
        "entity_id": np.asarray(tokens["entity_id"], dtype=np.int32),
        "sym_id": np.asarray(tokens["sym_id"], dtype=np.int32),
        "is_protein": np.asarray([kind == "protein" for kind in molecule], dtype=bool),
        "is_rna": np.asarray([kind == "rna" for kind in molecule], dtype=bool),
        "is_dna": np.asarray([kind == "dna" for kind in molecule], dtype=bool),
        "is_ligand": np.asarray([kind == "ligand" for kind in molecule], dtype=bool),
        "token_center_pos": atom_pos[center].reshape(count, 3),
        "token_center_mask": atom_mask[center].reshape(count),
        "distogram_atom_index": picked["distogram"],
        "frame_atom_index": picked["frame"],
        "atom_to_token": np.asarray(atoms["atom_to_token"], dtype=np.int32),
        "atom_pos": atom_pos,
        "atom_mask": atom_mask,
        "ref_pos": ref_pos,
        "ref_mask": ref_mask,
        "ref_element": _concat(atoms["ref_element"], np.int8, (0,)),
        "ref_charge": _concat(atoms["ref_charge"], np.int8, (0,)),
        "ref_atom_name_chars": encode_atom_names(atoms["names"]),
        "ref_space_uid": np.asarray(atoms["ref_space_uid"], dtype=np.int32),
    }
