"""CacheDataset and collate on a real cache built from ../shared/data."""

import numpy as np
import pytest
import torch

from featurecache import CacheDataset, collate
from featurecache.schema import FEATURES, GAP


def test_ids_lengths_and_filters(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=64)
    assert dataset.ids == sorted(dataset.ids) and len(dataset) == 5
    assert "721p-assembly1" in dataset.ids
    small = CacheDataset(sample_cache, crop_size=64, max_tokens=250)
    assert all(small.num_tokens(i) <= 250 for i in range(len(small)))
    assert 0 < len(small) < len(dataset)
    table = dataset.sampling_table  # every target can be drawn
    assert (np.bincount(table.targets, table.weights, minlength=len(dataset)) > 0).all()
    with pytest.raises(KeyError, match="not in the cache"):
        CacheDataset(sample_cache, ids=["no-such-target"])


def test_sample_is_cropped_and_consistent(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=48, msa_rows_per_sample=32, seed=3)
    for index in range(len(dataset)):
        sample = dataset[index]
        tokens = sample["restype"].shape[0]
        # a crop never splits a residue, so it may keep fewer tokens than the crop size
        assert 0 < tokens <= min(48, dataset.num_tokens(index))
        # the union of the sample's 4 draws of 32 rows (one per recycling cycle), the query shared
        assert sample["msa"].shape[0] <= dataset.sample.msa_pool_rows == 4 * 31 + 1
        assert sample["msa"].shape[1] == tokens and sample["msa_cycle_rows"].shape == (4, 32)
        assert sample["msa"].shape[0] >= 1
        # The query row is kept first and equals the restype of the cropped tokens (polymers).
        polymer = ~sample["is_ligand"]
        assert torch.equal(sample["msa"][0][polymer], sample["restype"][polymer])
        assert int(sample["atom_to_token"].max()) < tokens
        assert sample["restype"].dtype == torch.long and sample["deletion_matrix"].dtype == torch.float32


def test_crops_are_reproducible_and_change_with_epoch(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=40, seed=11)
    index = dataset.ids.index("7a4d-assembly1")
    first = dataset[index]["token_index"]
    assert torch.equal(first, CacheDataset(sample_cache, crop_size=40, seed=11)[index]["token_index"])
    changed = False
    for epoch in range(1, 6):
        dataset.set_epoch(epoch)
        changed |= not torch.equal(first, dataset[index]["token_index"])
    assert changed


def test_epoch_index_pairs_equal_set_epoch(sample_cache):
    # Long-lived workers get the epoch with each index instead of through set_epoch.
    dataset = CacheDataset(sample_cache, crop_size=40, seed=11)
    index = dataset.ids.index("7a4d-assembly1")
    dataset.set_epoch(3)
    expected = dataset[index]["token_index"]
    dataset.set_epoch(0)
    assert torch.equal(dataset[(3, index)]["token_index"], expected)


def test_collate_pads_and_masks(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=16)
    samples = [dataset[i] for i in range(len(dataset))]
    batch = collate(samples)
    assert batch["id"] == dataset.ids
    size = max(s["restype"].shape[0] for s in samples)
    assert batch["restype"].shape == (len(samples), size)
    for row, sample in enumerate(samples):
        tokens = sample["restype"].shape[0]
        assert batch["token_pad_mask"][row].sum() == tokens
        assert torch.equal(batch["restype"][row, :tokens], sample["restype"])
        assert torch.all(batch["restype"][row, tokens:] == GAP)
        assert batch["msa_row_mask"][row].sum() == sample["msa"].shape[0]
        assert batch["atom_pad_mask"][row].sum() == sample["atom_to_token"].shape[0]
        # Index arrays pad with -1 and point into the sample's own (unpadded) atoms and tokens.
        bonds = sample["token_bonds"].shape[0]
        assert batch["token_bond_mask"][row].sum() == bonds
        assert torch.all(batch["token_bonds"][row, bonds:] == -1)
        assert torch.all(batch["token_bonds"][row, :bonds] < tokens)
        assert torch.all(batch["frame_atom_index"][row, tokens:] == -1)
        assert torch.all(batch["distogram_atom_index"][row] < sample["atom_to_token"].shape[0])
    for spec in FEATURES:
        assert batch[spec.name].shape[0] == len(samples)
    with pytest.raises(ValueError, match="empty"):
        collate([])


