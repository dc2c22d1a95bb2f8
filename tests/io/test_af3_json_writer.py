"""Writers of A3M and AlphaFold 3 input JSON: what they write reads back the same."""

from __future__ import annotations

import json

import gemmi
import numpy as np
import pytest

from featurecache.io.af3_json import read_af3_json
from featurecache.io.af3_json_writer import (
    Af3Entity,
    Af3Template,
    af3_chain_ids,
    af3_document,
    af3_entities,
    af3_json_text,
    backbone_template_mmcif,
    renamed_chains,
    single_chain_mmcif,
)
from featurecache.io.mmcif import parse_mmcif, read_mmcif
from featurecache.io.msa import Msa, format_a3m, parse_a3m, read_msa


def test_a3m_round_trip_keeps_rows_headers_and_deletion_counts(shared_data):
    msa = read_msa(shared_data / "alignments" / "openfold" / "uniref90_hits.sto")
    assert msa.deletion_matrix.any()
    again = parse_a3m(format_a3m(msa), "written")
    np.testing.assert_array_equal(again.aligned, msa.aligned)
    np.testing.assert_array_equal(again.deletion_matrix, msa.deletion_matrix)
    assert again.descriptions == msa.descriptions


def test_a3m_rows_subset_and_unknown_inserted_residues():
    aligned = np.frombuffer(b"ACGUA-GU", dtype=np.uint8).reshape(2, 4).copy()
    deletions = np.array([[0, 0, 0, 0], [0, 2, 0, 1]], dtype=np.int32)
    msa = Msa(aligned, deletions, ("query", "hit\twith a tab"), "test")
    assert format_a3m(msa, molecule_type="rna") == ">query\nACGU\n>hit\twith a tab\nAnn-GnU\n"
    assert format_a3m(msa, [0]) == ">query\nACGU\n"


def test_chain_ids_follow_af3_and_only_refused_ones_are_renamed():
    assert af3_chain_ids(28)[:3] == ["A", "B", "C"] and af3_chain_ids(28)[25:] == ["Z", "AA", "BA"]
    assert renamed_chains(["A", "B", "A:MG167", "1"]) == {"A:MG167": "C", "1": "D"}


def test_single_chain_mmcif_keeps_unresolved_residues(shared_data):
    path = shared_data / "templates" / "mmcif" / "4i6p.cif"
    original = next(chain for chain in read_mmcif(path).chains if chain.auth_chain_id == "B")
    (written,) = parse_mmcif(single_chain_mmcif(path, "B"), "written").chains
    assert written.sequence == original.sequence and len(written.residues) == 88
    resolved = [bool((residue.occupancies > 0).any()) for residue in written.residues]
    assert resolved == [bool((residue.occupancies > 0).any()) for residue in original.residues]
    assert not all(resolved)  # unresolved residues stay in the sequence, so template indices count them
    with pytest.raises(ValueError, match="no chain"):
        single_chain_mmcif(path, "Q")


@pytest.mark.parametrize("name", ["1psm", "2crb", "3u8v", "3zee", "4i6p", "4zey", "5kc1"])
def test_every_template_mmcif_keeps_its_release_date(shared_data, name):
    # AF3 (data/templates.py) raises "Template structure ... must have a release date" for a
    # template whose mmCIF lacks _pdbx_audit_revision_history.revision_date; it takes the earliest.
    path = shared_data / "templates" / "mmcif" / f"{name}.cif"
    chain = next(chain for chain in read_mmcif(path).chains if chain.molecule_type == "protein")
    text = single_chain_mmcif(path, chain.auth_chain_id)
    assert af3_template_release_date(text) == read_mmcif(path).release_date is not None
    assert parse_mmcif(text, name).release_date == read_mmcif(path).release_date


def test_template_mmcif_without_a_release_date_is_refused(shared_data, tmp_path):
    document = gemmi.cif.read(str(shared_data / "templates" / "mmcif" / "1psm.cif"))
    for category in ("_pdbx_audit_revision_history.", "_database_PDB_rev."):
        document.sole_block().find_mmcif_category(category).erase()
    undated = tmp_path / "1psm.cif"
    undated.write_text(document.as_string())
    assert read_mmcif(undated).release_date is None
    with pytest.raises(ValueError, match="no release date .* AlphaFold 3 requires"):
        single_chain_mmcif(undated, "A")
    with pytest.raises(ValueError, match="template t: no release date"):
        backbone_template_mmcif(
            "t", ["ALA"], np.zeros((1, 3, 3)), np.ones((1, 3), bool), np.zeros((1, 3)), np.ones(1, bool), None
        )


def af3_template_release_date(text: str) -> str | None:
    """AF3's reading of a template's date (structure/mmcif.py get_release_date): the earliest
    _pdbx_audit_revision_history.revision_date, None without the item."""
    block = gemmi.cif.read_string(text).sole_block()
    dates = list(block.find_values("_pdbx_audit_revision_history.revision_date"))
    return min(gemmi.cif.as_string(date) for date in dates) if dates else None


def test_structure_to_json_reads_back(shared_data, tmp_path):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    entities = af3_entities(structure)
    kinds = [entity.kind for entity in entities]
    assert kinds.count("protein") == 1 and entities[0].ids == ("A", "B")  # one entity, two copies
    ligand = next(entity for entity in entities if entity.ccd_codes == ("GNP",))
    assert ligand.description and all(chain_id.isalpha() for chain_id in ligand.ids)  # "A:GNP168" renamed
    template = Af3Template(single_chain_mmcif(shared_data / "templates" / "mmcif" / "1psm.cif", "A"), (0, 1), (3, 4))
    protein = Af3Entity(
        **{
            **entities[0].__dict__,
            "unpaired_msa": f">query\n{entities[0].sequence}\n",
            "paired_msa": "",
            "templates": (template,),
        }
    )
    path = tmp_path / "721p.json"
    path.write_text(af3_json_text(af3_document("721p", [protein, *entities[1:]])), encoding="utf-8")
    document = json.loads(path.read_text())
    assert document["version"] == 4 and document["dialect"] == "alphafold3"
    parsed = read_af3_json(path, "721p")
    assert [chain.sequence for chain in parsed.structure.chains if chain.molecule_type == "protein"] == [
        entities[0].sequence
    ] * 2
    (given,) = parsed.templates["A"]
    assert given.hit.query_indices.tolist() == [0, 1] and given.hit.hit_indices.tolist() == [3, 4]


def test_backbone_template_reads_back_with_its_atoms():
    positions = np.arange(27, dtype=np.float32).reshape(3, 3, 3)
    text = backbone_template_mmcif(
        "t",
        ["ALA", "GLY", "MET"],
        positions,
        np.ones((3, 3), bool),
        positions[:, 1] + 1.0,
        np.array([True, True, False]),
        "1995-02-07",
    )
    assert af3_template_release_date(text) == "1995-02-07"
    (chain,) = parse_mmcif(text, "t").chains
    assert chain.molecule_type == "protein" and chain.sequence == "AGM"
    assert [residue.atom_names for residue in chain.residues] == [
        ("N", "CA", "C", "CB"),
        ("N", "CA", "C"),
        ("N", "CA", "C"),
    ]
    np.testing.assert_allclose(chain.residues[0].positions[:3], positions[0])
