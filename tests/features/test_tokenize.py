import numpy as np
import pytest

from featurecache import schema
from featurecache.features.atoms import encode_atom_names
from featurecache.features.tokenize import LONG_CHAIN_RESIDUES, input_warnings, tokenize
from featurecache.io.mmcif import parse_mmcif
from tests.io.structure_edits import rna_with_5prime_gtp, without_residue_atoms
from featurecache.io.mmcif import read_mmcif
from featurecache.io.structure import structure_from_sequences


@pytest.fixture(scope="module")
def structures(shared_data):
    names = [
        "209d-assembly1.cif",
        "721p-assembly1.cif",
        "7a4d-assembly1.cif",
        "2q2k.cif",
        "AF-P01112-F1-model_v4.cif.gz",
    ]
    return {name.split("-")[0].split(".")[0]: read_mmcif(shared_data / "structures" / name) for name in names}


def test_721p_tokens(structures):
    tokens = tokenize(structures["721p"])
    arrays = tokens.arrays
    # Two chains of 166 residues, each with one MG and a 32-atom GNP tokenized per atom.
    assert tokens.num_tokens == 2 * (166 + 1 + 32)
    assert arrays["is_ligand"].sum() == 2 * 33 and arrays["is_protein"].sum() == 2 * 166
    assert (arrays["restype"][arrays["is_ligand"]] == schema.UNK_PROTEIN).all()
    assert tokens.chain_entity == (1, 2, 3, 1, 2, 3)
    assert arrays["sym_id"][arrays["asym_id"] == 4].tolist() == [2] * 166
    np.testing.assert_array_equal(arrays["token_index"], np.arange(tokens.num_tokens))
    # The first token is MET 1 of chain A, centred on its CA.
    chain_a = structures["721p"].chains[0]
    met = chain_a.residues[0]
    assert arrays["restype"][0] == schema.RESTYPE_INDEX["MET"] and arrays["residue_index"][0] == 1
    np.testing.assert_allclose(arrays["token_center_pos"][0], met.positions[met.atom_names.index("CA")])
    # Atoms of a standard residue are its CCD heavy atoms (MET: 9, less OXT inside the chain), grouped by token.
    first_atoms = arrays["atom_to_token"] == 0
    assert first_atoms.sum() == 8
    assert (np.diff(arrays["atom_to_token"]) >= 0).all()


def test_209d_modified_residues_are_per_atom_tokens_of_the_peptide(structures):
    structure = structures["209d"]
    arrays = tokenize(structure).arrays
    peptide = arrays["asym_id"] == 3
    # THR and PRO (x2 each) are single tokens; DVA (7 atoms), SAR (5), MVA (8) and PXA (23) are
    # per atom, with their CCD atoms: the N-methyl carbons (CN) the model lacks are masked tokens.
    # AF3 drops OXT inside a chain only: PXA keeps its (unresolved) leaving atom OXT', and the
    # last MVA its OXT.
    assert peptide.sum() == 4 + 2 * (7 + 5 + 8) + 23 + 1
    assert arrays["asym_id"].max() == 3  # no ligand chain: PXA is residue 6 of the peptide
    assert arrays["is_protein"][peptide].all() and not arrays["is_ligand"].any()
    dva_tokens = peptide & (arrays["residue_index"] == 2)
    assert (arrays["restype"][dva_tokens] == schema.RESTYPE_INDEX["VAL"]).all()
    sarcosine = np.flatnonzero(peptide & (arrays["residue_index"] == 4))
    names = [
        bytes(row + 32).decode().rstrip(chr(32))
        for row in arrays["ref_atom_name_chars"][np.isin(arrays["atom_to_token"], sarcosine)]
    ]
    assert names == ["N", "CA", "C", "O", "CN"]
    assert arrays["atom_mask"][np.isin(arrays["atom_to_token"], sarcosine)].tolist() == [True, True, True, True, False]
    pxa = peptide & (arrays["residue_index"] == 6)
    assert pxa.sum() == 23 and arrays["token_center_mask"][pxa].sum() == 22
    assert (arrays["restype"][pxa] == schema.UNK_PROTEIN).all()
    dna = arrays["asym_id"] == 1
    assert arrays["restype"][dna].tolist() == [schema.RESTYPE_INDEX[f"D{b}"] for b in "GAAGCTTC"]


def test_2q2k_unresolved_residues_are_masked(structures):
    arrays = tokenize(structures["2q2k"]).arrays
    protein = arrays["asym_id"] == 2
    assert protein.sum() == 70
    assert arrays["token_center_mask"][protein].sum() == 45
    unresolved_atoms = np.isin(arrays["atom_to_token"], np.flatnonzero(protein & ~arrays["token_center_mask"]))
    assert not arrays["atom_mask"][unresolved_atoms].any()
    assert (arrays["atom_pos"][unresolved_atoms] == 0).all()
    # 5-iodouracil nucleotides are per-atom DNA tokens with the unknown-DNA class.
    iodine = arrays["ref_element"] == 53
    assert iodine.sum() == 2
    tokens = arrays["atom_to_token"][iodine]
    assert arrays["is_dna"][tokens].all() and (arrays["restype"][tokens] == schema.UNK_DNA).all()


