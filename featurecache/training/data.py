"""A run's data: the dataset its config names, one DataLoader over it, batches on the device."""

from __future__ import annotations

import functools
import pathlib

import torch

from featurecache.loader import CacheDataset, collate
from featurecache.training.config import ATOMS_PER_TOKEN_BOUND, BONDS_PER_TOKEN_BOUND, TrainConfig, TrainSetupError
from featurecache.training.distributed import Dist
from featurecache.training.sampler import EpochBatchSampler, WeightedBatchSampler


def _setup_error(option: str, value, error: Exception) -> TrainSetupError:
    """One line naming the option, its value (unless the message already does) and the problem."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    text = " ".join(str(text).split())
    return TrainSetupError(f"{option}: {text}" if str(value) in text else f"{option} {value}: {text}")


def build_dataset(config: TrainConfig) -> torch.utils.data.Dataset:
    """The cache (or raw files, with --online) the run reads; a folder that is not one is a
    TrainSetupError naming it and what is wrong."""
    if config.cache is not None:
        try:
            dataset = CacheDataset(pathlib.Path(config.cache), config.sample)
        except (OSError, ValueError, KeyError) as error:
            raise _setup_error("--cache", config.cache, error) from None
        if len(dataset) == 0:
            raise TrainSetupError(f"--cache {config.cache}: the cache holds no feature records to train on")
        return dataset
    from featurecache.online import OnlineDataset  # parsers and featurization: only when asked for

    try:
        return OnlineDataset(config.online, config.alignments, config.template_dir, config.sample)
    except (OSError, ValueError) as error:
        raise _setup_error("--online", config.online, error) from None


def fixed_sizes(config: TrainConfig, dataset) -> dict[str, int] | None:
    """With fixed shapes, the size each padded axis of every batch gets (collate's `pad_to`):
    the crop size, the sample's MSA rows, the most templates a sample holds, and bounds on the
    atoms and token bonds a crop can hold; else None."""
    if not config.fixed_shapes:
        return None
    try:
        templates = dataset.max_templates
    except ValueError as error:
        raise _setup_error("--cache", config.cache, error) from None
    crop = config.sample.crop_size
    return {"token": crop, "msa": config.sample.msa_rows_per_sample, "template": templates,
            "atom": crop * ATOMS_PER_TOKEN_BOUND, "token_bond": crop * BONDS_PER_TOKEN_BOUND}


def make_batch_sampler(dataset, config: TrainConfig, world: Dist, start_epoch: int = 0, start_batch: int = 0,
                       epochs: int | None = None) -> EpochBatchSampler | WeightedBatchSampler:
    """This rank's batches from (start_epoch, start_batch) on: AF3's weighted draws of chains and
    interfaces when the cache's manifest weighs them (precompute's clustering), else a shuffle
    of the targets per epoch. Both have the same steps per epoch."""
    if getattr(dataset, "has_cluster_weights", False):
        try:
            table = dataset.sampling_table
        except ValueError as error:
            raise _setup_error("--cache", config.cache, error) from None
        return WeightedBatchSampler(table, config.batch_size, world.rank, world.world_size, config.sample.seed,
                                    start_epoch=start_epoch, start_batch=start_batch, epochs=epochs)
    return EpochBatchSampler(len(dataset), config.batch_size, world.rank, world.world_size, config.sample.seed,
                             start_epoch=start_epoch, start_batch=start_batch, epochs=epochs)


def make_loader(dataset, batch_sampler: EpochBatchSampler | WeightedBatchSampler, config: TrainConfig,
                device: torch.device,
                pad_to: dict[str, int] | None = None) -> torch.utils.data.DataLoader:
    """A DataLoader over `batch_sampler`'s batches, padded to `pad_to` (see fixed_sizes) if given."""
    extra = {}
    if config.num_workers > 0:
        extra["prefetch_factor"] = config.prefetch_factor
    collate_fn = collate if pad_to is None else functools.partial(collate, pad_to=pad_to)
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=config.num_workers,
        collate_fn=collate_fn,
        pin_memory=device.type == "cuda",
        **extra,
    )


def to_device(batch: dict, device: torch.device) -> dict:
    return {
        name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for name, value in batch.items()
    }
