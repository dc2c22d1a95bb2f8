"""AF3 atom inputs on the real sample structures: every component's atoms, elements, charges and
bonds from its CCD entry, unresolved atoms present and masked, token bonds against _struct_conn,
representative atoms, frames."""

import numpy as np
import pytest

from featurecache.chem import decode_atom_names, link_drop_atoms, load_ccd
from featurecache.features.tokenize import tokenize
from featurecache.io.mmcif import parse_mmcif, read_mmcif
from tests.io.structure_edits import rna_with_5prime_gtp

SAMPLES = [
    "structures/209d-assembly1.cif",
    "structures/721p-assembly1.cif",
    "structures/2q2k.cif",
    "bonded/1igy.cif",
    "bonded/1ncb.cif",
    "bonded/5h73.cif",
]


@pytest.fixture(scope="module")
def tokenized(shared_data):
    found = {}
    for name in SAMPLES:
        structure = read_mmcif(shared_data / name)
        found[name.split("/")[1].split("-")[0].split(".")[0]] = (structure, tokenize(structure))
    rna = parse_mmcif(rna_with_5prime_gtp(shared_data), "gtp-rna.cif")  # RNA with a 5' GTP
    found["rna"] = (rna, tokenize(rna))
    return found


def _residues(structure, arrays):
    """(chain, position, residue, record atom indices) of every residue, by ref_space_uid."""
    uids = arrays["ref_space_uid"]
    starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]])
    ends = np.r_[starts[1:], uids.size]
    placed = [
        (chain, position, residue) for chain in structure.chains for position, residue in enumerate(chain.residues)
    ]
    assert len(placed) == starts.size  # every residue of these files has CCD atoms
    return [(*place, np.arange(start, end)) for place, start, end in zip(placed, starts, ends)]


@pytest.mark.parametrize("name", ["209d", "721p", "2q2k", "1igy", "1ncb", "5h73", "rna"])
def test_every_component_has_its_ccd_atoms_elements_charges_and_bonds(tokenized, name):
    """Protein, DNA, RNA, modified residues (209d's PXA, DVA, SAR, MVA; 2q2k's 5-iodouracil; a 5' GTP),
    ligands (GNP, HEPES, FMN, 7L7, orotate), ions (MG, CA) and glycans."""
    structure, tokens = tokenized[name]
    arrays = tokens.arrays
    ccd = load_ccd()
    bonded = {}
    for bond in structure.bonds:
        for end in (bond.first, bond.second):
            bonded.setdefault((end.chain_id, end.residue), set()).add(end.atom)
    kinds_seen = set()
    for chain, position, residue, atoms in _residues(structure, arrays):
        component = ccd.component(residue.name)
        drop = link_drop_atoms(
            component,
            chain.molecule_type,
            is_chain_start=position == 0,
            is_chain_end=position == len(chain.residues) - 1,
            bonded_atoms=bonded.get((chain.chain_id, position), ()),
        )
        expected = component.heavy_atoms().without(drop)
        where = f"{name} {chain.chain_id}/{residue.seq_id} {residue.name}"
        assert decode_atom_names(arrays["ref_atom_name_chars"][atoms]).tolist() == expected.atom_names.tolist(), where
        assert arrays["ref_element"][atoms].tolist() == expected.elements.tolist(), where
        assert arrays["ref_charge"][atoms].tolist() == expected.charges.tolist(), where
        tokens_of = arrays["atom_to_token"][atoms]
        if tokens_of.size > 1 and tokens_of[0] != tokens_of[1]:  # per-atom tokens: CCD bonds are token bonds
            pairs = {tuple(sorted(pair)) for pair in tokens_of[expected.bonds].tolist()}
            found = {tuple(pair) for pair in arrays["token_bonds"].tolist()}
            positions, resolved = arrays["atom_pos"][atoms], arrays["atom_mask"][atoms]
            too_long = {
                tuple(sorted(tokens_of[[i, j]].tolist()))
                for i, j in expected.bonds.tolist()
                if resolved[i] and resolved[j] and np.linalg.norm(positions[i] - positions[j]) > 2.4
            }
            assert pairs - too_long <= found, where
        kinds_seen.add(chain.molecule_type)
    assert kinds_seen >= ({"rna"} if name == "rna" else {"protein"})


