import gzip
import shutil

import numpy as np
import pytest

from featurecache.io.alignments import AlignmentIndex, concatenate_msas, map_query_to_chain
from featurecache.io.fasta import read_fasta
from featurecache.io.mmcif import read_mmcif
from featurecache.io.structure import structure_from_sequences
from featurecache.io.msa import parse_a3m


@pytest.fixture(scope="module")
def index(shared_data):
    return AlignmentIndex(shared_data / "alignments")


def _relative(paths):
    return [path.split("alignments/", 1)[1] for path in paths]


def test_index_covers_every_file(index, shared_data):
    on_disk = [p for p in (shared_data / "alignments").rglob("*") if p.is_file() and not p.name.endswith(".fasta")]
    assert len(index.msa_files) + len(index.hit_files) == len(on_disk)
    assert index.errors == []


def test_721p_homodimer_shares_one_msa(index, shared_data):
    found, warnings = index.for_structure(read_mmcif(shared_data / "structures" / "721p-assembly1.cif"))
    assert warnings == []
    assert set(found) == {"A", "B"}  # ligands get no alignments
    assert found["A"].msa is found["B"].msa
    assert found["A"].msa.depth == 15953
    assert found["A"].mapping.kind == "exact"
    assert _relative(found["A"].hit_files) == ["pdb_templates_m8/721p-assembly1A_protein_pdball_230102_db.m8"]
    assert len(found["A"].hits) == 300


def test_7a4d_similar_paralogs_keep_their_own_msas(index, shared_data):
    found, warnings = index.for_structure(read_mmcif(shared_data / "structures" / "7a4d-assembly1.cif"))
    assert warnings == []
    for chain in "ABCD":
        assert _relative(found[chain].msa_files)[0].startswith(f"pdb/7a4d-assembly1{chain}_protein.a3m")
        assert found[chain].mapping.kind == "exact"
    # E and F carry an ACE cap the MSA query lacks: the query is a contiguous part of the chain.
    assert found["E"].mapping.kind == "contained"
    np.testing.assert_array_equal(found["E"].mapping.chain_positions, np.arange(1, 41))
    # The m8 hits are remapped from query to chain positions (shifted by the cap).
    assert found["E"].hits[0].query_indices[0] == 1


def test_2q2k_openfold_folders_for_both_protein_chains(index, shared_data):
    found, warnings = index.for_structure(read_mmcif(shared_data / "structures" / "2q2k.cif"))
    assert warnings == []
    assert found["A"].msa is None  # the DNA strand has no alignment
    assert found["B"].msa is found["C"].msa
    # uniref90, bfd, mgnify and uniprot files concatenated, in AlphaFold's order.
    assert [path.rsplit("/", 1)[1] for path in found["B"].msa_files] == [
        "uniref90_hits.sto",
        "bfd_uniclust_hits.a3m",
        "mgnify_hits.sto",
        "uniprot_hits.sto",
    ]
    assert found["B"].msa.depth == 16 + 3 + 6 + 20


def test_alphafold_model_finds_the_721p_msa_by_similarity(index, shared_data):
    found, warnings = index.for_structure(read_mmcif(shared_data / "structures" / "AF-P01112-F1-model_v4.cif.gz"))
    assert found["A"].mapping.kind == "similar" and found["A"].mapping.identity > 0.99
    assert _relative(found["A"].msa_files) == ["pdb/721p-assembly1A_protein.a3m"]
    assert any("similarity" in warning for warning in warnings)


def test_209d_peptide_matches_despite_d_amino_acids(index, shared_data):
    found, warnings = index.for_structure(read_mmcif(shared_data / "structures" / "209d-assembly1.cif"))
    assert found["C"].msa is not None and found["C"].mapping.kind == "similar"
    assert found["A"].msa is None and found["B"].msa is None
    assert found["C"].hits == ()
    assert _relative(found["C"].hit_files) == ["pdb_templates_m8/209d-assembly1C_protein_pdball_230102_db.m8"]