def test_collate_pads_to_fixed_sizes(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=16)
    fixed = {"token": 64, "msa": dataset.sample.msa_pool_rows, "template": 4}  # 4 draws of 16 rows, the query shared
    shapes = set()
    for index in range(len(dataset)):
        sample = dataset[index]
        batch = collate([sample], pad_to=fixed)
        shapes.add((batch["restype"].shape, batch["msa"].shape, batch["template_restype"].shape))
        tokens, rows = sample["restype"].shape[0], sample["msa"].shape[0]
        assert batch["token_pad_mask"].sum() == tokens and batch["msa_row_mask"].sum() == rows
        assert torch.all(batch["msa"][0, rows:] == GAP) and torch.all(batch["msa"][0, :, tokens:] == GAP)
    assert shapes == {((1, 64), (1, 61, 64), (1, 4, 64))}  # one shape for every target
    small = dataset[0]
    with pytest.raises(ValueError, match=rf"{small['id']} has \d+ along 'token' .* fixed size 2"):
        collate([small], pad_to={"token": 2})
    with pytest.raises(ValueError, match="unknown axes"):
        collate([small], pad_to={"residue": 2})


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_workers(sample_cache, context):
    dataset = CacheDataset(sample_cache, crop_size=32, msa_rows_per_sample=8)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=2, collate_fn=collate, multiprocessing_context=context
    )
    seen = [target for batch in loader for target in batch["id"]]
    assert seen == dataset.ids
    expected = [dataset[i]["token_index"] for i in range(len(dataset))]
    again = [s for batch in loader for s in batch["token_index"]]
    for want, got in zip(expected, again):
        assert torch.equal(want, got[: want.shape[0]])


def test_distributed_sampler_splits_targets(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=32)
    seen = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=0)
        seen.append({dataset.ids[i] for i in sampler})
    assert seen[0] | seen[1] == set(dataset.ids)


def test_bad_options(sample_cache, tmp_path):
    with pytest.raises(ValueError, match="crop_size"):
        CacheDataset(sample_cache, crop_size=0)
    with pytest.raises(ValueError, match="on_error"):
        CacheDataset(sample_cache, on_error="ignore")
    with pytest.raises((ValueError, FileNotFoundError)):
        CacheDataset(tmp_path)


def test_follow_latest_generation_and_damaged_records(sample_cache, tmp_path):
    from featurecache.store.codec import CorruptRecordError
    from featurecache.store.publish import publish

    root = tmp_path / "shared-storage"
    first = publish(sample_cache, root)
    dataset = CacheDataset(root, crop_size=32, follow_latest=True)
    assert dataset.cache_dir == first and dataset.generation
    dataset.set_epoch(1)
    assert dataset.cache_dir == first
    second = publish(sample_cache, root)
    dataset.set_epoch(2)
    assert dataset.cache_dir == second and len(dataset) == 5

    # Damage one record of the newest generation in a copy: its read names key and shard.
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(second, damaged)
    for path in damaged.iterdir():
        path.chmod(0o644)
    probe = CacheDataset(damaged, crop_size=32)
    target = "2q2k"
    shard = probe.reader.where("features", target).rsplit("/", 1)[0]
    blob = probe.reader.get("features", target)
    data = bytearray(open(shard, "rb").read())
    offset = data.find(blob[100:160])
    assert offset > 0
    data[offset + 10] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    strict = CacheDataset(damaged, crop_size=32)
    with pytest.raises(CorruptRecordError, match="2q2k"):
        strict[strict.ids.index(target)]
    lenient = CacheDataset(damaged, crop_size=32, on_error="skip")
    sample = lenient[lenient.ids.index(target)]
    assert sample["id"] != target and lenient.skipped == 1


