"""Training-time access to a cache: CacheDataset (crop + MSA subsample per sample) and collate.

Records are read from the LMDB shards without parsing anything: one LMDB lookup, one msgpack
decode, numpy views over the stored bytes, then a crop. The LMDB environments are opened lazily
in each process, so DataLoader workers work with both fork and spawn.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from featurecache.config import CROP_MODES, SampleConfig
from featurecache.features import crop as cropping
from featurecache.features.conformer_augmentation import augment_reference_conformers
from featurecache.features.msa import expand_msa
from featurecache.features.symmetry import atom_permutations
from featurecache.features.templates import sample_templates
from featurecache.sampler import Draw, SamplingTable
from featurecache.schema import FEATURES, FEATURES_BY_NAME, FEATURES_TABLE, GAP, LOAD_TIME_FEATURES, SAMPLE_FEATURES
from featurecache.store.codec import CorruptRecordError
from featurecache.store.manifest import read_manifest
from featurecache.store.publish import resolve_generation
from featurecache.store.reader import StoreReader

log = logging.getLogger(__name__)

# Fourth seed word of the draws that have their own stream (crops and MSA rows use three words).
_TEMPLATE_STREAM = 1
_CONFORMER_STREAM = 2
_MSA_CYCLE_STREAM = 3  # the MSA row sets of recycling cycles after the first

# Padding value per array in `collate`; everything not listed pads with zeros / False.
_PAD_VALUES = {
    "msa": GAP,
    "template_restype": GAP,
    "restype": GAP,
    **{spec.name: -1 for spec in SAMPLE_FEATURES if spec.points_to and spec.name != "atom_to_token"},
}

# Axes that `collate` pads to the largest size in the batch, and the mask it adds for each.
_PAD_MASKS = {
    "token": ("token_pad_mask", "restype"),
    "atom": ("atom_pad_mask", "atom_to_token"),
    "token_bond": ("token_bond_mask", "token_bonds"),
    "msa": ("msa_row_mask", "msa_species"),
    "template": ("template_mask", "template_pseudo_beta_mask"),
}


def _to_torch(name: str, value: np.ndarray) -> torch.Tensor:
    """Integer classes become long (embedding indices), counts become float, the rest as stored."""
    if name == "deletion_matrix":
        return torch.from_numpy(value.astype(np.float32))
    if value.dtype == np.bool_:
        return torch.from_numpy(np.array(value))  # records are read-only views: copy
    if np.issubdtype(value.dtype, np.integer):
        return torch.from_numpy(value.astype(np.int64))
    return torch.from_numpy(np.array(value, dtype=np.float32))


def sample_config(sample: SampleConfig | None, settings: Mapping[str, Any], owner: str) -> SampleConfig:
    """`sample` (or the defaults) with the keyword `settings` a dataset was given applied."""
    if sample is not None and not isinstance(sample, SampleConfig):
        raise TypeError(f"{owner}: sample must be a SampleConfig, got {sample!r} (give crop_size=... as a keyword)")
    known = {field.name for field in dataclasses.fields(SampleConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"{owner}: unknown keyword arguments {unknown}, sample settings are {sorted(known)}")
    return dataclasses.replace(sample or SampleConfig(), **settings)


def stored_templates(manifest_targets: Mapping[str, Mapping[str, Any]], where: pathlib.Path) -> int:
    """The most templates any record of a cache holds, from its manifest's index entries."""
    counts = [entry.get("num_templates") for entry in manifest_targets.values()]
    if any(count is None for count in counts):
        raise ValueError(
            f"{where}: the manifest does not count templates per target (an older cache); "
            "give max_templates explicitly or rebuild the cache"
        )
    return max(counts, default=0)


