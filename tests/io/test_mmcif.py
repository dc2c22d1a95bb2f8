import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from featurecache.io.common import ParseError
from featurecache.io.mmcif import parse_mmcif, read_mmcif, target_id_from_path
from featurecache.io.structure import structure_from_sequences

STRUCTURES = [
    "209d-assembly1.cif",
    "721p-assembly1.cif",
    "7a4d-assembly1.cif",
    "2q2k.cif",
    "AF-P01112-F1-model_v4.cif.gz",
]
TEMPLATES = ["1psm", "2crb", "3u8v", "3zee", "4i6p", "4zey", "5kc1"]


def _chains(structure):
    return {chain.chain_id: chain for chain in structure.chains}


@pytest.mark.parametrize("name", STRUCTURES)
def test_every_structure_parses(shared_data, name):
    structure = read_mmcif(shared_data / "structures" / name)
    assert structure.id == target_id_from_path(name)
    assert structure.chains
    for chain in structure.chains:
        assert chain.molecule_type in ("protein", "dna", "rna", "ligand")
        for residue in chain.residues:
            assert residue.positions.shape == (len(residue.atom_names), 3)
            assert np.isfinite(residue.positions).all()
            # Hydrogens are dropped.
            assert not np.any(residue.elements == 1)
        assert all(residue.name not in ("HOH", "DOD") for residue in chain.residues)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_parses(shared_data, name):
    structure = read_mmcif(shared_data / "templates" / "mmcif" / f"{name}.cif")
    assert any(chain.molecule_type == "protein" for chain in structure.chains)
    assert structure.release_date is not None


def test_209d_dna_and_peptide_whose_sequence_holds_a_non_polymer_component(shared_data):
    structure = read_mmcif(shared_data / "structures" / "209d-assembly1.cif")
    chains = _chains(structure)
    assert [chain.molecule_type for chain in structure.chains] == ["dna", "dna", "protein"]
    assert chains["A"].sequence == "GAAGCTTC"
    # PXA (a 'non-polymer' component) sits at position 6, where the sequence table says UNK:
    # it is that residue, with its 22 atoms, held once (no ligand chain besides).
    assert len(chains["C"].residues) == 11
    pxa = chains["C"].residues[5]
    assert pxa.name == "PXA" and len(pxa.atom_names) == 22 and pxa.seq_id == 6
    assert chains["C"].sequence == "TVPGVXTVPGV"
    assert chains["C"].residues[1].name == "DVA" and chains["C"].residues[1].parent == "VAL"
    assert structure.resolution == pytest.approx(3.0)
    assert structure.release_date == "1995-10-15"


def test_721p_ligands_and_metadata(shared_data):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    assert [c.chain_id for c in structure.chains] == ["A", "A:MG167", "A:GNP168", "B", "B:MG167", "B:GNP168"]
    magnesium = _chains(structure)["A:MG167"].residues[0]
    # The file writes type_symbol 'M'; the atom name gives magnesium.
    assert magnesium.elements.tolist() == [12]
    assert len(_chains(structure)["A:GNP168"].residues[0].atom_names) == 32
    assert _chains(structure)["A"].sequence[60] == "L"  # Q61L mutant
    assert structure.method == "X-RAY DIFFRACTION"
    assert structure.resolution == pytest.approx(2.0)


def test_2q2k_unresolved_residues_and_modified_nucleotides(shared_data):
    structure = read_mmcif(shared_data / "structures" / "2q2k.cif")
    chains = _chains(structure)
    protein = chains["B"]
    assert protein.auth_chain_id == "A"
    assert len(protein.residues) == 70
    assert sum(residue.is_resolved for residue in protein.residues) == 45
    dna = chains["A"]
    modified = [residue for residue in dna.residues if residue.name == "5IU"]
    assert len(modified) == 2 and all(residue.parent == "DU" for residue in modified)
    assert 53 in modified[0].elements  # iodine
    assert chains["D"].molecule_type == "ligand" and chains["D"].residues[0].name == "EPE"


def test_alphafold_model_has_no_resolution_and_plddt_in_b_factors(shared_data):
    structure = read_mmcif(shared_data / "structures" / "AF-P01112-F1-model_v4.cif.gz")
    assert structure.resolution is None
    assert structure.release_date == "2021-07-01"
    (chain,) = structure.chains
    assert len(chain.residues) == 189 and chain.sequence.startswith("MTEYKLVVVGAGGVGKSAL")
    plddt = np.concatenate([residue.b_factors for residue in chain.residues])
    assert 0 < plddt.min() and plddt.max() <= 100


