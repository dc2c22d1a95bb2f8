"""A checkpoint resumes under other runtime settings (kernels, recomputation): they are not weights."""

import dataclasses

from featurecache.model import preset
from featurecache.model.config import RUNTIME_SETTINGS
from featurecache.training.loop import model_differences


def test_runtime_settings_are_not_model_differences():
    config = preset("tiny")
    saved = dataclasses.asdict(config.replace(checkpoint_group=7, checkpoint_blocks=False))
    assert set(RUNTIME_SETTINGS) <= set(saved["runtime"])
    assert "other weights" in model_differences({"model_config": saved}, config)


def test_a_real_difference_is_named():
    config = preset("tiny")
    saved = dataclasses.asdict(config.replace(c_z=config.trunk.c_z * 2, checkpoint_group=3))
    message = model_differences({"model_config": saved}, config)
    assert "c_z" in message and "checkpoint_group" not in message
