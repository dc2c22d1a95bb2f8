import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.crop import contiguous_crop, crop_arrays, msa_sample_rows, spatial_crop
from featurecache.features.msa import expand_msa
from featurecache.features.featurize import featurize_from_files
from featurecache.io.alignments import AlignmentIndex


@pytest.fixture(scope="module")
def record(shared_data):
    index = AlignmentIndex(shared_data / "alignments" / "pdb")
    arrays, _ = featurize_from_files(
        shared_data / "structures" / "7a4d-assembly1.cif", index, FeatureConfig(msa_rows_stored=300), None
    )
    return arrays


def _check_crop(arrays, indices, crop_size):
    num_tokens = arrays["restype"].shape[0]
    assert indices.size == min(crop_size, num_tokens)
    assert (np.diff(indices) > 0).all()
    assert indices.min() >= 0 and indices.max() < num_tokens
    cropped = crop_arrays(arrays, indices)
    schema.check_record(cropped, where="crop")
    np.testing.assert_array_equal(cropped["token_index"], arrays["token_index"][indices])
    # Exactly the atoms of the kept tokens, remapped to positions in the crop.
    kept_atoms = np.isin(arrays["atom_to_token"], indices)
    assert cropped["atom_to_token"].size == kept_atoms.sum()
    np.testing.assert_array_equal(indices[cropped["atom_to_token"]], arrays["atom_to_token"][kept_atoms])
    np.testing.assert_array_equal(cropped["atom_pos"], arrays["atom_pos"][kept_atoms])
    # The MSA assembled for the kept tokens is the whole MSA's columns of those tokens.
    np.testing.assert_array_equal(expand_msa(cropped)[0], expand_msa(arrays)[0][:, indices])
    np.testing.assert_array_equal(expand_msa(cropped)[1], expand_msa(arrays)[1][:, indices])
    np.testing.assert_array_equal(cropped["template_restype"], arrays["template_restype"][:, indices])
    return cropped


@settings(max_examples=25, deadline=None)
@given(crop_size=st.integers(1, 700), seed=st.integers(0, 2**32 - 1))
def test_contiguous_crop_properties(record, crop_size, seed):
    indices = contiguous_crop(record["asym_id"], crop_size, np.random.default_rng(seed))
    _check_crop(record, indices, crop_size)
    # Within each chain the kept tokens are one contiguous run.
    for chain in np.unique(record["asym_id"][indices]):
        kept = indices[record["asym_id"][indices] == chain]
        assert (np.diff(kept) == 1).all()


@settings(max_examples=25, deadline=None)
@given(crop_size=st.integers(1, 700), seed=st.integers(0, 2**32 - 1), interface_bias=st.booleans())
def test_spatial_crop_properties(record, crop_size, seed, interface_bias):
    indices = spatial_crop(
        record["token_center_pos"],
        record["token_center_mask"],
        record["asym_id"],
        crop_size,
        np.random.default_rng(seed),
        interface_bias,
    )
    _check_crop(record, indices, crop_size)
    # Resolved tokens are taken before unresolved ones.
    num_tokens = record["restype"].shape[0]
    if crop_size < record["token_center_mask"].sum():
        assert record["token_center_mask"][indices].all()
    # The kept resolved tokens form a ball: some kept token is a centre such that every kept
    # resolved token is at most as far as every dropped resolved token (ties up to 1e-3 * N).
    if 0 < crop_size < num_tokens:
        positions = record["token_center_pos"].astype(np.float64)
        dropped = np.setdiff1d(np.flatnonzero(record["token_center_mask"]), indices)
        kept = indices[record["token_center_mask"][indices]]
        if dropped.size:
            slack = num_tokens * 1e-3 + 1e-4
            assert any(
                np.linalg.norm(positions[kept] - positions[c], axis=1).max()
                <= np.linalg.norm(positions[dropped] - positions[c], axis=1).min() + slack
                for c in kept
            )


def test_interface_bias_picks_a_centre_at_an_interface():
    # Three straight chains far apart, except that chain 2's first token touches chain 1's start.
    line = np.stack([np.arange(20) * 3.8, np.zeros(20), np.zeros(20)], axis=1)
    positions = np.concatenate([line, line + [200.0, 0, 0], line + [0, 500.0, 0]])
    positions[20] = [0.0, 5.0, 0.0]
    asym = np.repeat([1, 2, 3], 20)
    mask = np.ones(60, dtype=bool)
    distances = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    interface = np.flatnonzero(((distances < 15.0) & (asym[:, None] != asym[None])).any(axis=1))
    assert 0 in interface and 20 in interface and 30 not in interface
    generator = np.random.default_rng()
    for _ in range(20):
        indices = spatial_crop(positions, mask, asym, 3, generator, interface_bias=True)
        assert np.intersect1d(indices, interface).size > 0
        assert not np.isin(indices, np.arange(40, 60)).any()