def test_sample_kinds_cover_protein_dna_ligands_ions_and_modified_residues(tokenized):
    names = {
        residue.name for structure, _ in tokenized.values() for chain in structure.chains for residue in chain.residues
    }
    assert {"GNP", "MG", "PXA", "5IU", "EPE", "NAG", "BMA", "FMN", "7L7", "CA", "DA", "MET"} <= names


def test_unresolved_ligand_atoms_are_present_and_masked(shared_data):
    """Delete three atoms of 721p's GNP: the ligand keeps all 32 CCD atoms and its token count."""
    text = (shared_data / "structures" / "721p-assembly1.cif").read_text()
    whole = tokenize(parse_mmcif(text, "721p.cif")).arrays
    lines = text.splitlines()
    removed = 0
    kept = []
    for line in lines:
        fields = line.split()
        if removed < 3 and line.startswith("HETATM") and "GNP" in fields and fields[3] in ("PG", "O1G", "O2G"):
            removed += 1
            continue
        kept.append(line)
    assert removed == 3
    partial = tokenize(parse_mmcif("\n".join(kept) + "\n", "721p-partial.cif")).arrays
    assert partial["restype"].size == whole["restype"].size
    assert partial["atom_mask"].sum() == whole["atom_mask"].sum() - 3
    names = decode_atom_names(partial["ref_atom_name_chars"])
    missing = np.flatnonzero(~partial["atom_mask"] & np.isin(names, ["PG", "O1G", "O2G"]))
    assert missing.size == 3 and partial["is_ligand"][partial["atom_to_token"][missing]].all()
    assert (
        partial["ref_mask"][missing].all() and not partial["token_center_mask"][partial["atom_to_token"][missing]].any()
    )


def _token_of(structure, arrays, atom_ref):
    """Record token of a Structure atom reference."""
    chain_index = [chain.chain_id for chain in structure.chains].index(atom_ref.chain_id)
    uid = sum(len(chain.residues) for chain in structure.chains[:chain_index]) + atom_ref.residue
    atoms = np.flatnonzero(arrays["ref_space_uid"] == uid)
    names = decode_atom_names(arrays["ref_atom_name_chars"][atoms]).tolist()
    return int(arrays["atom_to_token"][atoms[names.index(atom_ref.atom)]])


@pytest.mark.parametrize("name, covale, disulf", [("1igy", 18, 18), ("1ncb", 9, 14)])
def test_bonded_samples_token_bonds_match_struct_conn(tokenized, name, covale, disulf):
    """Every covalent _struct_conn row with a glycan atom is a token bond; disulfides between
    protein residues (polymer-polymer, also between chains) are not (AF3 SI 2.8)."""
    structure, tokens = tokenized[name]
    arrays = tokens.arrays
    kinds = [bond.kind for bond in structure.bonds]
    assert kinds.count("covale") == covale and kinds.count("disulf") == disulf
    found = {tuple(pair) for pair in arrays["token_bonds"].tolist()}
    assert all(i < j for i, j in found)
    for bond in structure.bonds:
        pair = tuple(sorted((_token_of(structure, arrays, bond.first), _token_of(structure, arrays, bond.second))))
        if bond.kind == "disulf":
            assert pair not in found
            assert not arrays["is_ligand"][list(pair)].any()
        else:
            assert arrays["is_ligand"][list(pair)].any() and pair in found, bond
    # Inter-chain disulfides exist in the IgG (heavy-light, heavy-heavy) and stay in the Structure.
    if name == "1igy":
        assert any(bond.first.chain_id != bond.second.chain_id for bond in structure.bonds if bond.kind == "disulf")


