"""Reference conformers: RDKit ETKDGv3 with CCD fallbacks, and the SMILES path."""

import dataclasses
import re

import gemmi
import numpy as np
import pytest
from rdkit import Chem

from featurecache.chem import (
    FALLBACK_REASONS,
    SOURCES,
    ConformerSettings,
    SmilesError,
    canonical_smiles,
    component_conformer,
    load_ccd,
    smiles_conformer,
)
from featurecache.chem.conformer import bond_length_deviation
from featurecache.chem.molecule import molecule_from_component

ASPIRIN = "CC(=O)Oc1ccccc1C(=O)O"
METALS = {12, 20, 26, 27, 29, 30}  # Mg, Ca, Fe, Co, Cu, Zn: ETKDG knows no metal geometry
IRIDIUM = 77


@pytest.fixture(scope="module")
def ccd():
    return load_ccd()


def _bond_lengths(positions, bonds):
    return np.linalg.norm(positions[bonds[:, 0]] - positions[bonds[:, 1]], axis=1)


def _chiral_volume(positions, bonds, atom):
    """Signed volume spanned by the first three heavy neighbours of `atom`."""
    around = [second if first == atom else first for first, second in bonds.tolist() if atom in (first, second)]
    a, b, c = (positions[n] - positions[atom] for n in around[:3])
    return float(np.dot(a, np.cross(b, c)))


def _stereo_centres(component):
    """Heavy-atom indices of the tetrahedral stereo centres RDKit reads from the CCD entry."""
    molecule, _ = molecule_from_component(component)
    heavy_index = np.cumsum(~component.is_hydrogen) - 1
    return [
        int(heavy_index[atom.GetIdx()])
        for atom in molecule.GetAtoms()
        if atom.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED
    ]


@pytest.mark.parametrize("code", ["ALA", "NAG", "ATP", "7L7", "FMN", "ORO"])
def test_conformer_matches_ccd_ideal_geometry(ccd, code):
    component = ccd.component(code)
    conformer = component_conformer(component)
    heavy = component.heavy_atoms()
    assert conformer.source == "rdkit" and conformer.sanitization == "full" and conformer.fallback is None
    assert conformer.atom_names.tolist() == heavy.atom_names.tolist()
    assert conformer.elements.tolist() == heavy.elements.tolist()
    assert conformer.positions.dtype == np.float32 and conformer.mask.all()
    np.testing.assert_array_equal(conformer.bonds, heavy.bonds)
    ideal_lengths = _bond_lengths(heavy.ideal_pos, heavy.bonds)
    deviation = np.abs(_bond_lengths(conformer.positions, conformer.bonds) - ideal_lengths)
    assert deviation.max() < 0.1, (code, heavy.atom_names[heavy.bonds[deviation.argmax()]])
    # Stereo centres keep the CCD's hand: L-alanine's CA, NAG's ring, ATP's ribose (and PA, PB,
    # formally stereogenic with one P=O written), FMN's ribityl chain.
    centres = _stereo_centres(component)
    assert len(centres) == {"ALA": 1, "NAG": 5, "ATP": 6, "7L7": 0, "FMN": 3, "ORO": 0}[code]
    for atom in centres:
        generated = _chiral_volume(conformer.positions, conformer.bonds, atom)
        assert np.sign(generated) == np.sign(_chiral_volume(heavy.ideal_pos, heavy.bonds, atom)), heavy.atom_names[atom]


def test_same_seed_same_conformer_other_seed_other_conformer(ccd):
    nag = ccd.component("NAG")
    first, again = component_conformer(nag), component_conformer(nag)
    np.testing.assert_array_equal(first.positions, again.positions)
    other = component_conformer(nag, ConformerSettings(seed=7))
    assert not np.allclose(first.positions, other.positions, atol=1e-3)


def test_ferrocene_ligand_rdkit_cannot_embed_falls_back_to_ccd_ideal(ccd):
    # FEM, N-(2-ferrocenylethyl)maleimide: ETKDG fails on the iron sandwich.
    component = ccd.component("FEM")
    conformer = component_conformer(component)
    heavy = component.heavy_atoms()
    assert conformer.source == "ccd_ideal" and conformer.sanitization == "full"
    assert conformer.fallback == "embedding_failed"
    np.testing.assert_array_equal(conformer.positions, heavy.ideal_pos)
    assert conformer.mask.all()


def _metal_bond_lengths(conformer):
    """Lengths of the bonds that have a metal (an element in METALS, or Ir) at one end."""
    metal = np.isin(conformer.elements, sorted(METALS | {IRIDIUM}))
    bonds = conformer.bonds[metal[conformer.bonds].any(axis=1)]
    return _bond_lengths(conformer.positions, bonds)


