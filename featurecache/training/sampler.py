"""The order in which a run visits its samples: one global order per epoch, whatever the ranks.

Each epoch is a sequence of samples, a pure function of (seed, epoch): a shuffle of the targets
(EpochBatchSampler) or AF3's weighted draws of chains and interfaces (WeightedBatchSampler,
featurecache.sampler). An optimizer step takes the next `global_batch` = batch_size *
accumulate * world_size samples of that sequence; micro-batch g of the step (g = micro-step *
world_size + rank) is the step's samples g * batch_size ... g * batch_size + batch_size - 1, and
its random draws are seeded by g too (featurecache.training.loop.noise_generator). So a step
trains on the same samples with the same noise on 2 ranks as on 1 rank accumulating 2
micro-batches: a run's place is (epoch, samples of the epoch taken), independent of the number
of ranks, which is what a checkpoint stores and why a run resumes on any number of ranks.

An epoch has `samples_per_epoch` samples (one per target); an incomplete last step is dropped,
so no step straddles two epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from featurecache.sampler import Draw, SamplingTable


@dataclass(frozen=True)
class StepLayout:
    """How one optimizer step's samples are split over ranks and micro-steps."""

    batch_size: int = 1
    world_size: int = 1
    accumulate: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accumulate

    def slot(self, rank: int, micro_step: int) -> int:
        """The step's micro-batch number g of this rank's micro-step."""
        return micro_step * self.world_size + rank

    def steps_per_epoch(self, samples_per_epoch: int, start_sample: int = 0) -> int:
        """Whole steps left in an epoch from `start_sample` on."""
        return max(0, (samples_per_epoch - start_sample) // self.global_batch)


class _GlobalOrderSampler(torch.utils.data.Sampler):
    """This rank's micro-batches, step after step and epoch after epoch, from (start_epoch,
    start_sample); `epochs` epochs or without end. Subclasses give each epoch's order."""

    def __init__(self, samples_per_epoch: int, batch_size: int, rank: int, world_size: int, seed: int,
                 start_epoch: int = 0, start_sample: int = 0, epochs: int | None = None,
                 accumulate: int = 1) -> None:
        if samples_per_epoch == 0:
            raise ValueError("the dataset is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.samples_per_epoch = samples_per_epoch
        self.layout = StepLayout(batch_size, world_size, accumulate)
        self.rank = rank
        self.seed = seed
        self.start_epoch = start_epoch
        self.start_sample = start_sample
        self.epochs = epochs

    @property
    def steps_per_epoch(self) -> int:
        return self.layout.steps_per_epoch(self.samples_per_epoch)

    def epoch_order(self, epoch: int) -> list:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list]:
        layout, batch = self.layout, self.layout.batch_size
        epoch, first = self.start_epoch, self.start_sample
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            order = self.epoch_order(epoch)
            for step in range(layout.steps_per_epoch(self.samples_per_epoch, first)):
                start = first + step * layout.global_batch
                for micro in range(layout.accumulate):
                    offset = start + layout.slot(self.rank, micro) * batch
                    yield order[offset:offset + batch]
            epoch, first = epoch + 1, 0


class EpochBatchSampler(_GlobalOrderSampler):
    """Micro-batches of (epoch, index) pairs: each epoch a new shuffle of the targets, seeded by
    (seed, epoch). The epoch travels with each index, so the dataset's workers pick each epoch's
    crops without `set_epoch` and are started once per run, not once per epoch."""

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return [(epoch, index) for index in torch.randperm(self.samples_per_epoch, generator=generator).tolist()]


class WeightedBatchSampler(_GlobalOrderSampler):
    """Micro-batches of weighted Draws (a chain or interface by its AF3 weight, with
    replacement): an epoch is one draw per target, the seeded stream of SamplingTable.epoch_items,
    each Draw's position (which seeds its crop) being its place in that stream."""

    def __init__(self, table: SamplingTable, batch_size: int, rank: int, world_size: int, seed: int,
                 start_epoch: int = 0, start_sample: int = 0, epochs: int | None = None,
                 accumulate: int = 1) -> None:
        super().__init__(len(table.ids), batch_size, rank, world_size, seed, start_epoch, start_sample, epochs,
                         accumulate)
        self.table = table

    def epoch_order(self, epoch: int) -> list[Draw]:
        items = self.table.epoch_items(self.seed, epoch, self.samples_per_epoch)
        return [Draw(epoch, position, int(self.table.targets[item]), self.table.focus_chains[item])
                for position, item in enumerate(items.tolist())]
