"""A run's data: the dataset its config names, one DataLoader over it, batches on the device."""

from __future__ import annotations

import functools
import pathlib

import numpy as np
import torch

from featurecache.loader import CacheDataset, collate
from featurecache.training.config import TrainConfig, TrainSetupError
from featurecache.training.distributed import Dist
from featurecache.training.interrupt import ignore_stop_signals
from featurecache.sampler import EpochBatchSampler, WeightedSampler

# The stream of the seeded draw of --validation-fraction's targets (apart from every other draw).
VALIDATION_SPLIT_STREAM = 0x5E1EC7


def _setup_error(option: str, value, error: Exception) -> TrainSetupError:
    """One line naming the option, its value (unless the message already does) and the problem."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    text = " ".join(str(text).split())
    return TrainSetupError(f"{option}: {text}" if str(value) in text else f"{option} {value}: {text}")


def build_datasets(config: TrainConfig) -> tuple[torch.utils.data.Dataset, CacheDataset | None]:
    """The training dataset (the cache, or raw files with --online) and the held-out validation
    targets (None without them), which training never samples. A folder that is not a cache, or
    a validation key it lacks, is a TrainSetupError naming it."""
    if config.cache is None:
        if config.validation_keys or config.validation_fraction:
            raise TrainSetupError("validation reads held-out targets of a cache: not available with --online")
        from featurecache.online import OnlineDataset  # parsers and featurization: only when asked for

        try:
            return OnlineDataset(config.online, config.alignments, config.template_dir, config.sample), None
        except (OSError, ValueError) as error:
            raise _setup_error("--online", config.online, error) from None
    dataset = _cache_dataset(config)
    held_out = held_out_keys(dataset.ids, config)
    if not held_out:
        return dataset, None
    if len(held_out) == len(dataset):
        raise TrainSetupError(f"--cache {config.cache}: every target is held out for validation, none left to train on")
    training = _cache_dataset(config, ids=[key for key in dataset.ids if key not in held_out])
    return training, _cache_dataset(config, ids=sorted(held_out))


def _cache_dataset(config: TrainConfig, ids: list[str] | None = None) -> CacheDataset:
    try:
        dataset = CacheDataset(pathlib.Path(config.cache), config.sample, ids=ids)
    except (OSError, ValueError, KeyError) as error:
        raise _setup_error("--cache", config.cache, error) from None
    if len(dataset) == 0:
        raise TrainSetupError(f"--cache {config.cache}: the cache holds no feature records to train on")
    return dataset


def held_out_keys(ids: list[str], config: TrainConfig) -> set[str]:
    """The validation targets: the --validation-keys (each must be in the cache), or a seeded
    --validation-fraction of the targets (at least one), the same on every rank and resume."""
    if config.validation_keys:
        unknown = sorted(set(config.validation_keys) - set(ids))
        if unknown:
            raise TrainSetupError(f"--validation-keys: not in the cache {config.cache}: {' '.join(unknown[:10])}")
        return set(config.validation_keys)
    if not config.validation_fraction:
        return set()
    count = max(1, round(config.validation_fraction * len(ids)))
    order = np.random.default_rng([config.sample.seed, VALIDATION_SPLIT_STREAM]).permutation(len(ids))
    return {sorted(ids)[index] for index in order[:count]}


def make_batch_sampler(
    dataset, config: TrainConfig, world: Dist, start_epoch: int = 0, start_sample: int = 0, epochs: int | None = None
) -> EpochBatchSampler | WeightedSampler:
    """This rank's micro-batches from (start_epoch, start_sample: samples of the epoch taken by
    all ranks) on: AF3's weighted draws of chains and interfaces when the cache's manifest
    weighs them (precompute's clustering), else a shuffle of the targets per epoch. Both have
    one sample per target per epoch."""
    position = dict(start_epoch=start_epoch, start_sample=start_sample, epochs=epochs, accumulate=config.accumulate)
    if getattr(dataset, "has_cluster_weights", False):
        try:
            table = dataset.sampling_table
        except ValueError as error:
            raise _setup_error("--cache", config.cache, error) from None
        return WeightedSampler(table, config.batch_size, world.rank, world.world_size, config.sample.seed, **position)
    return EpochBatchSampler(
        len(dataset), config.batch_size, world.rank, world.world_size, config.sample.seed, **position
    )


def make_loader(
    dataset,
    batch_sampler: EpochBatchSampler | WeightedSampler,
    config: TrainConfig,
    device: torch.device,
    pad_to: list[dict[str, int]] | None = None,
) -> torch.utils.data.DataLoader:
    """A DataLoader over `batch_sampler`'s batches, each padded to the first of the `pad_to`
    buckets that holds it (training/buckets.py's padding_buckets) if given. Its workers ignore
    SIGINT and SIGTERM: the main process stops the run (training/interrupt.py)."""
    extra = {}
    if config.num_workers > 0:
        extra["prefetch_factor"] = config.prefetch_factor
        extra["worker_init_fn"] = ignore_stop_signals
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