def test_spatial_crop_without_resolved_tokens_falls_back_to_contiguous():
    asym = np.repeat([1, 2], 10)
    indices = spatial_crop(np.zeros((20, 3)), np.zeros(20, bool), asym, 8, np.random.default_rng())
    assert indices.size == 8


def test_crop_rejects_bad_indices(record):
    with pytest.raises(ValueError, match="out of range"):
        crop_arrays(record, np.array([0, 10**6]))
    with pytest.raises(ValueError, match="unique"):
        crop_arrays(record, np.array([1, 1]))
    with pytest.raises(ValueError, match="crop_size"):
        contiguous_crop(record["asym_id"], 0, np.random.default_rng())


def test_msa_sample_rows_keep_query_first(record):
    generator = np.random.default_rng()
    depth = record["msa_species"].shape[0]
    rows = msa_sample_rows(depth, 17, generator)
    assert rows[0] == 0 and rows.size == 17 and (np.diff(rows) > 0).all() and rows.max() < depth
    msa, deletions = expand_msa(record, rows)
    whole_msa, whole_deletions = expand_msa(record)
    np.testing.assert_array_equal(msa, whole_msa[rows])
    np.testing.assert_array_equal(deletions, whole_deletions[rows])
    np.testing.assert_array_equal(msa_sample_rows(depth, 10**6, generator), np.arange(depth))
    with pytest.raises(ValueError, match="max_rows"):
        msa_sample_rows(depth, 0, generator)


def test_crops_keep_atom_and_token_indices_consistent(shared_data):
    """After a crop every index array points into the cropped arrays: a distogram / frame atom
    of token t is an atom of the crop (of token t, or of t's residue for a ligand frame), and
    token bonds join kept tokens only."""
    from featurecache.features.tokenize import tokenize
    from featurecache.io.mmcif import read_mmcif

    arrays = tokenize(read_mmcif(shared_data / "bonded" / "1ncb.cif")).arrays
    rng = np.random.default_rng(3)
    for crop_size in (64, 200, 500):
        for kind in ("contiguous", "spatial"):
            if kind == "spatial":
                kept = spatial_crop(
                    arrays["token_center_pos"], arrays["token_center_mask"], arrays["asym_id"], crop_size, rng
                )
            else:
                kept = contiguous_crop(arrays["asym_id"], crop_size, rng)
            cropped = crop_arrays(arrays, kept)
            atoms, tokens = cropped["atom_to_token"].size, kept.size
            assert cropped["ref_pos"].shape[0] == atoms and cropped["restype"].size == tokens
            distogram = cropped["distogram_atom_index"]
            present = distogram >= 0
            assert (cropped["atom_to_token"][distogram[present]] == np.flatnonzero(present)).all()
            frames = cropped["frame_atom_index"]
            valid = (frames >= 0).all(axis=1)
            assert ((frames >= 0).any(axis=1) == valid).all() and (frames < atoms).all()
            assert (cropped["atom_to_token"][frames[valid, 1]] == np.flatnonzero(valid)).all()
            space = cropped["ref_space_uid"]
            assert (space[frames[valid]] == space[frames[valid, 1]][:, None]).all()
            bonds = cropped["token_bonds"]
            assert ((bonds >= 0) & (bonds < tokens)).all() and (bonds[:, 0] < bonds[:, 1]).all()
            # Each kept original bond survives, renumbered.
            position = {token: index for index, token in enumerate(kept.tolist())}
            expected = {
                (position[i], position[j]) for i, j in arrays["token_bonds"].tolist() if i in position and j in position
            }
            assert {tuple(pair) for pair in bonds.tolist()} == expected


@pytest.fixture(scope="module")
def glycoprotein(shared_data):
    """1ncb: a protein with glycans (NAG / MAN / BMA: each atom a token, each residue one unit)."""
    from featurecache.features.tokenize import tokenize
    from featurecache.io.mmcif import read_mmcif

    return tokenize(read_mmcif(shared_data / "bonded" / "1ncb.cif")).arrays


def _split_residues(arrays, kept):
    """Residues (reference spaces) of which a crop keeps some atoms but not all."""
    space = arrays["ref_space_uid"]
    in_crop = np.isin(arrays["atom_to_token"], kept)
    return sorted(set(space[in_crop]) & set(space[~in_crop]))


@pytest.mark.parametrize("mode", ["contiguous", "spatial", "spatial_interface"])
def test_crops_never_split_a_ligand_or_a_residue(glycoprotein, mode):
    from featurecache.features.crop import crop_groups, crop_tokens

    groups = crop_groups(glycoprotein)
    sizes = np.bincount(groups)
    assert sizes.max() > 10 and glycoprotein["is_ligand"].sum() > 100  # multi-atom ligand residues to split
    rng = np.random.default_rng(7)
    chains = np.unique(glycoprotein["asym_id"])
    for crop_size in (5, 17, 64, 200, 500):
        for _ in range(10):
            focus = tuple(int(c) for c in rng.choice(chains, size=int(rng.integers(0, 3)), replace=False))
            kept = crop_tokens(glycoprotein, mode, crop_size, rng, focus)
            assert 0 < kept.size <= crop_size and (np.diff(kept) > 0).all()
            assert _split_residues(glycoprotein, kept) == []
            if mode != "contiguous":
                # a residue was left out only because it no longer fitted
                dropped = np.setdiff1d(np.unique(groups), groups[kept])
                assert (sizes[dropped] > crop_size - kept.size).all()
    # without the groups the same draws do split glycans: the test can fail
    plain = [contiguous_crop(glycoprotein["asym_id"], 17, np.random.default_rng(seed)) for seed in range(20)]
    assert any(_split_residues(glycoprotein, kept) for kept in plain)