def test_iridium_hexammine_takes_the_ccd_coordinates_when_rdkit_distorts_its_bonds(ccd):
    # IRI (in PDB 4gxy): ETKDG + MMFF give Ir-N bonds of 1.44-2.70 A; the CCD's model coordinates
    # (IRI has no ideal ones) have all six at 2.24-2.27 A.
    component = ccd.component("IRI")
    heavy = component.heavy_atoms()
    assert heavy.ideal_missing.all() and not heavy.model_missing.any()
    unchecked = component_conformer(component, ConformerSettings(max_bond_deviation=float("inf")))
    assert unchecked.source == "rdkit" and unchecked.fallback is None
    model_lengths = _metal_bond_lengths(dataclasses.replace(unchecked, positions=heavy.model_pos))
    assert len(model_lengths) == 6 and np.all(np.abs(model_lengths - 2.255) < 0.02)
    assert np.abs(_metal_bond_lengths(unchecked) - model_lengths).max() > 0.5
    conformer = component_conformer(component)
    assert conformer.source == "ccd_model" and conformer.fallback == "bond_lengths" and conformer.mask.all()
    np.testing.assert_array_equal(conformer.positions, heavy.model_pos)


@pytest.mark.parametrize(
    "code, source",
    [
        ("HEM", "ccd_ideal"),  # heme b: Fe-N
        ("FES", "ccd_ideal"),  # [2Fe-2S] cluster: Fe-S 2.59 A in RDKit's conformer, 2.20 in the CCD's
        ("SF4", "ccd_ideal"),  # [4Fe-4S] cluster
        ("B12", "ccd_ideal"),  # cobalamin: Co-N
        ("ZNH", "ccd_model"),  # zinc protoporphyrin, no ideal coordinates
        ("NCO", "rdkit"),  # cobalt hexammine: RDKit's Co-N within 0.11 A of the CCD's, kept
    ],
)
def test_metal_complexes_keep_the_ccd_bond_lengths(ccd, code, source):
    component = ccd.component(code)
    heavy = component.heavy_atoms()
    settings = ConformerSettings()
    conformer = component_conformer(component, settings)
    assert conformer.source == source and conformer.mask.all()
    assert conformer.fallback == (None if source == "rdkit" else "bond_lengths")
    reference = heavy.ideal_pos if not heavy.ideal_missing.any() else heavy.model_pos
    assert bond_length_deviation(conformer.positions, reference, conformer.bonds) <= settings.max_bond_deviation
    # RDKit's own conformer is what the check turned away (or kept).
    unchecked = component_conformer(component, ConformerSettings(max_bond_deviation=float("inf")))
    deviation = bond_length_deviation(unchecked.positions, reference, unchecked.bonds)
    assert (deviation > settings.max_bond_deviation) == (source != "rdkit"), deviation


def test_a_tighter_bond_check_turns_away_more_conformers(ccd):
    # NCO's RDKit Co-N bonds are 0.05-0.11 A off the CCD's ideal ones.
    nco = ccd.component("NCO")
    assert component_conformer(nco, ConformerSettings(max_bond_deviation=0.05)).fallback == "bond_lengths"
    assert component_conformer(nco, ConformerSettings(max_bond_deviation=0.2)).fallback is None


def test_component_without_ideal_coordinates_falls_back_to_model_coordinates(ccd):
    # CUZ, the tetranuclear copper sulfide of nitrous oxide reductase: no ideal coordinates.
    component = ccd.component("CUZ")
    conformer = component_conformer(component)
    assert conformer.source == "ccd_model" and conformer.mask.all()
    np.testing.assert_array_equal(conformer.positions, component.heavy_atoms().model_pos)
    # AF3 uses model coordinates only for entries changed before its training cutoff.
    assert component.modified_date == "2011-06-04"
    later = component_conformer(component, ConformerSettings(model_coordinates_before="2012-01-01"))
    assert later.source == "ccd_model"
    earlier = component_conformer(component, ConformerSettings(model_coordinates_before="2011-01-01"))
    assert earlier.source == "none" and not earlier.mask.any() and not earlier.positions.any()
    assert conformer.fallback == later.fallback == earlier.fallback == "embedding_failed"


def test_partial_model_coordinates_are_masked_not_dropped(ccd):
    # 3UQ (a ruthenium sandwich complex): no ideal coordinates, model coordinates for some atoms.
    component = ccd.component("3UQ")
    heavy = component.heavy_atoms()
    conformer = component_conformer(component)
    assert conformer.source == "ccd_model" and conformer.num_atoms == heavy.num_atoms
    np.testing.assert_array_equal(conformer.mask, ~heavy.model_missing)
    assert 0 < conformer.mask.sum() < conformer.num_atoms
    assert not conformer.positions[~conformer.mask].any()