def test_nucleotide_centre_is_c1_prime(structures):
    structure = structures["209d"]
    arrays = tokenize(structure).arrays
    residue = structure.chains[0].residues[0]
    np.testing.assert_allclose(arrays["token_center_pos"][0], residue.positions[residue.atom_names.index("C1'")])


def test_sequence_only_structure_has_masked_atoms():
    structure = structure_from_sequences("t", [("A", "protein", "MG"), ("B", "rna", "AU")])
    arrays = tokenize(structure).arrays
    assert arrays["restype"].tolist() == [schema.RESTYPE_INDEX[n] for n in ("MET", "GLY", "A", "U")]
    assert not arrays["atom_mask"].any() and not arrays["token_center_mask"].any()
    # CCD heavy atoms: MET 9 less OXT (not the chain's end), GLY 5 with OXT; A 23 with OP3 (the
    # chain's start), U 21 less OP3.
    assert arrays["atom_to_token"].size == 8 + 5 + 23 + 20


def test_atom_name_encoding():
    encoded = encode_atom_names(["CA", "O5'", "C1'"])
    assert encoded.dtype == np.uint8 and encoded.shape == (3, 4)
    assert encoded[0].tolist() == [ord("C") - 32, ord("A") - 32, 0, 0]
    assert encoded[1].tolist() == [ord("O") - 32, ord("5") - 32, ord("'") - 32, 0]


def _atom_names(arrays, tokens):
    rows = arrays["ref_atom_name_chars"][np.isin(arrays["atom_to_token"], tokens)]
    return [bytes(row + 32).decode().rstrip() for row in rows]


def test_5prime_gtp_is_per_atom_tokens_of_the_rna_with_its_ccd_atoms(shared_data):
    """The RNA's first nucleotide is a GTP: one token per CCD heavy atom (32), the triphosphate
    that the model lacks masked, all in the RNA chain; no ligand tokens, no token without atoms."""
    structure = parse_mmcif(rna_with_5prime_gtp(shared_data), "gtp-rna.cif")
    arrays = tokenize(structure).arrays
    gtp = np.flatnonzero((arrays["asym_id"] == 1) & (arrays["residue_index"] == 1))
    assert gtp.size == 32 and arrays["is_rna"][gtp].all() and not arrays["is_ligand"].any()
    assert (arrays["restype"][gtp] == schema.RESTYPE_INDEX["G"]).all()
    names = _atom_names(arrays, gtp)
    assert names[:3] == ["PG", "O1G", "O2G"] and "C1'" in names
    resolved = dict(zip(names, arrays["atom_mask"][np.isin(arrays["atom_to_token"], gtp)]))
    assert not any(resolved[name] for name in ("PG", "PB", "PA", "O1A")) and resolved["C1'"]
    assert sum(resolved.values()) == len(structure.chain("A").residues[0].atom_names) == 19
    assert set(np.unique(arrays["atom_to_token"])) == set(range(len(arrays["restype"])))


def test_unresolved_modified_residue_keeps_its_ccd_atoms_masked(shared_data):
    text = without_residue_atoms(rna_with_5prime_gtp(shared_data), "A", 1)
    structure = parse_mmcif(text, "gtp-unresolved.cif")
    assert structure.chain("A").residues[0].name == "GTP" and not structure.chain("A").residues[0].is_resolved
    arrays = tokenize(structure).arrays
    gtp = np.flatnonzero((arrays["asym_id"] == 1) & (arrays["residue_index"] == 1))
    assert gtp.size == 32 and not arrays["token_center_mask"][gtp].any()
    assert not arrays["atom_mask"][np.isin(arrays["atom_to_token"], gtp)].any()


def test_long_chains_and_structure_warnings_reach_input_warnings():
    long = "M" + "ACDEFGHIKLMNPQRSTVWY" * (LONG_CHAIN_RESIDUES // 20)
    structure = structure_from_sequences("t", [("A", "protein", "MKB"), ("B", "protein", long)])
    warnings = input_warnings(structure)
    assert warnings[0] == "chain A: 1 B read as X (Asx: D or N)"
    assert warnings[1].startswith(f"chain B: {len(long):,} residues, longer than {LONG_CHAIN_RESIDUES:,}")
    assert input_warnings(structure_from_sequences("t", [("A", "protein", long[:LONG_CHAIN_RESIDUES])])) == []