def _three_chains():
    """Three straight chains of 20 tokens; chain 1 touches chain 2 at its start and chain 3 at its end."""
    line = np.stack([np.arange(20) * 3.8, np.zeros(20), np.zeros(20)], axis=1)
    positions = np.concatenate([line, line + [0.0, 300.0, 0], line + [0, 600.0, 0]])
    positions[20] = [0.0, 5.0, 0.0]  # chain 2's first token by chain 1's first
    positions[40] = [72.2, 5.0, 0.0]  # chain 3's first token by chain 1's last
    return positions, np.repeat([1, 2, 3], 20), np.ones(60, dtype=bool)


def test_spatial_crops_centre_on_the_sampled_chain_or_interface():
    positions, asym, mask = _three_chains()
    rng = np.random.default_rng(0)
    for _ in range(20):
        # spatial around chain 2 alone: chain 2's tokens (the others are 300 A away, but its first token's contact)
        kept = spatial_crop(positions, mask, asym, 3, rng, interface_bias=False, focus_chains=(2,))
        assert (asym[kept] == 2).any()
        # the interface of chains 1 and 3: the centre is at their contact, never at the 1-2 contact
        kept = spatial_crop(positions, mask, asym, 3, rng, interface_bias=True, focus_chains=(1, 3))
        assert set(kept) <= {15, 16, 17, 18, 19, 40}
        # an interface crop for chain 2 alone centres at chain 2's contact with chain 1
        kept = spatial_crop(positions, mask, asym, 2, rng, interface_bias=True, focus_chains=(2,))
        assert set(kept) <= {0, 1, 20, 21}


def test_crop_modes_occur_at_their_probabilities(record):
    from scipy import stats

    from featurecache.config import CROP_MODES, SampleConfig
    from featurecache.loader import crop_sample

    sample = SampleConfig(crop_size=48, msa_rows_per_sample=4, max_templates=0, seed=9)
    draws = 1500
    modes = [crop_sample("7a4d", record, sample, 0, index)["crop_mode"] for index in range(draws)]
    for mode, probability in zip(CROP_MODES, sample.crop_mode_probs):
        assert stats.binomtest(modes.count(mode), draws, probability).pvalue > 1e-3, (mode, modes.count(mode))
    skewed = SampleConfig(crop_size=48, msa_rows_per_sample=4, max_templates=0, seed=9, crop_mode_probs=(1.0, 0.0, 0.0))
    assert {crop_sample("7a4d", record, skewed, 0, index)["crop_mode"] for index in range(20)} == {"contiguous"}
    whole = SampleConfig(crop_size=None, msa_rows_per_sample=4, max_templates=0)
    assert crop_sample("7a4d", record, whole, 0, 0)["crop_mode"] == "none"


def test_msa_cycle_rows_draw_anew_per_cycle_and_keep_a_shallow_msa_whole():
    from featurecache.features.crop import msa_cycle_rows, msa_sample_rows

    depth, per_cycle, draws = 500, 64, 4
    pool, cycle_rows = msa_cycle_rows(depth, per_cycle, draws, np.random.default_rng(1), np.random.default_rng(2))
    assert cycle_rows.shape == (draws, per_cycle) and (cycle_rows >= 0).all()
    assert len(pool) <= draws * (per_cycle - 1) + 1 and np.array_equal(pool, np.unique(pool))
    cycles = [pool[rows] for rows in cycle_rows]
    assert all(rows[0] == 0 and len(set(rows)) == per_cycle for rows in cycles)  # the query first
    assert all(not np.array_equal(cycles[0], other) for other in cycles[1:])  # different rows per cycle
    # the first cycle is the single draw of msa_sample_rows from the same generator
    assert np.array_equal(cycles[0], msa_sample_rows(depth, per_cycle, np.random.default_rng(1)))
    again = msa_cycle_rows(depth, per_cycle, draws, np.random.default_rng(1), np.random.default_rng(2))
    assert np.array_equal(pool, again[0]) and np.array_equal(cycle_rows, again[1])

    shallow_pool, shallow_rows = msa_cycle_rows(
        40, per_cycle, draws, np.random.default_rng(1), np.random.default_rng(2)
    )
    assert np.array_equal(shallow_pool, np.arange(40))
    for rows in shallow_rows:  # every cycle: every row, then -1
        assert np.array_equal(rows[:40], np.arange(40)) and (rows[40:] == -1).all()