def test_bonded_glycan_drops_o1_only_where_bonded(tokenized):
    """A NAG linked to ASN at C1 loses O1 (AF3); the NAG-ASN bond is a polymer-ligand token bond."""
    structure, tokens = tokenized["1igy"]
    arrays = tokens.arrays
    names = decode_atom_names(arrays["ref_atom_name_chars"])
    for _chain, _position, residue, atoms in _residues(structure, arrays):
        if residue.name == "NAG":
            assert "O1" not in names[atoms].tolist() and "C1" in names[atoms].tolist()


def test_representative_atoms_and_frames(tokenized):
    structure, tokens = tokenized["721p"]
    arrays = tokens.arrays
    names = decode_atom_names(arrays["ref_atom_name_chars"])
    restype_of = arrays["restype"]
    protein = np.flatnonzero(arrays["is_protein"])
    for token in protein[:50]:
        atom = arrays["distogram_atom_index"][token]
        assert arrays["atom_to_token"][atom] == token
        glycine = restype_of[token] == 7
        assert names[atom] == ("CA" if glycine else "CB")
        assert names[arrays["frame_atom_index"][token]].tolist() == ["N", "CA", "C"]
    ligand = np.flatnonzero(arrays["is_ligand"])
    for token in ligand:
        atom = arrays["distogram_atom_index"][token]
        assert arrays["atom_to_token"][atom] == token
        frame = arrays["frame_atom_index"][token]
        if frame[0] < 0:
            assert (frame == -1).all()
            continue
        assert frame[1] == atom
        uid = arrays["ref_space_uid"][atom]
        assert (arrays["ref_space_uid"][frame] == uid).all()
        distances = np.linalg.norm(arrays["ref_pos"][arrays["ref_space_uid"] == uid] - arrays["ref_pos"][atom], axis=1)
        nearest = np.sort(distances)[1]
        assert np.isclose(np.linalg.norm(arrays["ref_pos"][frame[0]] - arrays["ref_pos"][atom]), nearest)
    # MG is a one-atom residue: no frame.
    mg = [token for token in ligand if names[arrays["distogram_atom_index"][token]] == "MG"]
    assert mg and all((arrays["frame_atom_index"][token] == -1).all() for token in mg)


def test_nucleotide_distogram_atoms(tokenized):
    structure, tokens = tokenized["209d"]
    arrays = tokens.arrays
    names = decode_atom_names(arrays["ref_atom_name_chars"])
    dna = np.flatnonzero(arrays["is_dna"])
    purines = {26, 27}  # DA, DG
    for token in dna:
        atom = arrays["distogram_atom_index"][token]
        assert names[atom] == ("C4" if arrays["restype"][token] in purines else "C2")
        assert names[arrays["frame_atom_index"][token]].tolist() == ["C1'", "C3'", "C4'"]


def test_ref_space_uid_is_one_per_residue_instance_and_conformers_are_shared(tokenized):
    structure, tokens = tokenized["721p"]
    arrays = tokens.arrays
    assert arrays["ref_space_uid"].max() + 1 == sum(len(chain.residues) for chain in structure.chains)
    # Both GNP copies carry the same conformer (one per CCD code), in different reference spaces.
    names = decode_atom_names(arrays["ref_atom_name_chars"])
    pg = np.flatnonzero((names == "PG") & arrays["is_ligand"][arrays["atom_to_token"]])
    assert pg.size == 2 and arrays["ref_space_uid"][pg[0]] != arrays["ref_space_uid"][pg[1]]
    first = arrays["ref_space_uid"] == arrays["ref_space_uid"][pg[0]]
    second = arrays["ref_space_uid"] == arrays["ref_space_uid"][pg[1]]
    np.testing.assert_array_equal(arrays["ref_pos"][first], arrays["ref_pos"][second])
    assert "GNP" in tokens.conformer_codes and "MG" in tokens.conformer_codes