class CacheDataset(torch.utils.data.Dataset):
    """Map-style dataset over the feature records of a cache (or a published generation).

    Each item is one target cut as `sample` (a SampleConfig) says: cropped to `crop_size` tokens
    (contiguous, spatial or spatial interface, AF3's recipe, as `crop_mode_probs` says), with
    `msa_cycle_draws` draws of at most `msa_rows_per_sample` MSA rows each, query first (their
    union in msa, each draw's rows in msa_cycle_rows) and, per chain, up to `max_templates` of
    the templates its record stores (drawn at random, or the first ones with
    `random_templates=False`). The sample settings may also be given as keywords
    (`CacheDataset(path, crop_size=256, seed=1)`), which override those of `sample`. The crop
    changes with the epoch: call `set_epoch`
    (DistributedSampler users already do this for the sampler) so that every epoch sees new
    crops, reproducibly per seed, or index with (epoch, index) pairs, as featurecache.training's
    batch sampler does, so that long-lived workers need no set_epoch.
    """

    def __init__(
        self,
        cache_dir: str | pathlib.Path,
        sample: SampleConfig | None = None,
        *,
        min_tokens: int = 0,
        max_tokens: int | None = None,
        ids: Sequence[str] | None = None,
        on_error: str = "raise",
        follow_latest: bool = False,
        **sample_settings,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.sample = sample_config(sample, sample_settings, "CacheDataset")
        self.source = pathlib.Path(cache_dir)
        self.follow_latest = follow_latest
        self.on_error = on_error
        self.epoch = 0
        self.skipped = 0
        self._filters = (set(ids) if ids is not None else None, min_tokens, max_tokens)
        self._reader: StoreReader | None = None
        self._open_generation(resolve_generation(self.source))

    def _open_generation(self, cache_dir: pathlib.Path) -> None:
        """Index the targets of one finished cache or published generation."""
        wanted, min_tokens, max_tokens = self._filters
        manifest = read_manifest(cache_dir)
        targets = manifest.targets
        if wanted is not None:
            unknown = sorted(wanted - set(targets))
            if unknown:
                raise KeyError(f"{cache_dir}: targets not in the cache: {unknown[:10]}")
        self.cache_dir = cache_dir
        self.generation = manifest.generation
        self.num_shards = manifest.num_shards
        self.ids = [
            target_id
            for target_id, info in sorted(targets.items())
            if (wanted is None or target_id in wanted)
            and info["num_tokens"] >= min_tokens
            and (max_tokens is None or info["num_tokens"] <= max_tokens)
        ]
        self._info = {target_id: targets[target_id] for target_id in self.ids}
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @property
    def reader(self) -> StoreReader:
        if self._reader is None:
            self._reader = StoreReader(self.cache_dir, num_shards=self.num_shards)
        return self._reader

    def __getstate__(self):
        # The reader holds LMDB handles: each process opens its own.
        state = dict(self.__dict__)
        state["_reader"] = None
        return state

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def sampling_table(self) -> SamplingTable:
        """Every chain and interface of these targets with its AF3 weight, for the WeightedSampler
        (featurecache.sampler), whose Draws this dataset reads."""
        return SamplingTable.from_targets(self.ids, self._info)

    @property
    def has_cluster_weights(self) -> bool:
        """Whether the manifest weighs chains and interfaces (precompute ran its clustering)."""
        return any("chains" in self._info[target_id] for target_id in self.ids)

    @property
    def max_templates(self) -> int:
        """Template rows a sample holds at most: the sample's max_templates, capped by the most any
        of these records stores (precompute's count, from the manifest)."""
        cap = self.sample.max_templates
        try:
            stored = stored_templates(self._info, self.cache_dir)
        except ValueError:
            if cap is None:
                raise
            return cap  # an older manifest without counts: the sample's cap bounds it anyway
        return stored if cap is None else min(cap, stored)

    def num_tokens(self, index: int) -> int:
        return int(self._info[self.ids[index]]["num_tokens"])

    @property
    def max_atoms(self) -> int | None:
        """Atoms the largest of these targets holds (the manifest's index), so no crop of them holds
        more; None for a manifest without atom counts, or when later generations may hold more."""
        counts = [self._info[target_id].get("num_atoms") for target_id in self.ids]
        if self.follow_latest or not counts or None in counts:
            return None
        return int(max(counts))

    @property
    def target_sizes(self) -> list[tuple[int, int]] | None:
        """(tokens, atoms) of every target (the manifest's index), from which the atom axes of padded
        batches are chosen; None where max_atoms is None."""
        if self.max_atoms is None:
            return None
        return [(int(self._info[key]["num_tokens"]), int(self._info[key]["num_atoms"])) for key in self.ids]

    def set_epoch(self, epoch: int) -> None:
        """New crops for a new epoch; with `follow_latest`, also switch to the newest generation.

        Switching changes `ids` and the length: build the sampler (and DataLoader iterator)
        after calling this, as a per-epoch training loop does anyway.
        """
        self.epoch = epoch
        if self.follow_latest:
            newest = resolve_generation(self.source)
            if newest != self.cache_dir:
                log.info("switching from %s to the newest generation %s", self.cache_dir, newest)
                self._open_generation(newest)

    def load_arrays(self, target_id: str) -> tuple[dict[str, np.ndarray], dict]:
        """The whole, uncropped record of one target (schema.RECORD_ARRAYS; msa_block a
        store.codec.RowFrames, which decodes the rows it is indexed with)."""
        record = self.reader.get_record(FEATURES_TABLE, target_id, lazy_rows=True)
        if record is None:
            raise KeyError(f"{self.cache_dir}: no features record for target {target_id!r}")
        return record.arrays, record.meta

    def __getitem__(self, item: int | tuple[int, int] | Draw) -> dict:
        """One cropped sample; `item` is an index (crops of the current epoch), an (epoch, index)
        pair, or a weighted sampler's Draw (its target, cropped around its chain or interface,
        with crops seeded by its position in the epoch). A damaged record raises
        CorruptRecordError (naming key, shard and generation) or, with on_error="skip", is
        counted in `skipped` (per worker process) and replaced by the next intact record."""
        focus_chains: tuple[int, ...] = ()
        if isinstance(item, Draw):
            epoch, seed_index, index, focus_chains = item
        else:
            epoch, index = item if isinstance(item, tuple) else (self.epoch, item)
            seed_index = None
        for offset in range(len(self)):
            position = (index + offset) % len(self)
            target_id = self.ids[position]
            try:
                arrays, meta = self.load_arrays(target_id)
            except CorruptRecordError:
                if self.on_error == "raise":
                    raise
                self.skipped += 1
                log.warning(
                    "skipping damaged record %s in %s (%d skipped so far)", target_id, self.cache_dir, self.skipped
                )
                continue
            focus = focus_chains if offset == 0 else ()  # a replacement record has other chains
            return crop_sample(
                target_id,
                arrays,
                self.sample,
                epoch,
                position if seed_index is None else seed_index,
                focus,
                resolution=meta.get("resolution"),
            )
        raise CorruptRecordError(None, str(self.cache_dir), f"all {len(self)} records are damaged")


def crop_sample(
    target_id: str,
    arrays: dict[str, np.ndarray],
    sample: SampleConfig,
    epoch: int,
    index: int,
    focus_chains: tuple[int, ...] = (),
    resolution: float | None = None,
) -> dict:
    """One training sample from a whole record (or the same arrays with a dense msa /
    deletion_matrix), drawn from (seed, epoch, index): MSA rows subsampled, templates sampled per chain, tokens cropped in a mode drawn by
    `crop_mode_probs` around `focus_chains` (the asym_ids of the sampled chain or interface),
    arrays as torch tensors, ref_pos centred, rotated and translated per reference space
    (`augment_conformers`, AF3 SI 2.8). "crop_mode" names the mode ("none": the target fits whole);
    "resolution" is the record's (Angstrom; NaN where it has none), for the confidence losses."""
    rng = np.random.default_rng([sample.seed, epoch, index])
    msa_rows, cycle_rows = cropping.msa_cycle_rows(
        arrays["msa_species"].shape[0],
        sample.msa_rows_per_sample,
        sample.msa_cycle_draws,
        rng,
        np.random.default_rng([sample.seed, epoch, index, _MSA_CYCLE_STREAM]),
    )
    arrays = dict(arrays, msa_species=arrays["msa_species"][msa_rows], msa_is_paired=arrays["msa_is_paired"][msa_rows])
    if "msa_block" not in arrays:  # dense msa / deletion_matrix (benchmarks/loader.py's npy.gz layout)
        arrays["msa"], arrays["deletion_matrix"] = arrays["msa"][msa_rows], arrays["deletion_matrix"][msa_rows]
    # Templates draw from their own stream, so the crop of a (seed, epoch, index) does not depend
    # on how many templates a record stores.
    template_rng = np.random.default_rng([sample.seed, epoch, index, _TEMPLATE_STREAM])
    arrays = sample_templates(arrays, sample.max_templates, template_rng if sample.random_templates else None)
    num_tokens = arrays["restype"].shape[0]
    crop_size, mode = sample.crop_size, "none"
    if crop_size is not None and num_tokens > crop_size:
        mode = CROP_MODES[int(rng.choice(len(CROP_MODES), p=sample.crop_mode_probs))]
        token_indices = cropping.crop_tokens(arrays, mode, crop_size, rng, tuple(focus_chains))
        arrays = cropping.crop_arrays(arrays, token_indices)
    if "msa_block" in arrays:  # a record: only the drawn rows, in the kept tokens' columns, are read
        arrays["msa"], arrays["deletion_matrix"] = expand_msa(arrays, msa_rows)
    permutations = atom_permutations(arrays)  # from the stored frame: its symmetry cache keys on ref_pos
    if sample.augment_conformers:
        conformer_rng = np.random.default_rng([sample.seed, epoch, index, _CONFORMER_STREAM])
        arrays["ref_pos"] = augment_reference_conformers(
            arrays["ref_pos"],
            arrays["ref_space_uid"],
            arrays["ref_mask"],
            conformer_rng,
            sample.conformer_translation_std,
        )
    sample = {name: _to_torch(name, arrays[name]) for name in FEATURES_BY_NAME}
    sample["atom_permutations"] = _to_torch("atom_permutations", permutations)
    sample["msa_cycle_rows"] = _to_torch("msa_cycle_rows", cycle_rows)
    sample["id"] = target_id
    sample["crop_mode"] = mode
    sample["resolution"] = torch.tensor(math.nan if resolution is None else float(resolution), dtype=torch.float32)
    return sample


def _pad_to(tensor: torch.Tensor, axes: Iterable[tuple[int, int]], value) -> torch.Tensor:
    """Pad `tensor` at the end of each (dim, size) pair to that size."""
    shape = list(tensor.shape)
    for dim, size in axes:
        shape[dim] = size
    if list(tensor.shape) == shape:
        return tensor
    out = torch.full(shape, value, dtype=tensor.dtype)
    out[tuple(slice(0, s) for s in tensor.shape)] = tensor
    return out


def _largest_along_axes(samples: list[dict], specs) -> dict[str, tuple[int, str, str]]:
    """Per named axis, the largest size any sample has along it: (size, array, target id)."""
    largest: dict[str, tuple[int, str, str]] = {}
    for spec in specs:
        for dim, axis in enumerate(spec.axes):
            if isinstance(axis, str):
                sample = max(samples, key=lambda s: s[spec.name].shape[dim])
                size = sample[spec.name].shape[dim]
                if size > largest.get(axis, (-1,))[0]:
                    largest[axis] = (size, spec.name, sample["id"])
    return largest


def collate(samples: list[dict], pad_to: Mapping[str, int] | Sequence[Mapping[str, int]] | None = None) -> dict:
    """Stack samples into a batch, padding token / atom / msa / template axes to the batch max.

    Adds `token_pad_mask` [B, N], `atom_pad_mask` [B, A], `token_bond_mask` [B, E],
    `msa_row_mask` [B, M] and `template_mask` [B, T] (True = real), and `id` (list of target
    ids) and `resolution` [B] float32 (NaN where unknown, as for a sample built without one).
    Index arrays (schema `points_to`: token_bonds, frame / distogram atom indices) pad with -1.

    `pad_to` ({axis: size}, e.g. {"token": 384, "msa": 1024, "template": 4}) pads those axes to a
    fixed size instead, so every batch has the same shapes (torch.compile then never recompiles,
    and a step can be captured as a CUDA graph); a sample larger than its axis's size is an error.
    A list of such mappings (buckets, smallest first) pads each batch to the first that holds it,
    so batches take one of a few shapes; a batch no bucket holds is an error.
    """
    if not samples:
        raise ValueError("collate got an empty list of samples")
    buckets = [dict(pad_to or {})] if pad_to is None or isinstance(pad_to, Mapping) else [dict(b) for b in pad_to]
    if not buckets:
        raise ValueError("collate: pad_to is an empty list of buckets")
    unknown = sorted({axis for bucket in buckets for axis in bucket} - set(_PAD_MASKS))
    if unknown:
        raise ValueError(f"collate: pad_to names unknown axes {unknown}, expected some of {sorted(_PAD_MASKS)}")
    # load-time arrays where every sample has them (a hand-built sample may not)
    specs = FEATURES + tuple(spec for spec in LOAD_TIME_FEATURES if all(spec.name in sample for sample in samples))
    largest = _largest_along_axes(samples, specs)
    pad_sizes = next(
        (bucket for bucket in buckets if all(largest[axis][0] <= size for axis, size in bucket.items())), None
    )
    if pad_sizes is None:  # name what overflows the largest bucket
        axis, size = next((axis, size) for axis, size in buckets[-1].items() if largest[axis][0] > size)
        count, name, target = largest[axis]
        raise ValueError(f"collate: {target} has {count} along {axis!r} ({name}), more than the fixed size {size}")
    max_sizes = {axis: max(count, pad_sizes.get(axis, 0)) for axis, (count, _, _) in largest.items()}
    batch: dict = {}
    for spec in specs:
        pad_axes = [(dim, max_sizes[axis]) for dim, axis in enumerate(spec.axes) if isinstance(axis, str)]
        value = _PAD_VALUES.get(spec.name, 0)
        batch[spec.name] = torch.stack([_pad_to(sample[spec.name], pad_axes, value) for sample in samples])
    for axis, (mask_name, probe) in _PAD_MASKS.items():
        dim = FEATURES_BY_NAME[probe].axes.index(axis)
        mask = torch.zeros(len(samples), max_sizes[axis], dtype=torch.bool)
        for row, sample in enumerate(samples):
            mask[row, : sample[probe].shape[dim]] = True
        batch[mask_name] = mask
    batch["id"] = [sample["id"] for sample in samples]
    batch["resolution"] = torch.stack(
        [torch.as_tensor(sample.get("resolution", math.nan), dtype=torch.float32) for sample in samples]
    )
    return batch
