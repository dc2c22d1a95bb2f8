"""Which modelled residues belong to a polymer: a residue the sequence lists at its position is
held once, as a polymer residue, whatever its chemistry; only what the sequence does not list
is a ligand. Every case is a real sample structure, some edited minimally (structure_edits)."""

import numpy as np
import pytest

from featurecache.io.mmcif import parse_mmcif, read_mmcif
from tests.io.structure_edits import (
    as_separate_entity,
    rna_with_5prime_gtp,
    with_chem_comp_type,
    with_residue_renamed,
    with_sequence_extended,
    without_label_seq_id,
)


def _held_once(structure):
    """Every modelled atom position appears in exactly one residue of the structure."""
    positions = np.concatenate([r.positions for c in structure.chains for r in c.residues if r.is_resolved])
    assert len(np.unique(positions, axis=0)) == len(positions)


def _residue_count(structure, name):
    return sum(r.name == name for c in structure.chains for r in c.residues)


def test_rna_5prime_gtp_is_the_first_nucleotide(shared_data):
    structure = parse_mmcif(rna_with_5prime_gtp(shared_data), "gtp-rna.cif")
    assert [c.chain_id for c in structure.chains] == ["A", "B", "C"]  # no "A:GTP1" ligand chain
    strand = structure.chain("A")
    gtp = strand.residues[0]
    assert strand.molecule_type == "rna" and gtp.name == "GTP" and gtp.seq_id == 1
    assert gtp.parent == "G" and strand.sequence == "GAAGCUUC"  # the CCD names G as GTP's parent
    assert gtp.is_resolved and "C1'" in gtp.atom_names
    assert _residue_count(structure, "GTP") == 1
    _held_once(structure)


def test_5prime_gtp_without_label_seq_id_is_found_by_author_number(shared_data):
    text = without_label_seq_id(rna_with_5prime_gtp(shared_data), "A", 1)
    structure = parse_mmcif(text, "gtp-no-label-seq.cif")
    assert [c.chain_id for c in structure.chains] == ["A", "B", "C"]
    assert structure.chain("A").residues[0].name == "GTP" and structure.chain("A").residues[0].is_resolved
    _held_once(structure)


def test_5prime_gtp_deposited_as_its_own_entity_joins_its_polymer(shared_data):
    """The sequence lists GTP at position 1 (author number 1) but its atoms sit in a non-polymer
    asym of the same author chain: held once, in the polymer."""
    text = as_separate_entity(rna_with_5prime_gtp(shared_data), "A", 1, "Z")
    structure = parse_mmcif(text, "gtp-own-entity.cif")
    assert [c.chain_id for c in structure.chains] == ["A", "B", "C"]
    assert structure.chain("A").residues[0].name == "GTP" and structure.chain("A").residues[0].is_resolved
    _held_once(structure)


def test_peptide_caps_at_both_ends(shared_data):
    """7a4d's peptides: N-terminal ACE (the assembly file's sequence writes UNK there) and a
    C-terminal NH2 once the sequence lists it, as the PDB entry's own sequence does."""
    path = shared_data / "structures" / "7a4d-assembly1.cif"
    plain = read_mmcif(path)
    assert plain.chain("E").residues[0].name == "ACE" and plain.chain("E").residues[0].is_resolved
    assert "E:ACE1" not in [c.chain_id for c in plain.chains]
    # Not in the assembly file's sequence: NH2 after the last residue is a ligand, held once.
    assert plain.chain("E:NH242").residues[0].name == "NH2"
    capped = parse_mmcif(with_sequence_extended(path, "E", "NH2", 42), "capped.cif")
    peptide = capped.chain("E")
    assert (peptide.residues[0].name, peptide.residues[-1].name) == ("ACE", "NH2")
    assert peptide.residues[-1].is_resolved and len(peptide.residues) == 42
    assert "E:NH242" not in [c.chain_id for c in capped.chains]
    _held_once(plain)
    _held_once(capped)


def test_inner_non_polymer_component_and_modified_nucleotides(shared_data):
    structure = read_mmcif(shared_data / "structures" / "209d-assembly1.cif")
    assert structure.chain("C").residues[5].name == "PXA" and _residue_count(structure, "PXA") == 1
    # 2q2k's 5-iodouracils stay DNA residues even where a processed file calls them non-polymers.
    text = with_chem_comp_type(shared_data / "structures" / "2q2k.cif", "5IU", "non-polymer")
    dna = parse_mmcif(text, "5iu.cif").chain("A")
    assert [r.name for r in dna.residues].count("5IU") == 2
    assert all(r.is_resolved for r in dna.residues if r.name == "5IU")


def test_ligand_after_the_last_residue_stays_a_ligand(shared_data):
    """721p's assembly file numbers MG and GNP 167 and 168 in the protein chain: not in its
    166-residue sequence, so ligands."""
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    assert len(structure.chain("A").residues) == 166
    assert structure.chain("A:GNP168").molecule_type == "ligand"
    _held_once(structure)


@pytest.mark.parametrize("name", ["209d-assembly1.cif", "721p-assembly1.cif", "7a4d-assembly1.cif", "2q2k.cif"])
def test_every_sample_holds_each_atom_once(shared_data, name):
    _held_once(read_mmcif(shared_data / "structures" / name))


@pytest.mark.parametrize("where", ["first", "inside", "last"])
@pytest.mark.parametrize(
    ("sample", "asym", "comp"),
    [("721p", "A", "SEP"), ("2q2k", "A", "5CM"), ("gtp-rna", "B", "PSU")],
    ids=["protein", "dna", "rna"],
)
def test_modified_residue_typed_non_polymer_anywhere_in_a_chain(shared_data, sample, asym, comp, where):
    """A modified residue that a processed file types 'non-polymer' (phosphoserine, 5-methyl-dC,
    pseudouridine) at the first, a middle or the last position of a protein, DNA and RNA chain:
    the polymer's residue, held once, with its atoms."""
    if sample == "gtp-rna":
        text = rna_with_5prime_gtp(shared_data)
    else:
        text = (shared_data / "structures" / {"721p": "721p-assembly1.cif", "2q2k": "2q2k.cif"}[sample]).read_text()
    original = parse_mmcif(text, "original.cif")
    chain = original.chain(asym)
    resolved = [i for i, r in enumerate(chain.residues) if r.is_resolved]
    index = {"first": resolved[0], "inside": resolved[len(resolved) // 2], "last": resolved[-1]}[where]
    seq_id = chain.residues[index].seq_id
    edited = parse_mmcif(with_residue_renamed(text, asym, seq_id, comp, "non-polymer"), "edited.cif")
    assert [c.chain_id for c in edited.chains] == [c.chain_id for c in original.chains]
    residue = edited.chain(asym).residues[index]
    assert residue.name == comp and residue.atom_names == chain.residues[index].atom_names
    assert len(edited.chain(asym).residues) == len(chain.residues)
    _held_once(edited)