def test_misnamed_alignment_is_reported_with_both_sequences(shared_data, tmp_path):
    folder = tmp_path / "alignments"
    folder.mkdir()
    # The peptide (chain E) MSA saved under chain A's name.
    shutil.copy(
        shared_data / "alignments" / "pdb" / "7a4d-assembly1E_protein.a3m", folder / "7a4d-assembly1A_protein.a3m"
    )
    found, warnings = AlignmentIndex(folder).for_structure(
        read_mmcif(shared_data / "structures" / "7a4d-assembly1.cif")
    )
    (message,) = [w for w in warnings if "named for chain A" in w]
    assert "7a4d-assembly1A_protein.a3m" in message
    assert "LEEELKQLEEELQAIEEQLAQLQWKAQARKEKLAQLKEKL" in message and "QLQESGGGLVQPGG" in message
    assert found["A"].msa is None and found["E"].msa is not None


def test_unreadable_alignment_is_recorded_not_fatal(tmp_path):
    (tmp_path / "broken.a3m").write_bytes(b"\x00\x01")
    index = AlignmentIndex(tmp_path)
    assert index.msa_files == [] and "broken.a3m" in index.errors[0]


def test_missing_folder():
    with pytest.raises(ValueError, match="does not exist"):
        AlignmentIndex("/nonexistent/alignments")


@pytest.mark.parametrize(
    ("query", "chain", "kind", "positions"),
    [
        ("ACDEF", "ACDEF", "exact", [0, 1, 2, 3, 4]),
        ("CDE", "ACDEF", "contained", [1, 2, 3]),
        ("ACDEF", "CDE", "contained", [-1, 0, 1, 2, -1]),
        ("MKTAYIAKQRQISFVKSHFSRQ", "MKTAYIAKQRLISFVKSHFSRQ", "similar", list(range(22))),
        ("TXPGVTXPGV", "TVPGVXTVPGV", "similar", [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]),
    ],
)
def test_map_query_to_chain(query, chain, kind, positions):
    mapping = map_query_to_chain(query, chain)
    assert mapping.kind == kind
    assert mapping.chain_positions.tolist() == positions


@pytest.mark.parametrize(("query", "chain"), [("MKTAYIAKQR", "WWWWWWWWWW"), ("XXXXXXXXXX", "MKTAYIAKQR"), ("", "MK")])
def test_map_query_to_chain_rejects_unrelated(query, chain):
    assert map_query_to_chain(query, chain) is None


def test_concatenate_msas_keeps_one_query_row():
    first = parse_a3m(">q\nACD\n>a OX=1\nAC-\n", "first.a3m")
    second = parse_a3m(">q\nACD\n>b OX=2\n-CD\n", "second.a3m")
    merged = concatenate_msas([first, second])
    assert merged.sequences == ("ACD", "AC-", "-CD")
    assert merged.species == ("", "tax:1", "tax:2")
    other = parse_a3m(">q\nACE\n", "other.a3m")
    with pytest.raises(ValueError, match="cannot concatenate"):
        concatenate_msas([first, other])


def test_gzipped_openfold_folder(shared_data, tmp_path):
    """A chain folder with every file gzipped: MSAs and the HHR are still found and tied."""
    folder = tmp_path / "alignments" / "query_A"
    folder.mkdir(parents=True)
    for name in ("bfd_uniclust_hits.a3m", "uniref90_hits.sto", "pdb70_hits.hhr"):
        data = (shared_data / "alignments" / "openfold" / name).read_bytes()
        (folder / f"{name}.gz").write_bytes(gzip.compress(data))
    (record,) = read_fasta(shared_data / "alignments" / "openfold" / "short.fasta")
    structure = structure_from_sequences("query", [("A", "protein", record.sequence)])
    found, warnings = AlignmentIndex(tmp_path / "alignments").for_structure(structure)
    assert warnings == []
    assert [path.rsplit("/", 1)[1] for path in found["A"].msa_files] == [
        "uniref90_hits.sto.gz",
        "bfd_uniclust_hits.a3m.gz",
    ]
    assert found["A"].msa.depth == 57 + 1023
    assert [hit.name for hit in found["A"].hits][:2] == ["1hf9_B", "2crb_A"]
