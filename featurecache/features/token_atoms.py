"""Representative atoms of each token, as indices into the record's atom axis (AF3 §2.6, §4.3.2).

- centre: CA (amino acids), C1' (nucleotides); a per-atom token's own atom.
- distogram (AF3's pseudo-beta, `PseudoBetaInfo`): CB, CA for glycine; C4 for purines, C2 for
  pyrimidines; C1' for an unknown nucleotide (N, DN: no base); a per-atom token's own atom.
- frame (a, b, c): N, CA, C for amino acids; C1', C3', C4' for nucleotides. A per-atom token
  (ligand, glycan, modified residue) takes its atom as b and the two atoms of its residue
  nearest to it in the reference conformer as a (nearest) and c (second), as Protenix does;
  no frame (-1, -1, -1) when the residue has fewer than three atoms with reference positions
  or the three are within 25 degrees of colinear.

An index is -1 where the token has no such atom.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featurecache.features.atoms import NUCLEIC_CENTER_ATOM, PROTEIN_CENTER_ATOM, ResidueAtoms

PURINES = {"A", "G", "DA", "DG"}
PYRIMIDINES = {"C", "U", "DC", "DT"}
PROTEIN_FRAME = ("N", "CA", "C")
NUCLEIC_FRAME = ("C1'", "C3'", "C4'")
MIN_FRAME_ANGLE = 25.0  # degrees from colinear (AF3)


@dataclass(frozen=True, eq=False)
class TokenAtoms:
    """One token's atoms: `group` are local indices into `atoms`, the residue's atoms, which
    start at record atom `first_atom`."""

    molecule_type: str
    one_token: bool  # a standard residue: one token for all its atoms
    first_atom: int
    atoms: ResidueAtoms
    group: tuple[int, ...]

    def named(self, name: str) -> int:
        local = self.atoms.index(name)
        return -1 if local < 0 else self.first_atom + local


def representative_atoms(tokens: list[TokenAtoms], ref_pos: np.ndarray, ref_mask: np.ndarray) -> dict[str, np.ndarray]:
    """{"center": [N] int64, "distogram": [N] int32, "frame": [N, 3] int32} record atom indices."""
    center = np.zeros(len(tokens), np.int64)
    distogram = np.full(len(tokens), -1, np.int32)
    frame = np.full((len(tokens), 3), -1, np.int32)
    for index, token in enumerate(tokens):
        if not token.one_token:
            atom = token.first_atom + token.group[0]
            center[index] = distogram[index] = atom
            frame[index] = _nearest_atom_frame(token, atom, ref_pos, ref_mask)
            continue
        protein = token.molecule_type == "protein"
        found = token.named(PROTEIN_CENTER_ATOM if protein else NUCLEIC_CENTER_ATOM)
        center[index] = found if found >= 0 else token.first_atom + token.group[0]
        distogram[index] = token.named(_distogram_atom_name(token.atoms.code, protein))
        names = PROTEIN_FRAME if protein else NUCLEIC_FRAME
        atoms = [token.named(name) for name in names]
        if min(atoms) >= 0:
            frame[index] = atoms
    return {"center": center, "distogram": distogram, "frame": frame}


def _distogram_atom_name(code: str | None, protein: bool) -> str:
    if protein:
        return "CA" if code == "GLY" else "CB"
    if code in PURINES:
        return "C4"
    if code in PYRIMIDINES:
        return "C2"
    return NUCLEIC_CENTER_ATOM


def _nearest_atom_frame(
    token: TokenAtoms, atom: int, ref_pos: np.ndarray, ref_mask: np.ndarray
) -> tuple[int, int, int]:
    """(nearest, atom, second nearest) of the atom's residue in the reference conformer, or -1s."""
    first, count = token.first_atom, len(token.atoms.names)
    if not ref_mask[atom] or count < 3:
        return (-1, -1, -1)
    others = np.array([first + i for i in range(count) if first + i != atom and ref_mask[first + i]], np.int64)
    if others.size < 2:
        return (-1, -1, -1)
    distances = np.linalg.norm(ref_pos[others] - ref_pos[atom], axis=1)
    nearest, second = others[np.argsort(distances, kind="stable")[:2]]
    to_a, to_c = ref_pos[nearest] - ref_pos[atom], ref_pos[second] - ref_pos[atom]
    cosine = float(np.dot(to_a, to_c) / max(np.linalg.norm(to_a) * np.linalg.norm(to_c), 1e-8))
    angle = np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))
    if angle < MIN_FRAME_ANGLE or angle > 180.0 - MIN_FRAME_ANGLE:
        return (-1, -1, -1)
    return (int(nearest), atom, int(second))
