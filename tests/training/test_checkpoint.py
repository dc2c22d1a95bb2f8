"""save_checkpoint: the store's durable atomic write (temporary file, fsync, rename, folder fsync)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from featurecache.training.checkpoint import (
    checkpoint_path,
    load_checkpoint,
    rng_state,
    save_checkpoint,
)


def _state(step: int) -> dict:
    return {
        "model": {"weight": torch.full((64, 64), float(step))},
        "optimizer": {},
        "scheduler": {},
        "step": step,
        "epoch": 0,
        "rng": [rng_state()],
        "world_size": 1,
        "sample_in_epoch": 0,
    }


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated while the checkpoint is being written)")


def test_a_checkpoint_round_trips_and_leaves_only_itself(tmp_path):
    path = checkpoint_path(tmp_path, 10)
    save_checkpoint(path, _state(10))
    loaded = load_checkpoint(tmp_path)
    assert loaded["step"] == 10 and torch.equal(loaded["model"]["weight"], torch.full((64, 64), 10.0))
    assert os.listdir(tmp_path) == [path.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_failed_save_keeps_the_old_checkpoint_and_leaves_no_partial_file(tmp_path):
    path = checkpoint_path(tmp_path, 10)
    save_checkpoint(path, _state(10))
    broken = {**_state(20), "extra": [torch.ones(1 << 20), _FailsToPickle()]}
    with pytest.raises(RuntimeError, match="simulated"):
        save_checkpoint(path, broken)
    assert os.listdir(tmp_path) == [path.name]
    assert load_checkpoint(path)["step"] == 10


def test_the_file_and_the_folder_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    """A rename is durable only once its folder is fsynced: without that a crash after save can
    lose the new checkpoint's name even though its bytes were on disk."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(source, target):
        events.append("rename")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(checkpoint_path(tmp_path, 1), _state(1))
    assert events == ["fsync file", "rename", "fsync folder"]
