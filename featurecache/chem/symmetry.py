"""Symmetric atoms of one residue or ligand: the relabellings of its atoms that leave the molecule
the same, which AF3 (SI 4.2) tries on the ground truth before the losses.

A symmetry is a permutation `sigma` of the component's atoms: the relabelled truth puts atom i
where atom sigma[i] was. Two sources:

- `residue_swaps`: the standard residues, by atom name. AF3 resolves the carboxylates of ASP and
  GLU, the rings of PHE and TYR, the guanidinium of ARG, and a chain's terminal carboxylate
  (O / OXT). Methyls of LEU and VAL and a phosphate's OP1 / OP2 are not symmetric: swapping
  them mirrors a prochiral centre, which no motion of the molecule does.
- `graph_symmetries`: any other component (ligands, modified residues), from RDKit's
  automorphisms of its heavy-atom graph (elements and bonds; bond orders and formal charges left
  out, since the CCD writes one resonance form: a carboxylate's or a guanidinium's atoms count as
  equal), kept only where they are
  proper: every tetrahedral centre keeps its handedness in the reference conformer. That one
  rule is what rejects LEU's and VAL's methyl swaps and keeps a benzene's twelve symmetries.
  tests/chem/test_symmetry.py checks that the rule gives `residue_swaps` on the CCD's entries.
"""

from __future__ import annotations

import itertools

import numpy as np

# Sets of atom-name pairs swapped together, per residue (one set = one non-identity symmetry).
RESIDUE_SWAPS: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "ASP": ((("OD1", "OD2"),),),
    "GLU": ((("OE1", "OE2"),),),
    "PHE": ((("CD1", "CD2"), ("CE1", "CE2")),),
    "TYR": ((("CD1", "CD2"), ("CE1", "CE2")),),
    "ARG": ((("NH1", "NH2"),),),
}
_AMINO_ACIDS = (
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
# A C-terminal residue's carboxylate (OXT is kept only at a protein chain's end).
TERMINAL_CARBOXYLATE = (("O", "OXT"),)

MAX_MATCHES = 1000  # automorphisms RDKit enumerates at most (a C60 has 120; combinations grow fast)
# |triple product| of unit bond vectors below this: a planar centre (0 for sp2, ~0.77 for sp3)
PLANAR_VOLUME = 0.3
NITROGEN = 7


def residue_swaps(code: str, names: tuple[str, ...]) -> list[np.ndarray]:
    """The non-identity symmetries of a standard residue with atoms `names` (in their order), as
    permutations [n]: every combination of its swap sets whose atoms are all present."""
    groups = [
        group
        for group in RESIDUE_SWAPS.get(code, ()) + ((TERMINAL_CARBOXYLATE,) if code in _AMINO_ACIDS else ())
        if all(a in names and b in names for a, b in group)
    ]
    index = {name: i for i, name in enumerate(names)}
    permutations = []
    for count in range(1, len(groups) + 1):
        for chosen in itertools.combinations(groups, count):
            permutation = np.arange(len(names))
            for a, b in itertools.chain.from_iterable(chosen):
                permutation[index[a]], permutation[index[b]] = index[b], index[a]
            permutations.append(permutation)
    return permutations


def graph_symmetries(
    elements: np.ndarray,
    charges: np.ndarray,
    bonds: np.ndarray,
    positions: np.ndarray,
    position_mask: np.ndarray,
    max_matches: int = MAX_MATCHES,
) -> list[np.ndarray]:
    """The proper non-identity symmetries of a heavy-atom graph, as permutations [n], fewest
    atoms moved first. elements, charges [n] ints (an element 0, unknown: no symmetries; charges
    only tell a quaternary nitrogen, which keeps its handedness, from one that inverts); bonds
    [b, 2] local indices; positions [n, 3] a reference conformer, position_mask [n] where known."""
    count = len(elements)
    if count < 2 or (np.asarray(elements) <= 0).any():
        return []
    from rdkit import Chem  # RDKit only where a component needs it

    molecule = Chem.RWMol()
    for element in np.asarray(elements).tolist():
        atom = Chem.Atom(int(element))  # no charge: the CCD puts a resonant charge on one atom
        atom.SetNoImplicit(True)
        molecule.AddAtom(atom)
    for first, second in np.asarray(bonds).reshape(-1, 2).tolist():
        if first != second and molecule.GetBondBetweenAtoms(first, second) is None:
            molecule.AddBond(first, second, Chem.BondType.SINGLE)
    molecule = molecule.GetMol()
    molecule.UpdatePropertyCache(strict=False)
    Chem.FastFindRings(molecule)
    matches = np.array(
        molecule.GetSubstructMatches(molecule, uniquify=False, maxMatches=max_matches), dtype=np.int64
    ).reshape(-1, count)
    elements = np.asarray(elements, np.int64)
    matches = matches[(elements[matches] == elements).all(axis=1)]
    neighbours = _neighbours(count, bonds)
    # a neutral nitrogen inverts freely: its substituents are not a fixed handedness
    centres = [
        atom
        for atom, around in enumerate(neighbours)
        if len(around) >= 3 and not (elements[atom] == NITROGEN and charges[atom] == 0)
    ]
    identity = np.arange(count)
    symmetries = [
        match
        for match in matches
        if not np.array_equal(match, identity)
        and _is_proper(match, centres, neighbours, np.asarray(positions, np.float64), np.asarray(position_mask, bool))
    ]
    symmetries.sort(key=lambda match: (int((match != identity).sum()), match.tolist()))
    return symmetries


def _neighbours(count: int, bonds: np.ndarray) -> list[list[int]]:
    neighbours: list[list[int]] = [[] for _ in range(count)]
    for first, second in np.asarray(bonds).reshape(-1, 2).tolist():
        if first != second and second not in neighbours[first]:
            neighbours[first].append(second)
            neighbours[second].append(first)
    return neighbours


def _handedness(centre: int, around: list[int], positions: np.ndarray) -> float:
    """Triple product of the unit vectors from `centre` to three of its neighbours."""
    vectors = positions[around] - positions[centre]
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-6)
    return float(np.dot(vectors[0], np.cross(vectors[1], vectors[2])))


def _is_proper(
    permutation: np.ndarray,
    centres: list[int],
    neighbours: list[list[int]],
    positions: np.ndarray,
    position_mask: np.ndarray,
) -> bool:
    """Whether relabelling by `permutation` keeps the handedness of every non-planar centre (in
    the reference conformer; a centre without positions for itself and three neighbours is not
    checked)."""
    for centre in centres:
        around = neighbours[centre][:3]
        image = [int(permutation[centre])] + [int(permutation[atom]) for atom in around]
        if not position_mask[[centre, *around]].all() or not position_mask[image].all():
            continue
        before = _handedness(centre, around, positions)
        if abs(before) < PLANAR_VOLUME:
            continue
        if np.sign(_handedness(image[0], image[1:], positions)) != np.sign(before):
            return False
    return True