def test_one_sample_config_and_its_keywords(sample_cache):
    from featurecache.config import SampleConfig

    sample = SampleConfig(crop_size=40, msa_rows_per_sample=16, seed=5)
    dataset = CacheDataset(sample_cache, sample)
    assert dataset.sample == sample
    # keywords override the SampleConfig's fields; the same settings as keywords give the same sample
    overridden = CacheDataset(sample_cache, sample, seed=6)
    assert overridden.sample == SampleConfig(crop_size=40, msa_rows_per_sample=16, seed=6)
    by_keywords = CacheDataset(sample_cache, crop_size=40, msa_rows_per_sample=16, seed=5)
    assert by_keywords.sample == sample
    assert torch.equal(by_keywords[2]["msa"], dataset[2]["msa"])
    # old spellings belong to the command line and the TOML only: the Python API names the real ones
    for old in (dict(max_msa_rows=16), dict(spatial_crop_prob=0.5)):
        with pytest.raises(TypeError, match=f"{next(iter(old))}.*msa_rows_per_sample"):
            CacheDataset(sample_cache, **old)
    with pytest.raises(TypeError, match="crop_sise"):
        CacheDataset(sample_cache, crop_sise=40)
    for bad in (
        dict(crop_size=0),
        dict(msa_rows_per_sample=0),
        dict(crop_mode_probs=(0.5, 0.5, 0.5)),
        dict(crop_mode_probs=(0.5, 0.5)),
        dict(max_templates=-1),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SampleConfig(**bad)


def test_crop_mode_probs_default_to_af3s():
    from featurecache.config import SampleConfig, crop_mode_probs_from_spatial

    assert SampleConfig().crop_mode_probs == (0.2, 0.4, 0.4)  # AF3 SI 2.7
    # the train command's old --spatial-crop-prob P reads as (1 - P, P / 2, P / 2)
    assert crop_mode_probs_from_spatial(0.6) == pytest.approx((0.4, 0.3, 0.3))
    with pytest.raises(ValueError, match="spatial_crop_prob"):
        crop_mode_probs_from_spatial(1.5)
    with pytest.raises(TypeError, match="spatial_crop_prob"):
        SampleConfig(spatial_crop_prob=0.6)


@pytest.fixture(scope="module")
def template_cache(tmp_path_factory, shared_data):
    """A cache of OpenFold's 73-residue query with its HHR hits: 4 templates whose structures are
    in the sample folder (the sample structures' own hits have none there)."""
    import shutil

    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    root = tmp_path_factory.mktemp("templates")
    openfold = shared_data / "alignments" / "openfold"
    (root / "inputs").mkdir()
    (root / "alignments" / "query").mkdir(parents=True)  # OpenFold layout: hits beside the MSA
    shutil.copy(openfold / "short.fasta", root / "inputs")
    for name in ("bfd_uniclust_hits.a3m", "pdb70_hits.hhr"):
        shutil.copy(openfold / name, root / "alignments" / "query")
    summary = precompute(
        PrecomputeOptions(
            inputs=[root / "inputs"],
            cache_dir=root / "cache",
            alignments_dir=root / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            num_workers=1,
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    return root / "cache"


def test_templates_per_sample_come_from_the_manifest(template_cache, sample_cache):
    every = CacheDataset(template_cache, crop_size=None, max_templates=None, random_templates=False)
    (target,) = every.ids
    arrays, meta = every.load_arrays(target)
    # all six hits with resolved structures are stored (not four), and the FASTA target's
    # missing release date is a warning, since nothing could be filtered by date
    assert arrays["template_restype"].shape[0] == 6 == every.max_templates  # the manifest's count
    assert any("no release date" in note for note in meta["warnings"])
    assert CacheDataset(template_cache).max_templates == 4  # AF3's per-sample cap, below what is stored
    assert CacheDataset(sample_cache).max_templates == 0  # no template structures for these hits
    capped = CacheDataset(
        template_cache, crop_size=None, msa_rows_per_sample=4, max_templates=2, random_templates=False
    )
    assert capped.max_templates == 2
    first, all_rows = capped[0], every[0]
    for name in ("template_restype", "template_backbone_pos", "template_pseudo_beta_mask"):
        assert first[name].shape[0] == 2 and torch.equal(first[name], all_rows[name][:2]), name
    assert torch.all(first["template_count"] == 2) and torch.all(all_rows["template_count"] == 6)
    batch = collate([first], pad_to={"token": 80, "msa": capped.sample.msa_pool_rows, "template": capped.max_templates})
    assert batch["template_mask"].tolist() == [[True, True]]


def _stored_row(stored: dict, sample: dict, row: int) -> int:
    """The stored template that row `row` of a sample is (each stored row is a different hit)."""
    matches = [
        index
        for index in range(stored["template_restype"].shape[0])
        if torch.equal(sample["template_restype"][row], stored["template_restype"][index])
        and torch.equal(sample["template_backbone_pos"][row], stored["template_backbone_pos"][index])
    ]
    assert len(matches) == 1, f"sampled row {row} matches stored rows {matches}"
    return matches[0]


def test_sampled_templates_are_stored_ones_vary_by_epoch_and_repeat_by_seed(template_cache):
    stored = CacheDataset(template_cache, crop_size=None, max_templates=None, random_templates=False)[0]
    dataset = CacheDataset(template_cache, crop_size=None, seed=5)
    again = CacheDataset(template_cache, crop_size=None, seed=5)
    draws = []
    for epoch in range(16):
        sample = dataset[(epoch, 0)]
        count = sample["template_restype"].shape[0]
        assert count <= 4 and torch.all(sample["template_count"] == count)
        rows = [_stored_row(stored, sample, row) for row in range(count)]
        assert len(set(rows)) == count  # drawn without replacement
        draws.append(tuple(rows))
        repeat = again[(epoch, 0)]
        for name in ("template_restype", "template_pseudo_beta_pos", "template_count"):
            assert torch.equal(repeat[name], sample[name]), name
    assert len(set(draws)) >= 4  # the draw changes with the epoch
    assert max(len(rows) for rows in draws) == 4 and min(len(rows) for rows in draws) < 4  # AF3: a random count
    other_seed = [
        tuple(_stored_row(stored, s, r) for r in range(s["template_restype"].shape[0]))
        for s in (CacheDataset(template_cache, crop_size=None, seed=6)[(epoch, 0)] for epoch in range(16))
    ]
    assert other_seed != draws


def test_inference_takes_the_first_templates_and_crops_do_not_depend_on_templates(template_cache):
    stored = CacheDataset(template_cache, crop_size=None, max_templates=None, random_templates=False)[0]
    first = CacheDataset(template_cache, crop_size=None, random_templates=False)
    for epoch in range(3):
        sample = first[(epoch, 0)]
        assert [_stored_row(stored, sample, row) for row in range(4)] == [0, 1, 2, 3]
    # the template draw has its own random stream: the same crops with any template setting
    crops = [
        CacheDataset(template_cache, crop_size=30, seed=2, **options)[(1, 0)]["token_index"]
        for options in ({}, {"max_templates": None}, {"random_templates": False}, {"max_templates": 0})
    ]
    assert all(torch.equal(crop, crops[0]) for crop in crops)


def test_sampled_msa_equals_the_full_array_path(sample_cache):
    """The loader reads only the drawn rows (RowFrames) and assembles them for the kept tokens;
    the old path subsampled the dense record MSA with the same draws and then cropped its columns.
    Both give the same rows in the same order: query, homomer copies sharing rows, gaps and
    deletions (the sample data's MSAs carry no species: paired rows are checked in
    tests/features/test_msa.py)."""
    from featurecache.features.msa import expand_msa
    from featurecache.store.codec import RowFrames

    seed, epoch, rows_per_sample = 5, 2, 64
    dataset = CacheDataset(
        sample_cache, crop_size=96, msa_rows_per_sample=rows_per_sample, msa_cycle_draws=1, seed=seed
    )
    covered = {"deletions": 0, "gaps": 0, "lazy": 0}
    for index, target_id in enumerate(dataset.ids):
        arrays, _ = dataset.load_arrays(target_id)
        covered["lazy"] += isinstance(arrays["msa_block"], RowFrames)
        whole = {name: np.asarray(value) for name, value in arrays.items()}
        dense_msa, dense_deletions = expand_msa(whole)  # the record as schema v2 stored it
        sample = dataset[(epoch, index)]
        rng = np.random.default_rng([seed, epoch, index])
        depth = dense_msa.shape[0]
        rows = np.arange(depth)
        if depth > rows_per_sample:
            rows = np.concatenate(
                [[0], np.sort(rng.choice(np.arange(1, depth), size=rows_per_sample - 1, replace=False))]
            )
        kept = sample["token_index"].numpy()  # the crop's tokens (token_index keeps its values)
        np.testing.assert_array_equal(sample["msa"].numpy(), dense_msa[rows][:, kept])
        np.testing.assert_array_equal(sample["deletion_matrix"].numpy(), dense_deletions[rows][:, kept])
        np.testing.assert_array_equal(sample["msa_is_paired"].numpy(), whole["msa_is_paired"][rows])
        np.testing.assert_array_equal(sample["msa_species"].numpy(), whole["msa_species"][rows])
        covered["deletions"] += int((sample["deletion_matrix"] > 0).sum())
        covered["gaps"] += int((sample["msa"][1:] == GAP).sum())
    assert all(covered.values()), covered


def test_reference_conformers_are_augmented_per_sample(sample_cache):
    """ref_pos of two draws of one sample differ by a rigid motion per reference space (AF3 SI 2.8),
    the same (seed, epoch, index) gives the same bytes, and augment_conformers=False keeps the
    stored frame."""
    from tests.features.test_conformer_augmentation import assert_rigid_per_space

    dataset = CacheDataset(sample_cache, crop_size=None, msa_rows_per_sample=8, seed=4)
    stored = CacheDataset(sample_cache, crop_size=None, msa_rows_per_sample=8, seed=4, augment_conformers=False)
    index = dataset.ids.index("7a4d-assembly1")
    first, second = dataset[(0, index)], dataset[(1, index)]
    assert torch.equal(first["token_index"], second["token_index"])  # whole target: the same atoms
    uid, mask = first["ref_space_uid"].numpy(), first["ref_mask"].numpy()
    assert len(np.unique(uid)) > 1
    assert_rigid_per_space(first["ref_pos"].numpy(), second["ref_pos"].numpy(), uid, mask)
    # every space was drawn anew (its centre moves by N(0, 1 A) per draw), each its own motion:
    # one rigid motion of the whole sample would keep the distances between spaces too
    centres = [
        [draw["ref_pos"].numpy()[(uid == space) & mask].mean(axis=0) for space in np.unique(uid[mask])]
        for draw in (first, second)
    ]
    assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(*centres, strict=True))
    between = [np.linalg.norm(draw[0] - draw[1]) for draw in centres]
    assert abs(between[0] - between[1]) > 1e-3
    assert (
        first["ref_pos"].numpy().tobytes()
        == CacheDataset(sample_cache, crop_size=None, msa_rows_per_sample=8, seed=4)[(0, index)]["ref_pos"]
        .numpy()
        .tobytes()
    )
    arrays, _ = dataset.load_arrays(dataset.ids[index])
    np.testing.assert_array_equal(stored[(0, index)]["ref_pos"].numpy(), np.asarray(arrays["ref_pos"]))
    assert_rigid_per_space(np.asarray(arrays["ref_pos"]), first["ref_pos"].numpy(), uid, mask)
    # the symmetry permutations are found from the stored frame, so they do not change with the draw
    assert torch.equal(first["atom_permutations"], stored[(0, index)]["atom_permutations"])


def test_msa_rows_are_drawn_anew_per_recycling_cycle(sample_cache):
    """A deep MSA: each cycle's rows (msa_cycle_rows into the sample's pool) are a draw of their
    own, query first; a shallow one: every row in every cycle; the same seed, the same draws; and
    the first cycle's rows are the single draw of msa_cycle_draws=1."""
    dataset = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=16, seed=9)
    single = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=16, msa_cycle_draws=1, seed=9)
    depths = {target: dataset.load_arrays(target)[0]["msa_species"].shape[0] for target in dataset.ids}
    deep = max(depths, key=depths.get)
    shallow = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=depths[deep] + 5, seed=9)
    assert depths[deep] > 16 * 4
    index = dataset.ids.index(deep)
    sample = dataset[(0, index)]
    cycles = [sample["msa"][rows.long()] for rows in sample["msa_cycle_rows"]]
    assert (sample["msa_cycle_rows"] >= 0).all()
    assert all(torch.equal(rows[0], sample["msa"][0]) for rows in cycles)  # the query first in every cycle
    assert all(not torch.equal(cycles[0], other) for other in cycles[1:])
    assert sample["msa"].shape[0] > 16
    assert torch.equal(cycles[0], single[(0, index)]["msa"])
    assert torch.equal(sample["token_index"], single[(0, index)]["token_index"])  # the crop does not change
    again = CacheDataset(sample_cache, crop_size=64, msa_rows_per_sample=16, seed=9)[(0, index)]
    assert torch.equal(again["msa"], sample["msa"]) and torch.equal(again["msa_cycle_rows"], sample["msa_cycle_rows"])
    whole = shallow[(0, index)]
    depth = whole["msa"].shape[0]
    assert depth == depths[deep]
    for rows in whole["msa_cycle_rows"]:
        assert torch.equal(rows[:depth], torch.arange(depth, dtype=rows.dtype)) and (rows[depth:] == -1).all()
    batch = collate([sample, single[(0, index)] | {"msa_cycle_rows": sample["msa_cycle_rows"][:, :16]}])
    assert batch["msa_cycle_rows"].shape == (2, 4, 16)
