import dataclasses
import shutil

import numpy as np
import pytest

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.featurize import featurize_target
from featurecache.features.templates import sample_templates
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
    # 1hf9 and 2q2k are not in the folder; 5KC1's aligned residues are unresolved, so (as AF3)
    # neither 5kc1 hit is a template. Every other hit is stored, not only the first four.
    assert metadata["template_hits_without_coordinates"] == ["1hf9_B", "2q2k_A"]
    assert metadata["template_names"] == ["A:2crb_A", "A:4zey_A", "A:3u8v_A", "A:1psm_A", "A:3zee_A", "A:4i6p_A"]
    assert arrays["template_restype"].shape == (6, len(sequence)) and metadata["num_templates"] == 6
    assert (arrays["template_count"] == 6).all()
    # 2CRB_A: query 11-30 aligned to template 32-51 without gaps.
    template = read_mmcif(shared_data / "templates" / "mmcif" / "2crb.cif").chains[0]
    aligned = arrays["template_restype"][0]
    assert (aligned[:10] == schema.GAP).all() and (aligned[30:] == schema.GAP).all()
    expected = [schema.RESTYPE_INDEX[template.residues[i].parent] for i in range(31, 51)]
    assert aligned[10:30].tolist() == expected
    residue = template.residues[31]
    np.testing.assert_allclose(
        arrays["template_pseudo_beta_pos"][0, 10], residue.positions[residue.atom_names.index("CB")]
    )
    np.testing.assert_allclose(
        arrays["template_backbone_pos"][0, 10, 1], residue.positions[residue.atom_names.index("CA")]
    )
    assert arrays["template_backbone_mask"][0, 10].all()
    assert not arrays["template_pseudo_beta_mask"][0, :10].any()
    # A FASTA query has no release date: nothing to filter by date, and the record says so.
    assert any("no release date" in note and "template_release_gap_days=60" in note for note in metadata["warnings"])


def test_release_date_filter(shared_data, query_target):
    sequence, hits = query_target
    _, metadata = _featurize(sequence, hits, shared_data / "templates" / "mmcif", release_date="2000-01-01")
    assert metadata["template_names"] == ["A:1psm_A"]  # released 1995; the others later
    assert not any("no release date" in note for note in metadata["warnings"])


def test_release_gap_is_60_days_by_default(shared_data, query_target):
    # 3ZEE was released on 2013-10-16; 4I6P (2013-07-17) and the others before.
    sequence, hits = query_target
    folder = shared_data / "templates" / "mmcif"
    _, sixty_days = _featurize(sequence, hits, folder, release_date="2013-12-15")
    assert "A:3zee_A" in sixty_days["template_names"]
    _, fifty_nine_days = _featurize(sequence, hits, folder, release_date="2013-12-14")
    assert fifty_nine_days["template_names"] == [name for name in sixty_days["template_names"] if name != "A:3zee_A"]
    assert "A:4i6p_A" in fifty_nine_days["template_names"]
    # The gap is a setting: with none, the same target keeps 3ZEE.
    _, no_gap = _featurize(sequence, hits, folder, release_date="2013-12-14", template_release_gap_days=0)
    assert "A:3zee_A" in no_gap["template_names"]


@pytest.fixture(scope="module")
def many_hits(shared_data, query_target, tmp_path_factory):
    """Ten hits with resolved structures: the HHR's, with 2Q2K's entry added to the folder, plus
    the second (identical) chain of each two-chain entry, aligned as the entry's hit chain is."""
    sequence, hits = query_target
    folder = tmp_path_factory.mktemp("templates")
    for path in (shared_data / "templates" / "mmcif").iterdir():
        shutil.copy(path, folder)
    shutil.copy(shared_data / "structures" / "2q2k.cif", folder)
    expanded = []
    for hit in hits:
        expanded.append(hit)
        if hit.name in ("3u8v_A", "4i6p_A", "2q2k_A"):
            expanded.append(dataclasses.replace(hit, name=hit.name.replace("_A", "_B")))
    return sequence, expanded, folder


def test_every_kept_hit_is_stored_up_to_the_setting(many_hits):
    sequence, hits, folder = many_hits
    assert FeatureConfig().max_templates_stored == 20  # AF3: up to 20 per chain
    arrays, metadata = _featurize(sequence, hits, folder, release_date="2020-01-01", deduplicate_templates=False)
    kept = ["2crb_A", "4zey_A", "3u8v_A", "3u8v_B", "1psm_A", "3zee_A", "4i6p_A", "4i6p_B", "2q2k_A", "2q2k_B"]
    assert metadata["template_names"] == [f"A:{name}" for name in kept]
    assert arrays["template_restype"].shape == (10, len(sequence)) and (arrays["template_count"] == 10).all()
    assert arrays["template_pseudo_beta_mask"].any(axis=1).all()  # every stored row is a real template
    capped, capped_meta = _featurize(
        sequence, hits, folder, release_date="2020-01-01", deduplicate_templates=False, max_templates_stored=7
    )
    assert capped_meta["template_names"] == metadata["template_names"][:7] and (capped["template_count"] == 7).all()
    np.testing.assert_array_equal(capped["template_backbone_pos"], arrays["template_backbone_pos"][:7])
    # AF3's deduplication: an entry's identical chains place the same residues, so count once
    _, deduplicated = _featurize(sequence, hits, folder, release_date="2020-01-01")
    assert deduplicated["template_names"] == [f"A:{name}" for name in kept if not name.endswith("_B")]


