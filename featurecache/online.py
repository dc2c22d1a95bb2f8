"""OnlineDataset: features built from the raw files every time a sample is read.

What training pays per example without a cache (parse the mmCIF, parse its alignments,
featurize), followed by CacheDataset's crop and MSA subsampling, so that the two feed the model
identical samples. `featurecache train --online DIR` uses it to measure what caching saves.
"""

from __future__ import annotations

import os
import pathlib

import torch

from featurecache.config import FeatureConfig, SampleConfig
from featurecache.features.featurize import featurize_from_files
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.inputs import InputError, discover_inputs, target_id_for
from featurecache.loader import crop_sample, sample_config


class OnlineDataset(torch.utils.data.Dataset):
    """Map-style dataset over the mmCIF files of `inputs_dir`, featurized at each read with
    FeatureConfig's defaults (as precompute without a config) and cut as `sample` says; the
    sample settings may also be given as keywords, as for CacheDataset.

    Bad folders raise ValueError naming the folder and what is wrong with it.
    """

    def __init__(
        self,
        inputs_dir: str | os.PathLike,
        alignments_dir: str | os.PathLike | None = None,
        template_dir: str | os.PathLike | None = None,
        sample: SampleConfig | None = None,
        **sample_settings,
    ) -> None:
        self.sample = sample_config(sample, sample_settings, "OnlineDataset")
        inputs_dir = pathlib.Path(inputs_dir)
        for role, folder in (("inputs", inputs_dir), ("alignments", alignments_dir), ("templates", template_dir)):
            if folder is not None and not pathlib.Path(folder).is_dir():
                raise ValueError(f"{role} folder {folder} does not exist or is not a folder")
        try:
            found = discover_inputs([inputs_dir])
        except InputError as error:
            raise ValueError(f"inputs folder {inputs_dir}: {error}") from error
        # featurize_from_files reads mmCIF; FASTA inputs carry no structure to train on
        self.paths = [path for path in found if ".cif" in path.name.lower()]
        if not self.paths:
            raise ValueError(f"inputs folder {inputs_dir} has no mmCIF files")
        self.ids = [target_id_for(path) for path in self.paths]
        self.alignments_dir = alignments_dir
        self.template_dir = template_dir
        self.feature_config = FeatureConfig()
        self.epoch = 0
        self._alignments: AlignmentIndex | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_alignments"] = None  # each worker indexes the alignment folder itself
        return state

    @property
    def max_templates(self) -> int:
        """Template rows a sample holds at most: the sample's max_templates, capped by what
        featurization stores per chain."""
        stored = self.feature_config.max_templates_stored
        return stored if self.sample.max_templates is None else min(self.sample.max_templates, stored)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        """One sample; `item` is an index (crops of the current epoch) or an (epoch, index) pair."""
        if self._alignments is None and self.alignments_dir is not None:
            self._alignments = AlignmentIndex(self.alignments_dir)
        epoch, index = item if isinstance(item, tuple) else (self.epoch, item)
        arrays, meta = featurize_from_files(self.paths[index], self._alignments, self.feature_config, self.template_dir)
        return crop_sample(self.ids[index], arrays, self.sample, epoch, index, resolution=meta.get("resolution"))
