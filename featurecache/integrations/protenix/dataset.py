"""The cache as Protenix's data source: a map-style dataset whose items are Protenix 2.0's
training examples, so a Protenix user keeps its trainer (runner/train.py) and reads
featurecache's records instead of parsing mmCIF files and searching alignments per step.

    from protenix.utils.torch_utils import collate_fn_first
    from featurecache.integrations.protenix import ProtenixDataset
    from featurecache.sampler import WeightedSampler

    dataset = ProtenixDataset("cache/", crop_size=384)
    loader = DataLoader(dataset, collate_fn=collate_fn_first,
                        batch_sampler=WeightedSampler(dataset.sampling_table, rank=rank, world_size=world_size))

Each item is cut by featurecache's loader (CacheDataset: the crop, the MSA rows, the templates
and the conformer augmentation of SampleConfig, every record CRC-checked) and then laid out as
Protenix's pipeline lays out its own (features.protenix_example). Protenix trains one example per
GPU (batch size 1, its collate_fn_first), so nothing is padded.
"""

from __future__ import annotations

import pathlib

import torch

from featurecache.config import SampleConfig
from featurecache.integrations.protenix.features import TEMPLATE_ROWS, protenix_example
from featurecache.loader import CacheDataset
from featurecache.sampler import SamplingTable


class ProtenixDataset(torch.utils.data.Dataset):
    """Protenix's {"input_feature_dict", "label_dict", "label_full_dict", "basic"} per item, from
    the feature records of a cache (or a published generation).

    `sample` and the keyword sample settings are CacheDataset's (crop_size, msa_rows_per_sample,
    max_templates, seed, ...), as are min_tokens, max_tokens, ids, on_error and follow_latest.
    Unless they are given, one MSA row set is drawn per sample (msa_cycle_draws=1): Protenix's
    MSA module draws its own rows from the example each step. An item is an index, an (epoch,
    index) pair or a featurecache WeightedSampler Draw, as for CacheDataset.
    `is_distillation` marks every example as Protenix marks distillation data (resolution -1).
    """

    def __init__(
        self,
        cache_dir: str | pathlib.Path,
        sample: SampleConfig | None = None,
        *,
        is_distillation: bool = False,
        **cache_settings,
    ):
        if sample is None:
            cache_settings.setdefault("msa_cycle_draws", 1)
        self.cache = CacheDataset(cache_dir, sample, **cache_settings)
        max_templates = self.cache.sample.max_templates
        if max_templates is None or max_templates > TEMPLATE_ROWS:
            raise ValueError(
                f"ProtenixDataset: max_templates={max_templates}, Protenix's template features hold "
                f"{TEMPLATE_ROWS} rows: give max_templates between 0 and {TEMPLATE_ROWS}"
            )
        self.is_distillation = is_distillation

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def ids(self) -> list[str]:
        return self.cache.ids

    @property
    def sampling_table(self) -> SamplingTable:
        """Every chain and interface with its AF3 weight, for featurecache's WeightedSampler (AF3's
        chain and interface draws, seeded, one split over ranks, resumable), whose draws this reads."""
        return self.cache.sampling_table

    def set_epoch(self, epoch: int) -> None:
        """New crops for a new epoch (CacheDataset.set_epoch)."""
        self.cache.set_epoch(epoch)

    def __getitem__(self, item) -> dict:
        sample = self.cache[item]
        if not sample["atom_mask"].any():  # Protenix's losses align to the ground truth: NaN without one
            raise ValueError(
                f"{sample['id']}: no resolved atom in this sample (a sequence-only input?); "
                "Protenix's training losses need ground-truth coordinates: leave it out (ids=...)"
            )
        # the whole record again (one LMDB read): Protenix's full-complex labels cover the chains
        # the crop left out, and its molecule ids are numbered over the whole target
        record, meta = self.cache.load_arrays(sample["id"])
        return protenix_example(sample, record, chain_ids=meta.get("chain_ids"), is_distillation=self.is_distillation)
