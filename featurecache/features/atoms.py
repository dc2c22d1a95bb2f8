"""Atom tables for standard residues, the atoms of non-standard polymer residues, and the AF3
atom-name encoding.

Standard residues are featurized with a fixed heavy-atom list (the CCD component without
hydrogens and leaving atoms such as OXT / OP3), so an unresolved residue still has its atoms,
masked. A non-standard residue of a polymer (a modified residue, a 5' GTP, a cap) takes its
atoms from its own CCD entry in the same way (`polymer_residue_atoms`). Ligands use the atoms
present in the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featurecache.io import ccd
from featurecache.io.structure import Residue

_BACKBONE = ("N", "CA", "C", "O")
PROTEIN_ATOMS: dict[str, tuple[str, ...]] = {
    "ALA": _BACKBONE + ("CB",),
    "ARG": _BACKBONE + ("CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": _BACKBONE + ("CB", "CG", "OD1", "ND2"),
    "ASP": _BACKBONE + ("CB", "CG", "OD1", "OD2"),
    "CYS": _BACKBONE + ("CB", "SG"),
    "GLN": _BACKBONE + ("CB", "CG", "CD", "OE1", "NE2"),
    "GLU": _BACKBONE + ("CB", "CG", "CD", "OE1", "OE2"),
    "GLY": _BACKBONE,
    "HIS": _BACKBONE + ("CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": _BACKBONE + ("CB", "CG1", "CG2", "CD1"),
    "LEU": _BACKBONE + ("CB", "CG", "CD1", "CD2"),
    "LYS": _BACKBONE + ("CB", "CG", "CD", "CE", "NZ"),
    "MET": _BACKBONE + ("CB", "CG", "SD", "CE"),
    "PHE": _BACKBONE + ("CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": _BACKBONE + ("CB", "CG", "CD"),
    "SER": _BACKBONE + ("CB", "OG"),
    "THR": _BACKBONE + ("CB", "OG1", "CG2"),
    "TRP": _BACKBONE + ("CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"),
    "TYR": _BACKBONE + ("CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": _BACKBONE + ("CB", "CG1", "CG2"),
    "UNK": _BACKBONE + ("CB",),
}

_SUGAR_PHOSPHATE = ("P", "OP1", "OP2", "O5'", "C5'", "C4'", "O4'", "C3'", "O3'")
_PURINE_A = ("N9", "C8", "N7", "C5", "C6", "N6", "N1", "C2", "N3", "C4")
_PURINE_G = ("N9", "C8", "N7", "C5", "C6", "O6", "N1", "C2", "N2", "N3", "C4")
_PYRIMIDINE_C = ("N1", "C2", "O2", "N3", "C4", "N4", "C5", "C6")
_PYRIMIDINE_U = ("N1", "C2", "O2", "N3", "C4", "O4", "C5", "C6")
_PYRIMIDINE_T = ("N1", "C2", "O2", "N3", "C4", "O4", "C5", "C7", "C6")
_DNA_SUGAR = _SUGAR_PHOSPHATE + ("C2'", "C1'")
_RNA_SUGAR = _SUGAR_PHOSPHATE + ("C2'", "O2'", "C1'")
NUCLEIC_ATOMS: dict[str, tuple[str, ...]] = {
    "DA": _DNA_SUGAR + _PURINE_A,
    "DG": _DNA_SUGAR + _PURINE_G,
    "DC": _DNA_SUGAR + _PYRIMIDINE_C,
    "DT": _DNA_SUGAR + _PYRIMIDINE_T,
    "DN": _DNA_SUGAR,
    "A": _RNA_SUGAR + _PURINE_A,
    "G": _RNA_SUGAR + _PURINE_G,
    "C": _RNA_SUGAR + _PYRIMIDINE_C,
    "U": _RNA_SUGAR + _PYRIMIDINE_U,
    "N": _RNA_SUGAR,
}
STANDARD_ATOMS: dict[str, tuple[str, ...]] = {**PROTEIN_ATOMS, **NUCLEIC_ATOMS}

ELEMENT_NUMBERS = {"C": 6, "N": 7, "O": 8, "P": 15, "S": 16}

# Centre atom of a standard token (AF3): CA for amino acids, C1' for nucleotides.
PROTEIN_CENTER_ATOM = "CA"
NUCLEIC_CENTER_ATOM = "C1'"


def standard_atom_element(atom_name: str) -> int:
    """Atomic number of an atom of a standard residue (names start with their element)."""
    return ELEMENT_NUMBERS[atom_name[0]]


def encode_atom_names(names: list[str] | tuple[str, ...]) -> np.ndarray:
    """AF3's atom-name encoding: ord(c) - 32 for up to 4 characters, 0-padded -> [n, 4] uint8."""
    encoded = np.zeros((len(names), 4), dtype=np.uint8)
    for row, name in enumerate(names):
        for column, char in enumerate(name[:4]):
            code = ord(char) - 32
            encoded[row, column] = code if 0 < code < 64 else 0
    return encoded


@dataclass(frozen=True, eq=False)
class ResidueAtoms:
    """The atoms one residue is featurized with, each resolved (at a model position) or masked."""

    names: tuple[str, ...]
    elements: np.ndarray  # [n] int8 atomic numbers
    charges: np.ndarray  # [n] int8
    positions: np.ndarray  # [n, 3] float32, zeros where masked
    resolved: np.ndarray  # [n] bool


def polymer_residue_atoms(residue: Residue) -> ResidueAtoms | None:
    """A non-standard polymer residue's atoms: its CCD entry's heavy atoms in CCD order (leaving
    atoms left out; charges and elements from the CCD), each at its model position or masked
    where the model lacks it, then any model atom the entry does not list (kept, not dropped).
    Without a CCD entry, the model's atoms; None when there are none either (an unresolved
    residue of unknown chemistry)."""
    entry = ccd.component(residue.name)
    entry_names = entry.atom_names if entry is not None else ()
    listed = set(entry_names)
    extra = [index for index, name in enumerate(residue.atom_names) if name not in listed]
    if not entry_names and not extra:
        return None
    present = {name: index for index, name in enumerate(residue.atom_names)}
    count = len(entry_names) + len(extra)
    positions = np.zeros((count, 3), np.float32)
    resolved = np.zeros(count, bool)
    elements = np.zeros(count, np.int8)
    charges = np.zeros(count, np.int8)
    for slot, name in enumerate(entry_names):
        elements[slot], charges[slot] = entry.elements[slot], entry.charges[slot]
        index = present.get(name)
        if index is not None:
            positions[slot] = residue.positions[index]
            resolved[slot] = residue.occupancies[index] > 0
    for slot, index in enumerate(extra, start=len(entry_names)):
        elements[slot], charges[slot] = residue.elements[index], residue.charges[index]
        positions[slot] = residue.positions[index]
        resolved[slot] = residue.occupancies[index] > 0
    names = tuple(entry_names) + tuple(residue.atom_names[index] for index in extra)
    return ResidueAtoms(names, elements, charges, positions, resolved)
