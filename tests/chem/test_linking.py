"""Leaving atoms: AF3's drop rules and the CCD's leaving-atom groups."""

import pytest

from featurecache.chem import (
    is_saccharide,
    leaving_atoms_bonded_to,
    link_drop_atoms,
    load_ccd,
)


@pytest.fixture(scope="module")
def ccd():
    return load_ccd()


def test_protein_residues_lose_oxt_except_at_the_c_terminus(ccd):
    for code in ("ALA", "GLY", "MSE", "SEP"):
        component = ccd.component(code)
        inside = link_drop_atoms(component, "protein", is_chain_start=False, is_chain_end=False)
        assert inside == {"OXT"}
        assert link_drop_atoms(component, "protein", is_chain_start=True, is_chain_end=True) == set()
        kept = component.heavy_atoms().without(inside)
        assert "OXT" not in kept.atom_names.tolist() and "C" in kept.atom_names.tolist()


def test_nucleotides_lose_op3_except_at_the_5_prime_end(ccd):
    for code, kind in (("DA", "dna"), ("U", "rna")):
        component = ccd.component(code)
        assert link_drop_atoms(component, kind, is_chain_start=False, is_chain_end=True) == {"OP3"}
        assert link_drop_atoms(component, kind, is_chain_start=True, is_chain_end=False) == set()


def test_glycans_lose_o1_unless_it_is_bonded(ccd):
    nag = ccd.component("NAG")
    assert is_saccharide(nag) and not is_saccharide(ccd.component("ATP"))
    # N-linked: C1 bonded to asparagine ND2
    assert link_drop_atoms(nag, "ligand", is_chain_start=True, is_chain_end=True, bonded_atoms={"C1"}) == {"O1"}
    assert link_drop_atoms(nag, "ligand", is_chain_start=True, is_chain_end=True, bonded_atoms={"O1"}) == set()
    # A glycan bonded to nothing: AF3 as trained drops O1; the fix keeps it.
    assert link_drop_atoms(nag, "ligand", is_chain_start=True, is_chain_end=True) == {"O1"}
    assert link_drop_atoms(nag, "ligand", is_chain_start=True, is_chain_end=True, fix_standalone_glycans=True) == set()
    assert nag.heavy_atoms().without({"O1"}).num_atoms == 14


def test_other_ligands_keep_their_atoms(ccd):
    for code in ("ATP", "HEM", "ZN"):
        assert link_drop_atoms(ccd.component(code), "ligand", is_chain_start=True, is_chain_end=True) == set()


def test_unknown_chain_kind_is_refused(ccd):
    with pytest.raises(ValueError, match="'peptide'"):
        link_drop_atoms(ccd.component("ALA"), "peptide", is_chain_start=True, is_chain_end=True)


def test_leaving_atoms_bonded_to_follow_the_ccd_flags(ccd):
    assert leaving_atoms_bonded_to(ccd.component("NAG"), ["C1"]) == {"O1", "HO1"}
    assert leaving_atoms_bonded_to(ccd.component("ALA"), ["C"]) == {"OXT", "HXT"}
    assert leaving_atoms_bonded_to(ccd.component("ALA"), ["N"]) == {"H2"}
    assert leaving_atoms_bonded_to(ccd.component("DA"), ["P"]) == {"OP3"}
    assert leaving_atoms_bonded_to(ccd.component("DA"), ["O3'"]) == {"HO3'"}
    # O4 of a glycan takes the next sugar's C1: only its hydrogen leaves
    assert leaving_atoms_bonded_to(ccd.component("NAG"), ["O4"]) == {"HO4"}
    with pytest.raises(KeyError, match="NAG: no atom named 'C9'"):
        leaving_atoms_bonded_to(ccd.component("NAG"), ["C9"])
