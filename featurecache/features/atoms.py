"""The atoms of one residue or ligand component, as AF3 featurizes them, and the AF3 atom-name
encoding.

Every component's atoms come from its CCD entry (`conformers.reference_code`), in CCD order:
heavy atoms only, minus the leaving atoms AF3 drops (`chem.link_drop_atoms`: OXT inside a
protein chain, OP3 after a nucleic chain's first residue, a glycan's O1 unless O1 is bonded).
So an unresolved residue, ligand atom or modified residue keeps its own atoms, masked
(`resolved` False), and a ligand's atom count never depends on how much of it was modelled.
Each atom carries its element and formal charge from the CCD, its reference-conformer position
(`ref_pos`, `ref_mask`) and the CCD bonds among the kept atoms. Model atoms the entry does not
list are dropped (and named in `dropped`). A resolved component the CCD does not define keeps
the model's atoms with the file's elements and charges and no reference position. A SMILES
ligand (AF3 input JSON) gets its conformer's atoms, named C1, C2, O1, ... as AF3 names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from featurecache.chem import link_drop_atoms
from featurecache.features.conformers import ReferenceConformers, reference_code
from featurecache.io.structure import Chain, Residue

# Centre atom of a one-token residue (AF3): CA for amino acids, C1' for nucleotides.
PROTEIN_CENTER_ATOM = "CA"
NUCLEIC_CENTER_ATOM = "C1'"


def encode_atom_names(names: list[str] | tuple[str, ...]) -> np.ndarray:
    """AF3's atom-name encoding: ord(c) - 32 for up to 4 characters, 0-padded -> [n, 4] uint8.

    Lenient (a model file's odd name is truncated, a character outside AF3's 64 classes is 0):
    CCD names always fit."""
    encoded = np.zeros((len(names), 4), dtype=np.uint8)
    for row, name in enumerate(names):
        for column, char in enumerate(name[:4]):
            code = ord(char) - 32
            encoded[row, column] = code if 0 < code < 64 else 0
    return encoded


@dataclass(frozen=True, eq=False)
class ResidueAtoms:
    """The atoms one residue is featurized with; arrays are [n] or [n, 3] in CCD order."""

    code: str | None  # CCD code the atoms come from (None: the model's atoms)
    names: tuple[str, ...]
    elements: np.ndarray  # int8 atomic numbers (CCD)
    charges: np.ndarray  # int8 formal charges (CCD)
    positions: np.ndarray  # float32 model positions, zeros where unresolved
    resolved: np.ndarray  # bool: present in the model with occupancy > 0
    ref_pos: np.ndarray  # float32 reference-conformer positions, zeros where ref_mask is False
    ref_mask: np.ndarray  # bool: the conformer has a position for the atom
    bonds: np.ndarray  # [b, 2] int32 local atom indices (CCD bonds among these atoms)
    dropped: tuple[str, ...]  # model atoms the CCD entry does not list (left out)

    def index(self, name: str) -> int:
        """Local index of an atom, -1 if the residue has none of that name."""
        return self.names.index(name) if name in self.names else -1


def residue_atoms(
    chain: Chain, position: int, conformers: ReferenceConformers, bonded_atoms: Iterable[str] = ()
) -> ResidueAtoms | None:
    """The atoms of `chain.residues[position]`; `bonded_atoms`: its atoms in bonds to other
    residues (Structure.bonds). None for an unresolved residue of unknown chemistry."""
    residue = chain.residues[position]
    code = reference_code(conformers.ccd, chain, residue)
    if code is None:
        return _model_atoms(residue) if residue.is_resolved else None
    kind = chain.molecule_type
    drop = (
        ()
        if residue.smiles
        else link_drop_atoms(  # a SMILES ligand has no leaving atoms
            conformers.component(code),
            kind,
            is_chain_start=position == 0,
            is_chain_end=position == len(chain.residues) - 1,
            bonded_atoms=bonded_atoms,
        )
    )
    conformer = conformers.conformer(code).without(drop)
    names = tuple(conformer.atom_names.tolist())
    count = len(names)
    positions = np.zeros((count, 3), np.float32)
    resolved = np.zeros(count, bool)
    slot = {name: index for index, name in enumerate(names)}
    dropped = []
    for index, name in enumerate(residue.atom_names):
        if name not in slot:
            dropped.append(name)
            continue
        positions[slot[name]] = residue.positions[index]
        resolved[slot[name]] = residue.occupancies[index] > 0
    return ResidueAtoms(
        code=code,
        names=names,
        elements=np.array(conformer.elements, np.int8),
        charges=np.array(conformer.charges, np.int8),
        positions=positions,
        resolved=resolved,
        ref_pos=np.array(conformer.positions, np.float32),
        ref_mask=np.array(conformer.mask, bool),
        bonds=np.array(conformer.bonds, np.int32).reshape(-1, 2),
        dropped=tuple(dropped),
    )


def _model_atoms(residue: Residue) -> ResidueAtoms:
    count = len(residue.atom_names)
    return ResidueAtoms(
        code=None,
        names=tuple(residue.atom_names),
        elements=residue.elements.astype(np.int8),
        charges=residue.charges.astype(np.int8),
        positions=residue.positions.astype(np.float32),
        resolved=residue.occupancies > 0,
        ref_pos=np.zeros((count, 3), np.float32),
        ref_mask=np.zeros(count, bool),
        bonds=np.zeros((0, 2), np.int32),
        dropped=(),
    )
