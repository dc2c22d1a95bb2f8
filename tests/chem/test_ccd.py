"""CCD components from biotite's bundled CCD and from a user's components.cif."""

import pickle
import re

import biotite.structure as struc
import biotite.structure.info as biotite_info
import gemmi
import numpy as np
import pytest

from featurecache.chem import Ccd, UnknownComponentError, atomic_number, load_ccd
from tests.chem._components import write_components_cif

SAMPLE_FILES = [
    "bonded/1igy.cif",
    "bonded/1ncb.cif",
    "bonded/5h73.cif",
    "structures/209d-assembly1.cif",
    "structures/721p-assembly1.cif",
    "structures/7a4d-assembly1.cif",
    "structures/2q2k.cif",
]
NAMED_CODES = ["ALA", "GLY", "DA", "U", "MSE", "SEP", "NAG", "HEM", "ATP", "ZN"]


@pytest.fixture(scope="module")
def ccd():
    return load_ccd()


def _sample_codes(shared_data) -> list[str]:
    codes = set()
    for name in SAMPLE_FILES:
        block = gemmi.cif.read(str(shared_data / name)).sole_block()
        codes.update(block.find_values("_chem_comp.id"))
    return sorted(codes)


def _bond_set(names, pairs, orders):
    return {(frozenset((names[i], names[j])), int(order)) for (i, j), order in zip(pairs, orders)}


def _assert_matches_biotite(component):
    """Names, elements, charges and bonds equal biotite's own reading of the entry."""
    reference = biotite_info.residue(component.code, allow_missing_coord=True)
    assert component.atom_names.tolist() == reference.atom_name.tolist()
    assert component.elements.tolist() == [atomic_number(e) for e in reference.element]
    assert component.charges.tolist() == reference.charge.tolist()
    bonds = reference.bonds.as_array()
    reference_orders = [struc.BondType(t).without_aromaticity().value for t in bonds[:, 2]]
    assert _bond_set(component.atom_names, component.bonds, component.bond_orders) == _bond_set(
        reference.atom_name, bonds[:, :2], reference_orders
    )


@pytest.mark.parametrize("code", NAMED_CODES)
def test_named_components_match_ccd(ccd, code):
    component = ccd.component(code)
    assert component.code == code and component.is_complete
    _assert_matches_biotite(component)


def test_every_sample_component_matches_ccd_and_the_structures(ccd, shared_data):
    """Every component of the sample structures: CCD entry as biotite reads it, and every
    heavy atom the structure files list exists in it with the same element."""
    codes = _sample_codes(shared_data)
    assert {"NAG", "NDG", "FUC", "FUL", "BMA", "MAN", "GAL", "7L7", "FMN", "ORO", "GNP", "PXA", "5IU"} <= set(codes)
    for code in codes:
        _assert_matches_biotite(ccd.component(code))
    for name in SAMPLE_FILES:
        structure = gemmi.read_structure(str(shared_data / name))
        for residue in (residue for chain in structure[0] for residue in chain):
            heavy = ccd.component(residue.name).heavy_atoms()
            elements = dict(zip(heavy.atom_names.tolist(), heavy.elements.tolist()))
            for atom in residue:
                if atom.element.atomic_number > 1:
                    assert elements[atom.name] == atom.element.atomic_number, (name, residue.name, atom.name)


def test_alanine_heavy_atoms_and_leaving_atoms(ccd):
    alanine = ccd.component("ALA")
    assert alanine.num_atoms == 13
    assert alanine.atom_names[alanine.leaving].tolist() == ["OXT", "H2", "HXT"]
    heavy = alanine.heavy_atoms()
    assert heavy.atom_names.tolist() == ["N", "CA", "C", "O", "CB", "OXT"]
    assert heavy.elements.tolist() == [7, 6, 6, 8, 6, 8]
    assert not heavy.is_complete
    assert _bond_set(heavy.atom_names, heavy.bonds, heavy.bond_orders) == {
        (frozenset(("N", "CA")), 1),
        (frozenset(("CA", "C")), 1),
        (frozenset(("C", "O")), 2),
        (frozenset(("CA", "CB")), 1),
        (frozenset(("C", "OXT")), 1),
    }
    linked = heavy.without({"OXT", "HXT"})  # HXT is already gone: ignored
    assert linked.atom_names.tolist() == ["N", "CA", "C", "O", "CB"]
    assert len(linked.bonds) == 4 and linked.bonds.max() < 5


def test_glycine_and_nucleotides(ccd):
    assert ccd.component("GLY").heavy_atoms().atom_names.tolist() == ["N", "CA", "C", "O", "OXT"]
    deoxyadenosine = ccd.component("DA")
    assert deoxyadenosine.type == "DNA LINKING"
    assert "OP3" in deoxyadenosine.atom_names[deoxyadenosine.leaving].tolist()
    assert "O2'" not in deoxyadenosine.atom_names.tolist()
    uridine = ccd.component("U").heavy_atoms()
    assert uridine.type == "RNA LINKING" and "O2'" in uridine.atom_names.tolist()
    assert uridine.num_atoms == 21


