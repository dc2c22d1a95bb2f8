"""The loader's atom_permutations on a real complex, PDB 5H73 (DHODH with an inhibitor, FMN,
orotate, sulfates and acetates): each ligand's proper symmetries and nothing else."""

import numpy as np
import pytest

from featurecache.features.symmetry import atom_permutations
from featurecache.features.tokenize import tokenize
from featurecache.io.mmcif import read_mmcif
from featurecache.schema import MAX_ATOM_PERMUTATIONS


@pytest.fixture(scope="module")
def complex_5h73(shared_data):
    structure = read_mmcif(shared_data / "bonded" / "5h73.cif")
    codes = [chain.residues[0].name for chain in structure.chains]
    return tokenize(structure).arrays, codes


def test_every_ligand_gets_its_proper_symmetries(complex_5h73):
    arrays, codes = complex_5h73
    permutations = atom_permutations(arrays)
    assert permutations.shape == (len(arrays["atom_to_token"]), MAX_ATOM_PERMUTATIONS)
    names = ["".join(chr(c + 32) for c in row if c) for row in arrays["ref_atom_name_chars"]]
    chain_of_atom = arrays["asym_id"][arrays["atom_to_token"]] - 1
    found: dict[str, list] = {}
    for chain, code in enumerate(codes):
        atoms = np.flatnonzero(chain_of_atom == chain)
        if not arrays["is_ligand"][arrays["atom_to_token"][atoms[0]]]:
            continue
        columns = (permutations[atoms] >= 0).all(axis=0)
        assert ((permutations[atoms] >= 0).any(axis=0) == columns).all()  # a symmetry covers its whole ligand
        moved = {
            names[atom] for atom in atoms for column in np.flatnonzero(columns) if permutations[atom, column] != atom
        }
        found.setdefault(code, []).append((int(columns.sum()), moved))
        # every column is a permutation of the ligand's own atoms
        for column in np.flatnonzero(columns):
            assert sorted(permutations[atoms, column].tolist()) == atoms.tolist()
    assert found["SO4"] == [(11, {"O1", "O2", "O3", "O4"})] * 2  # a tetrahedron's 12 rotations, no mirror
    assert found["FMN"] == [(2, {"O1P", "O2P", "O3P"})]  # its phosphate turns about P-O5'
    assert found["ORO"] == [(1, {"O71", "O72"})]  # orotate's carboxylate
    assert found["ACT"] == [(1, {"O", "OXT"})] * 4
    assert found["7L7"] == [(0, set())]
