"""FASTA inputs become sequence-only structures: letters checked against the chain's alphabet,
ambiguity codes counted in warnings, anything else rejected naming file, record and position."""

import pytest

from featurecache.io.common import ParseError
from featurecache.io.inputs import structure_from_fasta
from featurecache.io.mmcif import read_mmcif
from featurecache.io.residues import read_sequence


@pytest.fixture(scope="module")
def real(shared_data):
    """Real chain sequences: H-Ras (721p), the 2q2k DNA strand, and that strand as RNA."""
    ras = read_mmcif(shared_data / "structures" / "721p-assembly1.cif").chain("A").sequence
    dna = read_mmcif(shared_data / "structures" / "2q2k.cif").chain("A").sequence.replace("N", "T")
    return {"protein": ras, "dna": dna, "rna": dna.replace("T", "U")}


def _fasta(tmp_path, text, name="target.fasta"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_standard_letters_lower_case_and_unknowns_are_silent(tmp_path, real):
    text = (
        f">ras mol:protein\n{real['protein'][:80].lower()}X\n{real['protein'][80:]}*\n"
        f">dna mol:dna\n{real['dna']}N\n>rna mol:rna\n{real['rna'].lower()}n\n"
    )
    structure = structure_from_fasta(_fasta(tmp_path, text))
    protein, dna, rna = structure.chains
    assert protein.sequence == real["protein"][:80] + "X" + real["protein"][80:]
    assert (dna.molecule_type, dna.sequence) == ("dna", real["dna"] + "N")
    assert (rna.molecule_type, rna.sequence) == ("rna", real["rna"] + "N")
    assert structure.warnings == ()


def test_protein_ambiguity_codes_are_counted_per_chain(tmp_path, real):
    sequence = "B" + real["protein"][:30] + "ZzJ" + real["protein"][30:60] + "UOu"
    text = f">sp|P01112|RASH_HUMAN GTPase HRas\n{sequence}\n>second\n{real['protein']}\n"
    structure = structure_from_fasta(_fasta(tmp_path, text))
    first, second = structure.chains
    assert first.sequence == "X" + real["protein"][:30] + "XXX" + real["protein"][30:60] + "CXC"
    names = [r.name for r in first.residues]
    assert (names[0], names[-3], names[-2]) == ("UNK", "CYS", "UNK")
    (warning,) = structure.warnings  # one per chain with substitutions; `second` has none
    assert warning.startswith("chain A: ")
    for part in (
        "1 B read as X",
        "2 Z read as X",
        "1 J read as X",
        "2 U read as C (selenocysteine",
        "1 O read as X (pyrrolysine)",
    ):
        assert part in warning
    assert second.sequence == real["protein"]


@pytest.mark.parametrize("molecule_type", ["dna", "rna"])
def test_nucleotide_iupac_codes_become_n_with_a_warning(tmp_path, real, molecule_type):
    sequence = real[molecule_type][:5] + "RY" + real[molecule_type][5:] + "k"
    structure = structure_from_fasta(_fasta(tmp_path, f">strand mol:{molecule_type}\n{sequence}\n"))
    (chain,) = structure.chains
    assert chain.sequence == real[molecule_type][:5] + "NN" + real[molecule_type][5:] + "N"
    (warning,) = structure.warnings
    assert (
        warning == "chain A: 1 R read as N (IUPAC ambiguity code), 1 Y read as N (IUPAC ambiguity code), "
        "1 K read as N (IUPAC ambiguity code)"
    )


@pytest.mark.parametrize(
    ("record", "letter", "position"),
    [
        (">ras mol:protein\n{protein}1\n", "1", "167"),
        (">ras mol:protein\n{protein}-\n", "-", "167"),
        (">ras mol:protein\nMK-{protein}\n", "-", "3"),
        (">strand mol:rna\n{rna}T\n", "T", "21"),
        (">strand mol:dna\nACGU{dna}\n", "U", "4"),
    ],
)
def test_letter_outside_the_alphabet_names_file_record_letter_and_position(tmp_path, real, record, letter, position):
    text = f">first mol:protein\n{real['protein']}\n" + record.format(**real)
    with pytest.raises(ParseError) as caught:
        structure_from_fasta(_fasta(tmp_path, text, "bad.fasta"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'bad.fasta'}:")  # and the line: the header's or the letter's
    record_name = record.split()[0][1:]
    assert f"record {record_name!r}" in message and f"invalid character {letter!r} at position {position}" in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (">a\n----\n", "record 'a' is all gaps"),
        (">a\n\n", "record 'a' has no sequence"),
        (">a\nMKT*LV\n", "record 'a' has a stop '\\*' inside its sequence \\(position 4\\)"),
    ],
)
def test_empty_gapped_and_stopped_chains_are_rejected_by_name(tmp_path, text, message):
    with pytest.raises(ParseError, match=rf"empty\.fasta:1: {message}"):
        structure_from_fasta(_fasta(tmp_path, text, "empty.fasta"))


def test_read_sequence_is_strict_about_molecule_types():
    assert read_sequence("acgu", "rna").residues == ("A", "C", "G", "U")
    assert read_sequence("ACGT", "dna").residues == ("DA", "DC", "DG", "DT")
    with pytest.raises(ValueError, match="molecule type 'ligand'"):
        read_sequence("X", "ligand")
