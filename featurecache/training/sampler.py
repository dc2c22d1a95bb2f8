"""The order in which a run visits its samples, the same on resume: EpochBatchSampler (a
shuffle of the targets per epoch) and WeightedBatchSampler (AF3's weighted draws of chains and
interfaces, featurecache.sampler). Both count a run's place as (epoch, batch in the epoch),
which is what a checkpoint stores."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from featurecache.sampler import Draw, SamplingTable, WeightedSampler


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of (epoch, index) pairs, epoch after epoch, for one DataLoader that serves a run.

    Each epoch is a new shuffle, the same on every rank (seeded by seed and epoch); each rank
    takes every world_size-th index, padded by wrapping so that all ranks run the same number of
    steps, and an incomplete last batch is dropped, so no batch straddles two epochs. Iteration
    starts at (start_epoch, start_batch), which is how a resumed run skips what it already
    trained on without loading it, and runs on through later epochs (`epochs` of them, or without
    end). The epoch travels with each index, so the dataset's workers pick each epoch's crops
    without `set_epoch` and are started once per run, not once per epoch.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int, seed: int,
                 start_epoch: int = 0, start_batch: int = 0, epochs: int | None = None) -> None:
        if num_samples == 0:
            raise ValueError("the dataset is empty")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.start_epoch = start_epoch
        self.start_batch = start_batch
        self.epochs = epochs

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_samples / self.world_size) // self.batch_size

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's indices for one epoch, in order."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        per_rank = math.ceil(self.num_samples / self.world_size)
        order = (order * math.ceil(per_rank * self.world_size / self.num_samples))[: per_rank * self.world_size]
        return order[self.rank::self.world_size]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, first = self.start_epoch, self.start_batch
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            order = self.epoch_order(epoch)
            for batch in range(first, self.steps_per_epoch):
                yield [(epoch, index) for index in order[batch * self.batch_size:(batch + 1) * self.batch_size]]
            epoch, first = epoch + 1, 0


class WeightedBatchSampler(torch.utils.data.Sampler):
    """Batches of weighted Draws (a chain or interface by its AF3 weight, with replacement), epoch
    after epoch, for one DataLoader over a CacheDataset.

    An epoch is one draw per target over all ranks (as long as EpochBatchSampler's, so
    steps_per_epoch agree), each rank taking every world_size-th draw of the epoch's seeded
    stream: disjoint streams that depend on (seed, epoch) only, so a run resumes exactly at
    (start_epoch, start_batch). An incomplete last batch is dropped, as EpochBatchSampler does.
    """

    def __init__(self, table: SamplingTable, batch_size: int, rank: int, world_size: int, seed: int,
                 start_epoch: int = 0, start_batch: int = 0, epochs: int | None = None) -> None:
        self.draws = WeightedSampler(table, seed, rank, world_size)
        self.batch_size = batch_size
        self.start_epoch = start_epoch
        self.start_batch = start_batch
        self.epochs = epochs

    @property
    def steps_per_epoch(self) -> int:
        return self.draws.draws_per_rank // self.batch_size

    def __iter__(self) -> Iterator[list[Draw]]:
        epoch, first = self.start_epoch, self.start_batch
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            draws = self.draws.epoch_draws(epoch)
            for batch in range(first, self.steps_per_epoch):
                yield draws[batch * self.batch_size:(batch + 1) * self.batch_size]
            epoch, first = epoch + 1, 0
