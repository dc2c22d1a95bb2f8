"""Which atoms of a component leave when it is linked into a chain or bonded to another.

The CCD lists each component as a free molecule: an amino acid with its C-terminal OXT, a
nucleotide with its 5' OP3, a sugar with its anomeric O1. These "leaving atoms" are gone once
the component forms a peptide, phosphodiester or glycosidic bond. AlphaFold 3 drops, besides
every hydrogen (`Component.heavy_atoms`):

- in a protein chain: OXT of every residue except the chain's last;
- in a DNA or RNA chain: OP3 of every residue except the chain's first;
- in a ligand chain, for a saccharide: O1 unless O1 itself takes part in a bond.

`link_drop_atoms` gives that set; `Component.without(...)` applies it. `leaving_atoms_bonded_to`
follows the CCD's own leaving-atom flags instead, for any other bonded ligand.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from featurecache.chem.ccd import Component

CHAIN_KINDS = ("protein", "dna", "rna", "ligand")


def is_saccharide(component: Component) -> bool:
    """_chem_comp.type names a saccharide ("D-SACCHARIDE, BETA LINKING", "SACCHARIDE", ...)."""
    return re.search(r"\bSACCHARIDE\b", component.type) is not None


def link_drop_atoms(
    component: Component,
    chain_kind: str,
    *,
    is_chain_start: bool,
    is_chain_end: bool,
    bonded_atoms: Iterable[str] = (),
    fix_standalone_glycans: bool = False,
) -> frozenset[str]:
    """Heavy atoms AF3 leaves out of `component` in a chain of `chain_kind` (CHAIN_KINDS).

    `bonded_atoms`: names of this component's atoms in covalent bonds to other components
    (from _struct_conn or bondedAtomPairs). AF3 as trained drops O1 of a glycan that is bonded
    to nothing; `fix_standalone_glycans=True` keeps it (AF3's later option of the same name).
    Only names the component has are returned.
    """
    if chain_kind not in CHAIN_KINDS:
        raise ValueError(f"chain kind {chain_kind!r} is not one of {CHAIN_KINDS}")
    bonded_atoms = set(bonded_atoms)
    drop = set()
    if chain_kind == "protein" and not is_chain_end:
        drop.add("OXT")
    elif chain_kind in ("dna", "rna") and not is_chain_start:
        drop.add("OP3")
    elif chain_kind == "ligand" and is_saccharide(component):
        standalone = not bonded_atoms
        if "O1" not in bonded_atoms and not (standalone and fix_standalone_glycans):
            drop.add("O1")
    return frozenset(drop.intersection(component.atom_names.tolist()))


def leaving_atoms_bonded_to(component: Component, atom_names: Iterable[str]) -> frozenset[str]:
    """Leaving atoms that hang off the named atoms, following chains of leaving atoms.

    What the CCD says leaves when those atoms form a bond: C1 of NAG -> {O1, HO1}; C of an
    amino acid -> {OXT, HXT}; P of a nucleotide -> {OP3}.
    """
    neighbours: dict[int, list[int]] = {i: [] for i in range(component.num_atoms)}
    for first, second in component.bonds.tolist():
        neighbours[first].append(second)
        neighbours[second].append(first)
    found: set[int] = set()
    frontier = [component.atom_index(name) for name in atom_names]
    while frontier:
        atom = frontier.pop()
        for neighbour in neighbours[atom]:
            if component.leaving[neighbour] and neighbour not in found:
                found.add(neighbour)
                frontier.append(neighbour)
    return frozenset(component.atom_names[np.array(sorted(found), dtype=int)].tolist())