def test_unsanitizable_component_takes_ccd_coordinates_as_af3(ccd):
    # ICS, the FeMo cofactor: its valences fail RDKit's check, as in AF3 the CCD's ideal
    # coordinates are used.
    conformer = component_conformer(ccd.component("ICS"))
    assert conformer.sanitization == "no_valence_check" and conformer.source == "ccd_ideal"
    assert conformer.fallback == "not_sanitized"


def test_ion_and_empty_component(ccd):
    zinc = component_conformer(ccd.component("ZN"))
    assert zinc.source == "rdkit" and zinc.num_atoms == 1 and zinc.mask.all() and zinc.fallback is None
    unknown_ligand = component_conformer(ccd.component("UNL"))  # the CCD lists no atoms
    assert unknown_ligand.source == "none" and unknown_ligand.num_atoms == 0 and unknown_ligand.fallback is None


def test_every_sample_component_gets_a_conformer(ccd, shared_data):
    codes = set()
    for name in [
        "bonded/1igy.cif",
        "bonded/1ncb.cif",
        "bonded/5h73.cif",
        "structures/2q2k.cif",
        "structures/209d-assembly1.cif",
        "structures/721p-assembly1.cif",
    ]:
        codes.update(gemmi.cif.read(str(shared_data / name)).sole_block().find_values("_chem_comp.id"))
    sources = {}
    for code in sorted(codes):
        component = ccd.component(code)
        conformer = component_conformer(component)
        assert conformer.atom_names.tolist() == component.heavy_atoms().atom_names.tolist(), code
        assert np.isfinite(conformer.positions).all() and conformer.source in SOURCES
        assert conformer.fallback is None or conformer.fallback in FALLBACK_REASONS
        if conformer.source == "rdkit" and not METALS.intersection(conformer.elements.tolist()):
            deviation = np.abs(
                _bond_lengths(conformer.positions, conformer.bonds)
                - _bond_lengths(component.heavy_atoms().ideal_pos, conformer.bonds)
            )
            assert deviation.size == 0 or deviation.max() < 0.15, code
        sources[code] = conformer.source
    assert set(sources.values()) == {"rdkit"}, sources


def test_conformer_needs_the_complete_entry(ccd):
    with pytest.raises(ValueError, match="ALA: a conformer needs the complete entry"):
        component_conformer(ccd.component("ALA").heavy_atoms())


def test_without_drops_atoms_and_their_bonds(ccd):
    alanine = component_conformer(ccd.component("ALA"))
    linked = alanine.without({"OXT"})
    assert linked.atom_names.tolist() == ["N", "CA", "C", "O", "CB"]
    assert len(linked.bonds) == 4
    np.testing.assert_array_equal(linked.positions, alanine.positions[:5])


def test_settings_are_checked():
    with pytest.raises(ValueError, match="'uff'"):
        ConformerSettings(force_field="uff")
    with pytest.raises(ValueError, match="timeout_s"):
        ConformerSettings(timeout_s=-1)
    for deviation in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="max_bond_deviation must be > 0"):
            ConformerSettings(max_bond_deviation=deviation)


def test_smiles_conformer_names_atoms_as_af3():
    conformer = smiles_conformer("OC(=O)c1ccccc1OC(C)=O")  # aspirin, another spelling
    assert conformer.name == ASPIRIN == canonical_smiles(ASPIRIN)
    assert conformer.kind == "smiles" and conformer.source == "rdkit" and conformer.mask.all()
    assert conformer.atom_names.tolist() == [
        "C1",
        "C2",
        "O1",
        "O2",
        "C3",
        "C4",
        "C5",
        "C6",
        "C7",
        "C8",
        "C9",
        "O3",
        "O4",
    ]
    assert conformer.elements.tolist() == [6, 6, 8, 8, 6, 6, 6, 6, 6, 6, 6, 8, 8]
    assert len(conformer.bonds) == 13 and sorted(set(conformer.bond_orders.tolist())) == [1, 2]
    lengths = _bond_lengths(conformer.positions, conformer.bonds)
    double = conformer.bond_orders == 2
    assert np.all((lengths > 1.15) & (lengths < 1.55))
    assert lengths[double].mean() < lengths[~double].mean()
    same = smiles_conformer(ASPIRIN)
    np.testing.assert_array_equal(same.positions, conformer.positions)


def test_charged_smiles_keeps_charges():
    conformer = smiles_conformer("C[N+](C)(C)C.[Cl-]")
    assert sorted(conformer.charges.tolist()) == [-1, 0, 0, 0, 0, 1]
    assert "CL1" in conformer.atom_names.tolist()


@pytest.mark.parametrize("smiles, reason", [("C1CC", "syntax"), ("C(C)(C)(C)(C)C", "valence"), ("", "syntax")])
def test_unparsable_smiles_is_named(smiles, reason):
    with pytest.raises(SmilesError, match=f"cannot parse SMILES {re.escape(repr(smiles))}.*{reason}"):
        smiles_conformer(smiles)
