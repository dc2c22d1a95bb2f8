"""Symmetric atoms: the proper graph symmetries of the CCD's standard residues are exactly
RESIDUE_SWAPS (no LEU / VAL methyl swaps, no phosphate OP1 / OP2), and ligands get theirs from
RDKit's automorphisms (a benzene ring's twelve, a carboxylate's two oxygens)."""

import numpy as np
import pytest

from featurecache.chem import load_ccd
from featurecache.chem.symmetry import RESIDUE_SWAPS, graph_symmetries, residue_swaps

AMINO_ACIDS = (
    "ALA",
    "ARG",
    "ASN",
    "ASP",
    "CYS",
    "GLN",
    "GLU",
    "GLY",
    "HIS",
    "ILE",
    "LEU",
    "LYS",
    "MET",
    "PHE",
    "PRO",
    "SER",
    "THR",
    "TRP",
    "TYR",
    "VAL",
)


@pytest.fixture(scope="module")
def ccd():
    return load_ccd()


def _heavy(component, drop=()):
    """The component's heavy atoms without `drop`: names, elements, charges, bonds, positions."""
    keep = np.flatnonzero(~component.is_hydrogen & ~np.isin(component.atom_names, drop))
    local = {int(atom): index for index, atom in enumerate(keep)}
    bonds = np.array([[local[a], local[b]] for a, b in component.bonds.tolist() if a in local and b in local])
    return (
        tuple(component.atom_names[keep].tolist()),
        component.elements[keep],
        component.charges[keep],
        bonds,
        component.ideal_pos[keep],
        ~component.ideal_missing[keep],
    )


def _as_sets(permutations):
    return sorted(tuple(p.tolist()) for p in permutations)


@pytest.mark.parametrize("code", AMINO_ACIDS)
def test_graph_symmetries_of_the_ccd_amino_acids_are_the_residue_swaps(ccd, code):
    for drop in (("OXT",), ()):  # inside a chain, and at its C-terminus
        names, elements, charges, bonds, positions, known = _heavy(ccd.component(code), drop)
        found = graph_symmetries(elements, charges, bonds, positions, known)
        assert _as_sets(found) == _as_sets(residue_swaps(code, names)), (code, drop)
    assert (code in RESIDUE_SWAPS) == bool(residue_swaps(code, _heavy(ccd.component(code), ("OXT",))[0]))


@pytest.mark.parametrize("code", ["DA", "DC", "A", "U"])
def test_a_phosphate_inside_a_nucleic_chain_has_no_symmetry(ccd, code):
    names, elements, charges, bonds, positions, known = _heavy(ccd.component(code), ("OP3",))
    assert graph_symmetries(elements, charges, bonds, positions, known) == []
    # a 5' phosphate (OP3 kept) turns about its P-O5' bond: the two rotations, never a mirror
    names, elements, charges, bonds, positions, known = _heavy(ccd.component(code))
    rotations = graph_symmetries(elements, charges, bonds, positions, known)
    oxygens = [names.index(name) for name in ("OP1", "OP2", "OP3")]
    assert len(rotations) == 2
    for permutation in rotations:
        cycle = [int(permutation[atom]) for atom in oxygens]
        assert sorted(cycle) == sorted(oxygens) and all(a != b for a, b in zip(cycle, oxygens))


def test_benzene_has_its_twelve_symmetries_and_a_carboxylate_its_swap(ccd):
    names, elements, charges, bonds, positions, known = _heavy(ccd.component("BNZ"))
    assert len(graph_symmetries(elements, charges, bonds, positions, known)) == 11  # and the identity
    # acetate (ACT): C, O, OXT, CH3 -> the two oxygens swap, bond orders notwithstanding
    names, elements, charges, bonds, positions, known = _heavy(ccd.component("ACT"))
    (swap,) = graph_symmetries(elements, charges, bonds, positions, known)
    moved = {names[atom] for atom in np.flatnonzero(swap != np.arange(len(names)))}
    assert moved == {"O", "OXT"}


def test_unknown_elements_and_single_atoms_have_no_symmetries():
    assert (
        graph_symmetries(
            np.array([6, 0, 0]), np.zeros(3), np.array([[0, 1], [0, 2]]), np.zeros((3, 3)), np.zeros(3, bool)
        )
        == []
    )
    assert graph_symmetries(np.array([12]), np.zeros(1), np.zeros((0, 2)), np.zeros((1, 3)), np.ones(1, bool)) == []
