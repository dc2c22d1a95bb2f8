"""Legacy PDB-format inputs: read through gemmi into the same Structure as the mmCIF file."""

import gzip

import numpy as np
import pytest

from featurecache.io.common import ParseError
from featurecache.io.inputs import discover_inputs, is_input_file, target_id_for
from featurecache.io.mmcif import parse_mmcif, read_mmcif
from featurecache.io.pdb import looks_like_pdb
from tests.io.structure_edits import as_pdb, rna_with_5prime_gtp


def _residues(chain):
    return [(r.name, r.is_resolved) for r in chain.residues]


def test_pdb_with_seqres_reads_as_its_mmcif(shared_data, tmp_path):
    """2q2k written as PDB by gemmi: same sequences, the same unresolved residues (from SEQRES),
    the same coordinates; chains named by their PDB chain."""
    reference = read_mmcif(shared_data / "structures" / "2q2k.cif")
    path = tmp_path / "2q2k.pdb"
    path.write_text(as_pdb((shared_data / "structures" / "2q2k.cif").read_text()))
    structure = read_mmcif(path)
    assert structure.id == "2q2k" and structure.warnings == ()
    assert structure.resolution == pytest.approx(3.0) and structure.method == "X-RAY DIFFRACTION"
    by_auth = {(c.auth_chain_id, c.molecule_type): c for c in reference.chains}
    assert sorted(c.chain_id for c in structure.chains) == ["A", "A:EPE3022", "B", "F"]
    for chain in structure.chains:
        expected = by_auth[(chain.auth_chain_id, chain.molecule_type)]
        assert chain.sequence == expected.sequence
        assert _residues(chain) == _residues(expected)
        for ours, theirs in zip(chain.residues, expected.residues):
            assert ours.atom_names == theirs.atom_names
            np.testing.assert_allclose(ours.positions, theirs.positions, atol=1e-3)


def test_pdb_with_a_5prime_gtp_in_seqres(shared_data):
    structure = parse_mmcif(as_pdb(rna_with_5prime_gtp(shared_data)), "gtp.pdb")
    assert [c.chain_id for c in structure.chains] == ["A", "B", "C"]
    strand = structure.chain("A")
    assert strand.molecule_type == "rna" and strand.sequence == "GAAGCUUC"
    assert strand.residues[0].name == "GTP" and strand.residues[0].is_resolved


def test_pdb_without_seqres_warns_per_chain(shared_data):
    text = as_pdb((shared_data / "structures" / "2q2k.cif").read_text(), seqres=False)
    structure = parse_mmcif(text, "noseqres.pdb")
    protein = structure.chain("A")
    assert len(protein.residues) == 45 and all(r.is_resolved for r in protein.residues)
    assert any("chain A" in w and "no SEQRES" in w for w in structure.warnings)


def test_pdb_records_read_whatever_the_file_is_named():
    """HEADER, REVDAT and CA-only ATOM records in a file named .cif (the case that used to read
    'invalid mmCIF')."""
    atoms = "".join(
        f"ATOM  {i + 1:5d}  CA  ALA A{i + 1:4d}    {i * 3.8:8.3f}{0.0:8.3f}{0.0:8.3f}  1.00  0.00           C\n"
        for i in range(20)
    )
    text = (
        "HEADER    TEST\nREVDAT   2   24-FEB-09 1ABC    1       VERSN\nREVDAT   1   05-JUN-95 1ABC    0\n"
        "REMARK   2 RESOLUTION.    2.10 ANGSTROMS.\n" + atoms + "END\n"
    )
    structure = parse_mmcif(text, "pdb_format.cif")
    (chain,) = structure.chains
    assert chain.sequence == "A" * 20 and chain.molecule_type == "protein"
    assert structure.release_date == "1995-06-05" and structure.resolution == pytest.approx(2.1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("HEADER    NOTHING\nEND\n", r"empty\.pdb: PDB format without ATOM / HETATM records"),
        ("ATOM  garbage\n", r"empty\.pdb:1: invalid PDB format"),
    ],
)
def test_broken_pdb_is_one_line_naming_the_file(text, message):
    with pytest.raises(ParseError, match=message) as caught:
        parse_mmcif(text, "empty.pdb")
    assert "\n" not in str(caught.value)


def test_detection_by_content():
    assert looks_like_pdb("\nCRYST1   10.000\n") and looks_like_pdb("ATOM      1  N   ALA A   1")
    assert not looks_like_pdb("data_1ABC\n_entry.id 1ABC\n") and not looks_like_pdb(">a\nMK\n")
    assert not looks_like_pdb("")


def test_pdb_and_ent_files_are_inputs(shared_data, tmp_path):
    text = as_pdb((shared_data / "structures" / "2q2k.cif").read_text())
    (tmp_path / "2q2k.pdb").write_text(text)
    (tmp_path / "pdb1abc.ent.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "notes.txt").write_text("not an input")
    found = discover_inputs([tmp_path])
    assert [p.name for p in found] == ["2q2k.pdb", "pdb1abc.ent.gz"]
    assert [target_id_for(p) for p in found] == ["2q2k", "pdb1abc"]
    assert is_input_file(tmp_path / "X.PDB.GZ")
    assert (
        read_mmcif(tmp_path / "pdb1abc.ent.gz").chain("A").sequence
        == read_mmcif(tmp_path / "2q2k.pdb").chain("A").sequence
    )


def test_blank_chain_ids_and_models_as_modelling_tools_write_them(shared_data):
    """2q2k's protein chain written without a chain id, twice (MODEL 1 / MODEL 2), as MD and
    modelling tools do: one chain named A (with a warning), first model only."""
    reference = read_mmcif(shared_data / "structures" / "2q2k.cif").chain("B")
    lines = [
        line
        for line in as_pdb((shared_data / "structures" / "2q2k.cif").read_text(), seqres=False).splitlines()
        if line.startswith("ATOM") and line[21] == "A"
    ]
    blank = [line[:21] + " " + line[22:] for line in lines]
    moved = [line[:30] + f"{float(line[30:38]) + 50:8.3f}" + line[38:] for line in blank]
    text = "MODEL        1\n" + "\n".join(blank) + "\nENDMDL\nMODEL        2\n" + "\n".join(moved) + "\nENDMDL\nEND\n"
    structure = parse_mmcif(text, "md-frame.pdb")
    (chain,) = structure.chains
    assert chain.chain_id == "A" and chain.sequence == "".join(
        letter for letter, residue in zip(reference.sequence, reference.residues) if residue.is_resolved
    )
    assert "chain A: no chain id in the PDB file; named A" in structure.warnings
    np.testing.assert_allclose(
        chain.residues[0].positions, [r for r in reference.residues if r.is_resolved][0].positions, atol=1e-3
    )


def test_byte_order_mark_is_not_content(shared_data):
    text = (shared_data / "structures" / "2q2k.cif").read_text()
    assert [c.sequence for c in parse_mmcif("\ufeff" + text, "bom.cif").chains] == [
        c.sequence for c in parse_mmcif(text, "plain.cif").chains
    ]
    pdb = as_pdb(text)
    assert [c.sequence for c in parse_mmcif(("\ufeff" + pdb).encode("utf-8"), "bom.pdb").chains] == [
        c.sequence for c in parse_mmcif(pdb, "plain.pdb").chains
    ]