def test_selenomethionine_becomes_methionine(shared_data):
    structure = read_mmcif(shared_data / "templates" / "mmcif" / "4zey.cif")
    protein = structure.chains[0]
    residue = protein.residues[1]
    assert residue.name == "MET" and "SD" in residue.atom_names and "SE" not in residue.atom_names
    assert 34 not in residue.elements and 16 in residue.elements
    assert protein.sequence.startswith("GMEG")


def test_nmr_first_model_only(shared_data):
    structure = read_mmcif(shared_data / "templates" / "mmcif" / "1psm.cif")
    text = (shared_data / "templates" / "mmcif" / "1psm.cif").read_text()
    first_model_heavy = sum(
        1
        for line in text.splitlines()
        if line.startswith("ATOM") and line.split()[-1] == "1" and line.split()[2] != "H"
    )
    assert sum(len(r.atom_names) for r in structure.chains[0].residues) == first_model_heavy
    assert structure.method == "SOLUTION NMR"


def test_gzipped_and_plain_parse_the_same(shared_data, tmp_path):
    plain = shared_data / "structures" / "2q2k.cif"
    packed = tmp_path / "2q2k.cif.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    first, second = read_mmcif(plain), read_mmcif(packed)
    assert [c.sequence for c in first.chains] == [c.sequence for c in second.chains]
    for a, b in zip(first.chains, second.chains):
        for ra, rb in zip(a.residues, b.residues):
            np.testing.assert_array_equal(ra.positions, rb.positions)


_ALTLOC_CIF = """data_TEST
_exptl.method 'X-RAY DIFFRACTION'
loop_
_atom_site.group_PDB
_atom_site.type_symbol
_atom_site.label_atom_id
_atom_site.label_alt_id
_atom_site.label_comp_id
_atom_site.label_asym_id
_atom_site.label_entity_id
_atom_site.label_seq_id
_atom_site.Cartn_x
_atom_site.Cartn_y
_atom_site.Cartn_z
_atom_site.occupancy
_atom_site.auth_seq_id
_atom_site.pdbx_PDB_model_num
ATOM C CA . GLY A 1 1 0.0 0.0 0.0 1.0 1 1
ATOM H H  . GLY A 1 1 0.5 0.0 0.0 1.0 1 1
ATOM C CA A SER A 1 2 1.0 0.0 0.0 {occ_a} 2 1
ATOM C CA B SER A 1 2 2.0 0.0 0.0 {occ_b} 2 1
ATOM O OG A SER A 1 2 1.5 0.0 0.0 {occ_a} 2 1
ATOM O OG B SER A 1 2 2.5 0.0 0.0 {occ_b} 2 1
HETATM O O . HOH W 2 . 9.0 9.0 9.0 1.0 3 1
ATOM C CA . GLY A 1 1 7.0 7.0 7.0 1.0 1 2
"""


@pytest.mark.parametrize(("occ_a", "occ_b", "expected_x"), [(0.4, 0.6, 2.0), (0.7, 0.3, 1.0), (0.5, 0.5, 1.0)])
def test_alternate_locations_keep_highest_occupancy_first_on_ties(occ_a, occ_b, expected_x):
    structure = parse_mmcif(_ALTLOC_CIF.format(occ_a=occ_a, occ_b=occ_b), "altloc.cif")
    (chain,) = structure.chains  # water dropped, model 2 ignored
    glycine, serine = chain.residues
    assert glycine.atom_names == ("CA",)  # hydrogen dropped
    assert glycine.positions[0].tolist() == [0.0, 0.0, 0.0]
    assert serine.atom_names == ("CA", "OG")
    assert serine.positions[0, 0] == pytest.approx(expected_x)
    assert chain.sequence == "GS"


def test_truncated_file_is_a_parse_error_naming_file_and_line(shared_data):
    text = (shared_data / "structures" / "2q2k.cif").read_text()
    cut = text.index("ATOM   100 ") + 20
    with pytest.raises(ParseError, match=r"broken\.cif:\d+: invalid mmCIF: .*\(file cut short\?\)"):
        parse_mmcif(text[:cut], "broken.cif")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no data block"),
        (b"\x1f\x8b\x00\x00binary\x00data", "binary content"),
        (b"\xff\xfe\xfa not utf8", "not UTF-8"),
        (b">query\nACDE\n", "expected block header"),
        (b"data_x\n_cell.length_a 10\n", "no _atom_site records"),
    ],
)
def test_broken_inputs_raise_parse_error(data, message):
    with pytest.raises(ParseError, match=message):
        parse_mmcif(data, "input.cif")