def test_chains_stack_their_own_hits_on_the_template_axis(many_hits):
    sequence, hits, folder = many_hits
    structure = structure_from_sequences(
        "pair",
        [("A", "protein", sequence), ("B", "protein", sequence), ("C", "dna", "ACGT")],
        release_date="2020-01-01",
    )
    arrays, metadata = featurize_target(structure, {}, {"A": hits, "B": hits[1:4]}, FeatureConfig(), folder)
    chain_a, chain_b, chain_c = (arrays["asym_id"] == number for number in (1, 2, 3))
    assert arrays["template_restype"].shape[0] == 7  # A: the deduplicated hits; B: the first three of them
    assert (arrays["template_count"][chain_a] == 7).all() and (arrays["template_count"][chain_b] == 3).all()
    assert (arrays["template_count"][chain_c] == 0).all()
    # B's three rows match A's first three; its other rows and C's columns are empty
    np.testing.assert_array_equal(
        arrays["template_restype"][:3][:, chain_b], arrays["template_restype"][:3][:, chain_a]
    )
    assert (arrays["template_restype"][3:][:, chain_b] == schema.GAP).all()
    assert (arrays["template_restype"][:, chain_c] == schema.GAP).all()
    assert not arrays["template_backbone_mask"][3:][:, chain_b].any()
    assert metadata["template_names"][7:] == ["B:2crb_A", "B:4zey_A", "B:3u8v_A"]


def _row_of(stored: dict, sampled: dict, row: int, tokens: np.ndarray) -> int:
    """The stored row that sampled row `row` copies in `tokens`' columns."""
    matches = [
        stored_row
        for stored_row in range(stored["template_restype"].shape[0])
        if np.array_equal(sampled["template_restype"][row, tokens], stored["template_restype"][stored_row, tokens])
        and np.array_equal(
            sampled["template_backbone_pos"][row, tokens], stored["template_backbone_pos"][stored_row, tokens]
        )
    ]
    assert matches, f"sampled row {row} is none of the stored templates"
    return matches[0]


def test_sampled_templates_are_per_chain_subsets_of_the_stored_ones(many_hits):
    sequence, hits, folder = many_hits
    structure = structure_from_sequences(
        "pair", [("A", "protein", sequence), ("B", "protein", sequence)], release_date="2020-01-01"
    )
    stored, _ = featurize_target(structure, {}, {"A": hits, "B": hits[1:4]}, FeatureConfig(), folder)
    chains = {number: np.flatnonzero(stored["asym_id"] == number) for number in (1, 2)}
    draws = []
    for seed in range(12):
        sampled = sample_templates(stored, 4, np.random.default_rng(seed))
        assert sampled["template_restype"].shape[0] <= 4
        picks = []
        for _number, tokens in chains.items():
            count = int(sampled["template_count"][tokens[0]])
            assert count <= min(4, int(stored["template_count"][tokens[0]]))
            assert (sampled["template_count"][tokens] == count).all()
            rows = [_row_of(stored, sampled, row, tokens) for row in range(count)]
            assert len(set(rows)) == count  # without replacement
            assert (sampled["template_restype"][count:][:, tokens] == schema.GAP).all()
            picks.append(tuple(rows))
        draws.append(tuple(picks))
        again = sample_templates(stored, 4, np.random.default_rng(seed))
        for name in ("template_restype", "template_pseudo_beta_pos", "template_count"):
            np.testing.assert_array_equal(again[name], sampled[name])
    assert len(set(draws)) > 6  # the draw changes with the seed
    assert any(max(len(rows) for rows in picks) == 4 for picks in draws)
    # inference: the first (best-ranked) four of every chain, in order
    first = sample_templates(stored, 4, None)
    for name in ("template_restype", "template_backbone_mask"):
        np.testing.assert_array_equal(first[name][:, chains[1]], stored[name][:4][:, chains[1]])
        np.testing.assert_array_equal(first[name][:3, chains[2]], stored[name][:3][:, chains[2]])
    assert first["template_count"][chains[1]][0] == 4 and first["template_count"][chains[2]][0] == 3


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
        hit,
        aligned_cols=length,
        query_start=1,
        query_end=length,
        hit_start=1,
        hit_end=length,
        query_indices=np.arange(length, dtype=np.int32),
        hit_indices=np.arange(length, dtype=np.int32),
        hit_sequence=sequence,
    )
    _, metadata = _featurize(sequence, [identical], shared_data / "templates" / "mmcif")
    assert metadata["template_names"] == []
    _, metadata = _featurize(
        sequence, [identical], shared_data / "templates" / "mmcif", max_template_subsequence_ratio=1.0
    )
    assert metadata["template_names"] == ["A:3zee_A"]


def test_m8_hits_without_structures_are_listed(shared_data):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    hits = read_hits(shared_data / "alignments" / "pdb_templates_m8" / "721p-assembly1A_protein_pdball_230102_db.m8")
    config = FeatureConfig(msa_rows_stored=8)
    arrays, metadata = featurize_target(
        structure, {}, {"A": hits, "B": hits}, config, shared_data / "templates" / "mmcif"
    )
    assert metadata["num_templates"] == 0
    assert metadata["template_hits_without_coordinates"][:2] == ["4g3x_A", "721p_A"]
    assert len(metadata["template_hits_without_coordinates"]) == len(set(metadata["template_hits_without_coordinates"]))


def test_missing_template_folder(query_target):
    sequence, hits = query_target
    with pytest.raises(ValueError, match="template folder"):
        _featurize(sequence, hits, "/nonexistent/templates")
