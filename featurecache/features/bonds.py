"""Token bonds (AF3 SI §2.8, Table 5 ``token_bonds``) as an edge list of token index pairs.

AF3: "a bond between any atom in token i and token j, restricted to just polymer-ligand and
ligand-ligand bonds and bonds less than 2.4 A during training". Here the atom bonds are

- the CCD bonds inside every component tokenized per atom: a ligand's (ligand-ligand) and,
  as Protenix does, a modified polymer residue's (otherwise its atom tokens would be unbonded);
- the file's covalent bonds between residues (Structure.bonds, from ``_struct_conn``) where
  at least one atom is in a ligand chain: glycan to asparagine, sugar to sugar, a covalent
  drug to its residue.

Bonds between polymer residues (peptide and phosphodiester links, disulfides, also between
chains) are polymer-polymer and not token bonds: the Structure keeps them. A bond whose two
atoms are both resolved more than 2.4 A apart is left out; one with an unresolved atom stays
(the CCD says it exists). Each token pair appears once, (i, j) with i < j, sorted.
"""

from __future__ import annotations

import numpy as np

from featurecache.io.structure import Bond, Structure

MAX_BOND_LENGTH = 2.4  # Angstrom (AF3)


def token_bonds(
    structure: Structure, placed: dict, arrays: dict[str, np.ndarray]
) -> tuple[np.ndarray, tuple[Bond, ...]]:
    """([bonds, 2] int32 token pairs, the structure's bonds among them: those touching a ligand
    that were kept). `placed`: (chain index, residue index) -> (first record atom, ResidueAtoms,
    one token for all its atoms) of every featurized residue; `arrays`: the token and atom arrays
    so far."""
    chain_index = {chain.chain_id: index for index, chain in enumerate(structure.chains)}
    atom_pairs = []
    for first, atoms, one_token in placed.values():
        if not one_token and len(atoms.bonds):  # a ligand's or a modified residue's atom tokens
            atom_pairs.append(atoms.bonds.astype(np.int64) + first)
    is_ligand_atom = arrays["is_ligand"][arrays["atom_to_token"]]
    inter, inter_bonds = [], []
    for bond in structure.bonds:
        ends = []
        for end in (bond.first, bond.second):
            found = placed.get((chain_index.get(end.chain_id, -1), end.residue))
            local = -1 if found is None else found[1].index(end.atom)
            ends.append(-1 if local < 0 else found[0] + local)
        if min(ends) >= 0 and (is_ligand_atom[ends[0]] or is_ligand_atom[ends[1]]):
            inter.append(ends)
            inter_bonds.append(bond)
    if inter:
        atom_pairs.append(np.array(inter, np.int64))
    if not atom_pairs:
        return np.zeros((0, 2), np.int32), ()
    pairs = np.concatenate(atom_pairs)
    position, mask = arrays["atom_pos"], arrays["atom_mask"]
    measured = mask[pairs[:, 0]] & mask[pairs[:, 1]]
    length = np.linalg.norm(position[pairs[:, 0]] - position[pairs[:, 1]], axis=1)
    kept = ~(measured & (length > MAX_BOND_LENGTH))
    kept_bonds = tuple(bond for bond, keep in zip(inter_bonds, kept[len(pairs) - len(inter) :]) if keep)
    pairs = pairs[kept]
    tokens = np.sort(arrays["atom_to_token"][pairs], axis=1)
    tokens = tokens[tokens[:, 0] != tokens[:, 1]]
    return np.unique(tokens, axis=0).astype(np.int32).reshape(-1, 2), kept_bonds
