import dataclasses

import numpy as np
import pytest

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.featurize import featurize_target
from featurecache.io.fasta import read_fasta
from featurecache.io.hits import read_hits
from featurecache.io.mmcif import read_mmcif
from featurecache.io.structure import structure_from_sequences


@pytest.fixture(scope="module")
def query_target(shared_data):
    (record,) = read_fasta(shared_data / "alignments" / "openfold" / "short.fasta")
    hits = read_hits(shared_data / "alignments" / "openfold" / "pdb70_hits.hhr")
    return record.sequence, hits


def _featurize(sequence, hits, template_dir, release_date=None, **config):
    structure = structure_from_sequences("query", [("A", "protein", sequence)], release_date=release_date)
    return featurize_target(structure, {}, {"A": hits}, FeatureConfig(**config), template_dir)


def test_hhr_hits_with_template_structures(shared_data, query_target):
    sequence, hits = query_target
    arrays, metadata = _featurize(sequence, hits, shared_data / "templates" / "mmcif")
    # 1hf9 is not in the folder; the next four hits are featurized (max_templates = 4).
    assert metadata["template_hits_without_coordinates"] == ["1hf9_B"]
    assert metadata["template_names"] == ["A:2crb_A", "A:4zey_A", "A:3u8v_A", "A:1psm_A"]
    assert arrays["template_restype"].shape == (4, len(sequence))
    # 2CRB_A: query 11-30 aligned to template 32-51 without gaps.
    template = read_mmcif(shared_data / "templates" / "mmcif" / "2crb.cif").chains[0]
    aligned = arrays["template_restype"][0]
    assert (aligned[:10] == schema.GAP).all() and (aligned[30:] == schema.GAP).all()
    expected = [schema.RESTYPE_INDEX[template.residues[i].parent] for i in range(31, 51)]
    assert aligned[10:30].tolist() == expected
    residue = template.residues[31]
    np.testing.assert_allclose(arrays["template_pseudo_beta_pos"][0, 10], residue.positions[residue.atom_names.index("CB")])
    np.testing.assert_allclose(arrays["template_backbone_pos"][0, 10, 1], residue.positions[residue.atom_names.index("CA")])
    assert arrays["template_backbone_mask"][0, 10].all()
    assert not arrays["template_pseudo_beta_mask"][0, :10].any()


def test_release_date_filter(shared_data, query_target):
    sequence, hits = query_target
    _, metadata = _featurize(sequence, hits, shared_data / "templates" / "mmcif", release_date="2000-01-01")
    assert metadata["template_names"] == ["A:1psm_A"]  # released 1995; the others later


def test_align_ratio_filter(shared_data, query_target):
    sequence, hits = query_target
    arrays, metadata = _featurize(sequence, hits, shared_data / "templates" / "mmcif", min_template_align_ratio=0.5)
    assert metadata["num_templates"] == 0 and arrays["template_restype"].shape == (0, len(sequence))


def test_near_identical_subsequence_is_dropped(shared_data):
    template = read_mmcif(shared_data / "templates" / "mmcif" / "3zee.cif").chains[0]
    sequence = template.sequence
    hit = read_hits(shared_data / "alignments" / "openfold" / "pdb70_hits.hhr")[7]  # 3ZEE_A
    length = len(sequence)
    identical = dataclasses.replace(
        hit, aligned_cols=length, query_start=1, query_end=length, hit_start=1, hit_end=length,
        query_indices=np.arange(length, dtype=np.int32), hit_indices=np.arange(length, dtype=np.int32),
        hit_sequence=sequence,
    )
    _, metadata = _featurize(sequence, [identical], shared_data / "templates" / "mmcif")
    assert metadata["template_names"] == []
    _, metadata = _featurize(sequence, [identical], shared_data / "templates" / "mmcif", max_template_subsequence_ratio=1.0)
    assert metadata["template_names"] == ["A:3zee_A"]


def test_m8_hits_without_structures_are_listed(shared_data):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    hits = read_hits(shared_data / "alignments" / "pdb_templates_m8" / "721p-assembly1A_protein_pdball_230102_db.m8")
    config = FeatureConfig(msa_rows_stored=8)
    arrays, metadata = featurize_target(structure, {}, {"A": hits, "B": hits}, config, shared_data / "templates" / "mmcif")
    assert metadata["num_templates"] == 0
    assert metadata["template_hits_without_coordinates"][:2] == ["4g3x_A", "721p_A"]
    assert len(metadata["template_hits_without_coordinates"]) == len(set(metadata["template_hits_without_coordinates"]))


def test_missing_template_folder(query_target):
    sequence, hits = query_target
    with pytest.raises(ValueError, match="template folder"):
        _featurize(sequence, hits, "/nonexistent/templates")