def test_corrupt_gzip_is_a_parse_error(tmp_path):
    path = tmp_path / "bad.cif.gz"
    path.write_bytes(gzip.compress(b"data_x\n")[:12])
    with pytest.raises(ParseError, match="bad.cif.gz"):
        read_mmcif(path)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(lambda text: "data_x\nloop_\n_atom_site.id\n" + text))
def test_garbage_only_raises_parse_error(data):
    try:
        parse_mmcif(data, "fuzz.cif")
    except ParseError as error:
        assert "fuzz.cif" in str(error)


def test_structure_from_sequences_is_unresolved():
    structure = structure_from_sequences("t", [("A", "protein", "MKX"), ("B", "dna", "ACGT")])
    protein, dna = structure.chains
    assert protein.sequence == "MKX" and dna.sequence == "ACGT"
    assert [residue.name for residue in protein.residues] == ["MET", "LYS", "UNK"]
    assert not any(residue.is_resolved for residue in protein.residues + dna.residues)
    with pytest.raises(ValueError, match="molecule type"):
        structure_from_sequences("t", [("A", "ligand", "X")])


_MUTATIONS = [
    "?",
    ".",
    "A",
    "1",
    "-1",
    "x",
    "'a b'",
    "nan",
    "inf",
    "1e999",
    "HOH",
    "MSE",
    "DA",
    "ATOM",
    "loop_",
    "data_y",
]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40), st.sampled_from(_MUTATIONS)), min_size=1, max_size=12)
)
def test_mutated_real_file_only_raises_parse_error(shared_data, edits):
    """Random token substitutions in a real file: parsed, or a ParseError naming the file."""
    lines = (shared_data / "structures" / "209d-assembly1.cif").read_text().splitlines()
    for line_choice, field_choice, token in edits:
        index = line_choice % len(lines)
        fields = lines[index].split()
        if fields:
            fields[field_choice % len(fields)] = token
            lines[index] = " ".join(fields)
    try:
        structure = parse_mmcif("\n".join(lines), "mutated.cif")
    except ParseError as error:
        assert "mutated.cif" in str(error)
        return
    for chain in structure.chains:
        for residue in chain.residues:
            assert np.isfinite(residue.positions).all()


def test_entity_poly_seq_is_the_fallback_sequence_table(shared_data):
    """Without _pdbx_poly_seq_scheme the full sequence comes from _entity_poly_seq."""
    text = (shared_data / "structures" / "2q2k.cif").read_text()
    start = text.index("loop_\n_pdbx_poly_seq_scheme.")
    end = text.index("#", start)
    structure = parse_mmcif(text[:start] + text[end:], "no-scheme.cif")
    reference = read_mmcif(shared_data / "structures" / "2q2k.cif")
    assert [c.sequence for c in structure.chains] == [c.sequence for c in reference.chains]
    protein = _chains(structure)["B"]
    assert len(protein.residues) == 70 and sum(r.is_resolved for r in protein.residues) == 45


@pytest.mark.parametrize(
    "name", ["structures/2q2k.cif", "structures/7a4d-assembly1.cif", "bonded/1igy.cif", "templates/mmcif/3zee.cif"]
)
def test_mmcif_cut_at_a_line_boundary_is_refused_naming_the_file(shared_data, name):
    """A real wwPDB file cut between two _atom_site rows (gemmi alone reads the rest as a whole
    model), and cut just before its final '#': refused, naming the file."""
    lines = (shared_data / name).read_text().splitlines(keepends=True)
    atoms = [number for number, line in enumerate(lines) if line.startswith(("ATOM", "HETATM"))]
    for keep in (atoms[len(atoms) // 2], len(lines) - 1):
        with pytest.raises(
            ParseError, match=r"^cut\.cif:\d+: ends inside _\w+ without the '#' .*\(file cut short\?\)$"
        ):
            parse_mmcif("".join(lines[:keep]), "cut.cif")


def test_every_sample_mmcif_still_parses(shared_data):
    for path in sorted(shared_data.rglob("*.cif*")):
        assert read_mmcif(path).chains, path