def test_modified_residues_and_ligands(ccd):
    selenomethionine = ccd.component("MSE")
    assert selenomethionine.parent_code == "MET" and selenomethionine.one_letter_code == "M"
    assert selenomethionine.elements[selenomethionine.atom_index("SE")] == 34
    phosphoserine = ccd.component("SEP").heavy_atoms()
    assert phosphoserine.elements[phosphoserine.atom_index("P")] == 15
    assert phosphoserine.parent_code == "SER"
    heme = ccd.component("HEM")
    assert heme.elements[heme.atom_index("FE")] == 26 and heme.parent_code is None
    assert heme.heavy_atoms().num_atoms == 43
    assert ccd.component("ATP").heavy_atoms().num_atoms == 31
    zinc = ccd.component("ZN")
    assert zinc.num_atoms == 1 and zinc.charges.tolist() == [2] and zinc.bonds.shape == (0, 2)


def test_coordinates_and_missing_flags(ccd):
    alanine = ccd.component("ALA")
    assert not alanine.ideal_missing.any() and not alanine.model_missing.any()
    # CCD ideal coordinates of ALA N, as the CCD lists them
    np.testing.assert_allclose(alanine.ideal_pos[0], [-0.966, 0.493, 1.500], atol=1e-3)
    # CUZ (tetranuclear copper sulfide) has no ideal coordinates at all, only model ones
    copper_sulfide = ccd.component("CUZ")
    assert copper_sulfide.ideal_missing.all() and not copper_sulfide.model_missing.any()
    assert not copper_sulfide.ideal_pos.any()


def test_components_are_read_only_and_cached(ccd):
    component = ccd.component("ATP")
    assert ccd.component("ATP") is component
    with pytest.raises(ValueError):
        component.atom_names[0] = "X"


def test_unknown_code_names_the_code(ccd):
    with pytest.raises(UnknownComponentError, match="'QQQQQ'") as error:
        ccd.component("QQQQQ")
    assert error.value.code == "QQQQQ"
    assert "QQQQQ" not in ccd and "ATP" in ccd


def test_ccd_travels_to_workers_as_its_path(ccd, tmp_path):
    assert pickle.loads(pickle.dumps(ccd)) is ccd
    path = tmp_path / "components.cif"
    write_components_cif(path, ["ZN"])
    assert pickle.loads(pickle.dumps(load_ccd(path))) is load_ccd(path)


def test_bundled_version_names_biotite_and_the_ccd_date(ccd):
    assert re.fullmatch(r"biotite-[\d.]+:ccd-\d{4}-\d\d-\d\d", ccd.version)
    assert ccd.release_date >= "2024-01-01"
    assert load_ccd() is ccd


@pytest.mark.parametrize("file_name", ["components.cif", "components.cif.gz"])
def test_user_components_file(ccd, tmp_path, file_name):
    path = tmp_path / file_name
    write_components_cif(path, ["ALA", "ATP", "ZN", "CUZ"])
    user = load_ccd(path)
    assert user is not ccd and user.path == path
    assert user.version.startswith("sha256-") and user.version != ccd.version
    assert user.release_date == max(ccd.component(c).modified_date for c in ["ALA", "ATP", "ZN", "CUZ"])
    for code in ["ALA", "ATP", "ZN", "CUZ"]:
        mine, bundled = user.component(code), ccd.component(code)
        for field in (
            "atom_names",
            "elements",
            "charges",
            "leaving",
            "aromatic",
            "bonds",
            "bond_orders",
            "ideal_pos",
            "ideal_missing",
            "model_pos",
            "model_missing",
        ):
            np.testing.assert_array_equal(getattr(mine, field), getattr(bundled, field), err_msg=f"{code} {field}")
        for field in ("type", "modified_date", "parent_code"):
            assert getattr(mine, field) == getattr(bundled, field), (code, field)
    with pytest.raises(UnknownComponentError, match=f"'HEM' is not in CCD file {re.escape(str(path))}"):
        user.component("HEM")


def test_missing_or_unreadable_user_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.cif"):
        Ccd(tmp_path / "nowhere.cif")
    not_cif = tmp_path / "notes.cif"
    not_cif.write_text("hello\n")
    with pytest.raises(ValueError, match="notes.cif has no data blocks"):
        Ccd(not_cif).component("ATP")
    broken = tmp_path / "broken.cif"
    broken.write_text("data_X\n_chem_comp.id X\nloop_\n_chem_comp_atom.atom_id\n_chem_comp_atom.charge\nC1 x\n")
    with pytest.raises(ValueError, match="broken.cif: entry 'X' is malformed"):
        Ccd(broken).component("X")
