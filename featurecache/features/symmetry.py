"""The sample's `atom_permutations` (schema.LOAD_TIME_FEATURES): each residue's or ligand's
symmetric relabellings of its atoms, for the model's permutation alignment (AF3 SI 4.2).

Computed by the loader after the crop, from arrays every record already has (no schema change):
a standard residue's symmetries come by residue class and atom names (chem.symmetry.residue_swaps);
a ligand's or modified residue's (tokenized per atom) from its atoms' elements, the token bonds
among them (the CCD's bonds) and its reference conformer (chem.symmetry.graph_symmetries),
cached per distinct component. An atom bonded to another residue stays where it is (a symmetry
moving it would move the bond), as do a per-atom polymer residue's link atoms (N, C, P, O3'),
whose peptide and phosphodiester bonds are not token bonds.
"""

from __future__ import annotations

import numpy as np

from featurecache.chem.symmetry import graph_symmetries, residue_swaps
from featurecache.schema import MAX_ATOM_PERMUTATIONS, RESTYPES

POLYMER_LINK_ATOMS = ("N", "C", "P", "O3'")
_CACHE_SIZE = 4096
_graph_cache: dict[bytes, list[np.ndarray]] = {}


def atom_permutations(arrays: dict[str, np.ndarray], max_permutations: int = MAX_ATOM_PERMUTATIONS) -> np.ndarray:
    """[atom, max_permutations] int32: column k holds, for each atom of a residue with more than k
    symmetries (the identity not counted), the atom whose position it takes under the k-th one
    (fewest atoms moved first); -1 elsewhere."""
    atom_to_token = arrays["atom_to_token"].astype(np.int64)
    num_atoms = len(atom_to_token)
    result = np.full((num_atoms, max_permutations), -1, np.int32)
    if num_atoms == 0:
        return result
    uid = arrays["ref_space_uid"]
    starts = np.flatnonzero(np.r_[True, uid[1:] != uid[:-1]])
    ends = np.r_[starts[1:], num_atoms]
    names = _atom_names(arrays["ref_atom_name_chars"])
    bonds, linked = _atom_bonds(arrays, atom_to_token)
    is_polymer = (arrays["is_protein"] | arrays["is_rna"] | arrays["is_dna"])[atom_to_token]
    for start, end in zip(starts.tolist(), ends.tolist()):
        tokens = atom_to_token[start:end]
        if end - start < 2:
            continue
        if (tokens == tokens[0]).all():  # a standard residue: one token
            found = residue_swaps(RESTYPES[int(arrays["restype"][tokens[0]])], tuple(names[start:end]))
        else:
            found = _component_symmetries(arrays, names, bonds, linked, is_polymer, start, end)
        for column, permutation in enumerate(found[:max_permutations]):
            result[start:end, column] = start + permutation
    return result


def _atom_names(chars: np.ndarray) -> list[str]:
    """Decode AF3's atom-name encoding (ord(c) - 32 per character, 0-padded)."""
    return ["".join(chr(int(code) + 32) for code in row if code) for row in chars]


def _atom_bonds(arrays: dict[str, np.ndarray], atom_to_token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The token bonds between one-atom tokens (ligand and modified-residue atoms) as atom pairs
    [b, 2], and the atoms of one-atom tokens bonded to a standard residue's token (a glycan's
    atom on an asparagine), whose other atom the token bond does not name."""
    pairs = arrays["token_bonds"].reshape(-1, 2).astype(np.int64)
    num_tokens = len(arrays["restype"])
    single = np.bincount(atom_to_token, minlength=num_tokens) == 1
    first = np.full(num_tokens, -1, np.int64)
    first[atom_to_token[::-1]] = np.arange(len(atom_to_token))[::-1]
    pairs = pairs[(pairs >= 0).all(axis=1)]
    both = single[pairs].all(axis=1)
    one = single[pairs].any(axis=1) & ~both
    return first[pairs[both]], first[pairs[one][single[pairs[one]]]]


def _component_symmetries(
    arrays: dict[str, np.ndarray],
    names: list[str],
    bonds: np.ndarray,
    linked: np.ndarray,
    is_polymer: np.ndarray,
    start: int,
    end: int,
) -> list[np.ndarray]:
    """Symmetries of the per-atom residue on atoms [start, end) that keep its linked atoms fixed."""
    inside = (bonds >= start) & (bonds < end)
    local = bonds[inside.all(axis=1)] - start
    crossing = inside.any(axis=1) & ~inside.all(axis=1)  # bonds to other residues: their inner atom stays
    fixed = {int(atom) - start for atom in bonds[crossing][inside[crossing]]}
    fixed |= {int(atom) - start for atom in linked if start <= atom < end}
    fixed |= {
        index for index, name in enumerate(names[start:end]) if is_polymer[start + index] and name in POLYMER_LINK_ATOMS
    }
    elements = arrays["ref_element"][start:end].astype(np.int64)
    charges = arrays["ref_charge"][start:end].astype(np.int64)
    positions = np.asarray(arrays["ref_pos"][start:end], np.float64)
    known = np.asarray(arrays["ref_mask"][start:end], bool)
    key = b"|".join(
        np.ascontiguousarray(part).tobytes()
        for part in (elements, charges, np.sort(local, axis=1), np.round(positions, 1), known)
    )
    found = _graph_cache.get(key)
    if found is None:
        if len(_graph_cache) >= _CACHE_SIZE:
            _graph_cache.clear()
        found = _graph_cache[key] = graph_symmetries(elements, charges, local, positions, known)
    fixed_atoms = np.array(sorted(fixed), np.int64)
    return [
        permutation for permutation in found if not len(fixed_atoms) or (permutation[fixed_atoms] == fixed_atoms).all()
    ]
