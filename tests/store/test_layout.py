"""Shard layout: which shard a key lives in, and the checks on tables, keys and index entries."""

import numpy as np
import pytest

from featurecache.config import StoreConfig
from featurecache.store.layout import shard_of
from featurecache.store.writer import StoreWriter


def test_shard_of_is_stable_and_spreads_keys():
    # Pinned values: a change here would orphan every record of every existing cache.
    assert [shard_of(key, 7) for key in ("7a4d", "721p", "209d", "seq:ACDE")] == [2, 2, 0, 1]
    assert [shard_of(key, 1000) for key in ("7a4d", "721p")] == [833, 624]
    assert shard_of("7a4d", 1) == 0
    counts = np.bincount([shard_of(f"target-{i}", 4) for i in range(4000)], minlength=4)
    assert counts.min() > 850, counts


def test_bad_keys_tables_and_index_entries_are_refused(tmp_path):
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        with pytest.raises(ValueError, match="unknown table 'feature'"):
            writer.put("feature", "k", b"x")
        with pytest.raises(ValueError, match="non-empty str"):
            writer.put("features", "", b"x")
        with pytest.raises(ValueError, match="LMDB keys are at most 511"):
            writer.put("features", "k" * 600, b"x")
        with pytest.raises(ValueError, match="features/k: index entry .* is not plain JSON"):
            writer.put("features", "k", b"x", index={"num_tokens": float("nan")})
        with pytest.raises(ValueError, match="'shard' is reserved"):
            writer.put("features", "k", b"x", index={"shard": 3})
