"""AF3's weighted sampling of chains and interfaces (featurecache.sampler): the draws, their split
over ranks and micro-batches, and resuming."""

import numpy as np
import pytest
import torch
from scipy import stats

from featurecache import CacheDataset
from featurecache.sampler import Draw, SamplingTable, WeightedSampler
from featurecache.store.manifest import SAMPLING_TABLE, read_manifest


def _table() -> SamplingTable:
    """Three targets as a manifest lists them: chains and interfaces with AF3-like weights, and one
    target of a cache without clusters (a single item of its own weight)."""
    targets = {
        "a": {
            "weight": 7.5,
            "chains": [{"asym_id": 1, "weight": 0.5}, {"asym_id": 2, "weight": 1.0}],
            "interfaces": [{"chains": [1, 2], "weight": 6.0}],
        },
        "b": {
            "weight": 3.25,
            "chains": [{"asym_id": 1, "weight": 0.25}],
            "interfaces": [{"chains": [1, 3], "weight": 3.0}],
        },
        "c": {"weight": 2.0},
    }
    return SamplingTable.from_targets(sorted(targets), targets)


def test_table_lists_every_chain_and_interface():
    table = _table()
    assert table.focus_chains == ((1,), (2,), (1, 2), (1,), (1, 3), ())
    assert table.targets.tolist() == [0, 0, 0, 1, 1, 2]
    assert table.weights.tolist() == [0.5, 1.0, 6.0, 0.25, 3.0, 2.0]
    with pytest.raises(ValueError, match="no positive sampling weights"):
        SamplingTable.from_targets(["a"], {"a": {"weight": 0.0}})


def _draws(sampler) -> list[Draw]:
    return [draw for batch in sampler for draw in batch]


def test_draw_frequencies_match_the_weights():
    table = _table()
    sampler = WeightedSampler(table, seed=1234, samples_per_epoch=100_000, epochs=1)
    items = {focus_target: index for index, focus_target in enumerate(zip(table.targets.tolist(), table.focus_chains))}
    counts = np.zeros(len(table))
    for draw in _draws(sampler):
        counts[items[(draw.target, draw.focus_chains)]] += 1
    assert counts.sum() == 100_000
    expected = table.probabilities * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # the test has power: uniform draws over the items are rejected outright
    assert stats.chisquare(counts, np.full(len(table), counts.sum() / len(table))).pvalue < 1e-12


def test_ranks_take_disjoint_micro_batches_of_one_stream_and_resume_exactly():
    table = _table()
    whole = _draws(WeightedSampler(table, seed=5, samples_per_epoch=40, epochs=2))
    ranks = [
        list(WeightedSampler(table, batch_size=2, rank=rank, world_size=3, seed=5, samples_per_epoch=40, epochs=2))
        for rank in range(3)
    ]
    # 40 draws in steps of 3 ranks x 2: 6 whole steps an epoch (the last 4 draws dropped), 12 draws per rank
    assert all(sum(len(batch) for batch in batches) == 24 for batches in ranks)
    # step s of rank r holds the stream's draws 6 s + 2 r, 6 s + 2 r + 1: disjoint, the same items
    for rank, batches in enumerate(ranks):
        for index, batch in enumerate(batches):
            epoch, step = divmod(index, 6)
            first = epoch * 40 + 6 * step + 2 * rank
            assert batch == whole[first : first + 2]
    # one rank accumulating 3 micro-batches takes the step's draws in the same slots
    accumulating = list(WeightedSampler(table, batch_size=2, accumulate=3, seed=5, samples_per_epoch=40, epochs=1))
    assert accumulating[:3] == [ranks[0][0], ranks[1][0], ranks[2][0]]
    # resuming at (epoch 1, 12 samples taken over all ranks) continues the same sequence
    resumed = list(
        WeightedSampler(
            table,
            batch_size=2,
            rank=1,
            world_size=3,
            seed=5,
            samples_per_epoch=40,
            start_epoch=1,
            start_sample=12,
            epochs=1,
        )
    )
    assert resumed == ranks[1][6 + 2 :]
    assert _draws(WeightedSampler(table, seed=6, samples_per_epoch=40, epochs=1)) != whole[:40]  # the seed matters
    with pytest.raises(ValueError, match="rank 3 is not in 0..2"):
        WeightedSampler(table, rank=3, world_size=3)


def test_batches_resume_where_they_stopped():
    table = _table()
    stream = iter(WeightedSampler(table, 2, 0, 1, seed=3))
    batches = [next(stream) for _ in range(7)]
    assert WeightedSampler(table, 2, 0, 1, seed=3).steps_per_epoch == 1  # 3 targets: one draw each
    assert all(isinstance(draw, Draw) and len(batch) == 2 for batch in batches for draw in batch)
    assert [batch[0].epoch for batch in batches] == list(range(7))
    again = iter(WeightedSampler(table, 2, 0, 1, seed=3, start_epoch=4))
    assert [next(again) for _ in range(3)] == batches[4:]


def test_dataset_reads_draws_around_their_chains(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=32, msa_rows_per_sample=8, seed=2)
    assert dataset.has_cluster_weights
    table = dataset.sampling_table
    # a target's items add up to the manifest's target weight
    targets = read_manifest(sample_cache).index[SAMPLING_TABLE]
    for index, target_id in enumerate(dataset.ids):
        assert table.weights[table.targets == index].sum() == pytest.approx(targets[target_id]["weight"])
    draws = _draws(WeightedSampler(table, seed=0, samples_per_epoch=12, epochs=1))
    for draw in draws:
        sample = dataset[draw]
        assert sample["id"] == dataset.ids[draw.target]
        if sample["crop_mode"] in ("spatial", "spatial_interface"):
            # the centre is a token of the sampled chains, so the crop holds one of them
            assert np.isin(sample["asym_id"].numpy(), draw.focus_chains).any(), draw
    # the crop is seeded by the draw's position, so two draws of one target crop differently
    first = dataset[Draw(0, 0, 3, (1,))]["token_index"]
    assert torch.equal(first, dataset[Draw(0, 0, 3, (1,))]["token_index"])
    assert any(not torch.equal(first, dataset[Draw(0, position, 3, (1,))]["token_index"]) for position in range(1, 6))
