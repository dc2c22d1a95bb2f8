"""AF3's weighted sampling of chains and interfaces (featurecache.sampler) and its training batches."""

import numpy as np
import pytest
import torch
from scipy import stats

from featurecache import CacheDataset
from featurecache.sampler import Draw, SamplingTable, WeightedSampler
from featurecache.training.sampler import WeightedBatchSampler


def _table() -> SamplingTable:
    """Three targets as a manifest lists them: chains and interfaces with AF3-like weights, and one
    target of a cache without clusters (a single item of its own weight)."""
    targets = {
        "a": {"weight": 7.5, "chains": [{"asym_id": 1, "weight": 0.5}, {"asym_id": 2, "weight": 1.0}],
              "interfaces": [{"chains": [1, 2], "weight": 6.0}]},
        "b": {"weight": 3.25, "chains": [{"asym_id": 1, "weight": 0.25}], "interfaces": [{"chains": [1, 3], "weight": 3.0}]},
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


def test_draw_frequencies_match_the_weights():
    table = _table()
    sampler = WeightedSampler(table, seed=1234, draws_per_epoch=100_000)
    items = {focus_target: index for index, focus_target in enumerate(zip(table.targets.tolist(), table.focus_chains))}
    counts = np.zeros(len(table))
    for draw in sampler:
        counts[items[(draw.target, draw.focus_chains)]] += 1
    assert counts.sum() == 100_000
    expected = table.probabilities * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # the test has power: uniform draws over the items are rejected outright
    assert stats.chisquare(counts, np.full(len(table), counts.sum() / len(table))).pvalue < 1e-12


def test_ranks_take_disjoint_draws_of_one_stream_and_resume_exactly():
    table = _table()
    whole = list(WeightedSampler(table, seed=5, draws_per_epoch=40, epochs=2))
    ranks = [list(WeightedSampler(table, seed=5, rank=rank, world_size=3, draws_per_epoch=40, epochs=2))
             for rank in range(3)]
    # 40 draws over 3 ranks: 14 each (the stream runs on to 42), positions disjoint, the same items
    assert all(len(draws) == 28 for draws in ranks)
    positions = [{(d.epoch, d.position) for d in draws} for draws in ranks]
    assert not (positions[0] & positions[1]) and not (positions[1] & positions[2])
    by_position = {(d.epoch, d.position): d for draws in ranks for d in draws}
    assert all(by_position[(d.epoch, d.position)] == d for d in whole)
    # resuming at (epoch 1, 3 draws taken) continues the same sequence
    resumed = list(WeightedSampler(table, seed=5, rank=1, world_size=3, draws_per_epoch=40, start_epoch=1,
                                   start_draw=3, epochs=1))
    assert resumed == ranks[1][14 + 3:]
    assert list(WeightedSampler(table, seed=6, draws_per_epoch=40)) != whole[:40]  # the seed matters


def test_batches_resume_where_they_stopped():
    table = _table()
    stream = iter(WeightedBatchSampler(table, 2, 0, 1, seed=3))
    batches = [next(stream) for _ in range(7)]
    assert WeightedBatchSampler(table, 2, 0, 1, seed=3).steps_per_epoch == 1  # 3 targets: one draw each
    assert all(isinstance(draw, Draw) and len(batch) == 2 for batch in batches for draw in batch)
    assert [batch[0].epoch for batch in batches] == list(range(7))
    again = iter(WeightedBatchSampler(table, 2, 0, 1, seed=3, start_epoch=4))
    assert [next(again) for _ in range(3)] == batches[4:]


def test_dataset_reads_draws_around_their_chains(sample_cache):
    dataset = CacheDataset(sample_cache, crop_size=32, msa_rows_per_sample=8, seed=2)
    assert dataset.has_cluster_weights
    table = dataset.sampling_table
    # a target's items add up to the manifest's target weight
    for index, target_id in enumerate(dataset.ids):
        assert table.weights[table.targets == index].sum() == pytest.approx(float(dataset.sample_weights[index]))
    draws = list(WeightedSampler(table, seed=0, draws_per_epoch=12))
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
